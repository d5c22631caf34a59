"""Build the docker runtime's node image, offline or from a registry base (see images/README.md)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Optional

from testbed.errors import HostCannot
from testbed.runtimes.engine.wheel_lock import LockError, check_wheelhouse, file_sha256, read_lock

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "images" / "node" / "Dockerfile"
# Every wheel the image installs, by version and sha256 (images/node/pin_wheels.py writes them).
LOCK_DEPS = REPO / "images" / "node" / "requirements.txt"
LOCK_NODEPS = REPO / "images" / "node" / "requirements-nodeps.txt"
# debootstrap checks the mirror's Release signature against it (package debian-archive-keyring).
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
BASE_OFFLINE = "edgebed/base:bookworm"
BASE_REGISTRY = "python:3.11-slim"
NODE_REPO = "edgebed/node"


def _cache_dir() -> Path:
    """Root's build material in /var/cache/edgebed; a user's (a swarm runner needs no root) in
    their own cache."""
    if os.environ.get("EDGEBED_CACHE"):
        return Path(os.environ["EDGEBED_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/edgebed")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgebed"


CACHE = _cache_dir()
LABELS = {"edgebed": "1"}
KEYRING_LABEL = "edgebed.keyring"  # on the offline base: debootstrap checked it against this keyring


class ImageError(HostCannot):
    pass


def host_debian_mirror(suite: str = "bookworm") -> str:
    """The Debian mirror this host's apt uses (deb822 .sources or legacy .list)."""
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*"))
    for f in files:
        if not f.is_file() or f.name.endswith((".disabled", ".save")) or "disabled" in f.name:
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.+)$", stanza, re.M))
                if suite in fields.get("Suites", "").split() and "main" in fields.get("Components", "").split():
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 4 and parts[0] == "deb" and parts[2] == suite and "main" in parts[3:]:
                    return parts[1]
    raise ImageError(f"no Debian {suite} mirror in this host's apt sources; pass --mirror")


def _image_exists(client, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _checked_base_exists(client) -> bool:
    """The offline base, made by a debootstrap that checked signatures (a base without the label is made again)."""
    import docker

    try:
        return KEYRING_LABEL in (client.images.get(BASE_OFFLINE).labels or {})
    except docker.errors.ImageNotFound:
        return False


def _offline_base_lacks() -> Optional[str]:
    """What making the offline base needs and this host lacks (None: nothing)."""
    if shutil.which("debootstrap") is None:
        return "the offline base needs debootstrap (apt-get install debootstrap)"
    if not DEBIAN_KEYRING.is_file():
        return (f"the offline base needs Debian's archive keyring {DEBIAN_KEYRING} "
                "(apt-get install debian-archive-keyring)")
    return None


def debootstrap_command(root: Path, mirror: str) -> list[str]:
    """Release files checked against Debian's keyring; --force-check-gpg: no unchecked fallback."""
    return ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
            f"--keyring={DEBIAN_KEYRING}", "--force-check-gpg", "bookworm", str(root), mirror]


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "no message")[:300]


def ensure_offline_base(client, say: Callable[[str], None], mirror: Optional[str] = None) -> str:
    """debootstrap bookworm (minbase + python3) and `docker import` it, once."""
    if _checked_base_exists(client):
        return BASE_OFFLINE
    if _image_exists(client, BASE_OFFLINE):
        say("offline base: the one here was made without a signature check: making it again")
    lacks = _offline_base_lacks()
    if lacks is not None:
        raise ImageError(lacks)
    mirror = mirror or host_debian_mirror()
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        say("offline base: debootstrap bookworm from the host's Debian mirror (about a minute)")
        r = subprocess.run(debootstrap_command(root, mirror), capture_output=True, text=True)
        if r.returncode != 0:
            raise ImageError(f"debootstrap failed: {_last_line(r.stderr or r.stdout)}")
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar), "."], check=True)
        say("offline base: docker import")
        repo, tag = BASE_OFFLINE.split(":")
        keyring = f"LABEL {KEYRING_LABEL}={file_sha256(DEBIAN_KEYRING)[:16]}"
        client.api.import_image_from_file(str(tar), repository=repo, tag=tag,
                                          changes=['LABEL edgebed=1', keyring, 'CMD ["/bin/bash"]'])
    return BASE_OFFLINE


def _pip(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise ImageError(f"pip {args[0]} failed: {_pip_error(r.stderr)}")


def _pip_error(stderr: str) -> str:
    """pip's first error sentence, with the requirements its hash check names: one line."""
    lines = stderr.splitlines()
    first = next((line for line in lines if line.startswith("ERROR:")), _last_line(stderr))
    named = [m[1] for line in lines if (m := re.match(r" {4}(\S+==\S+)", line))]
    return first.removeprefix("ERROR: ").split(". ")[0][:200] + (f" ({', '.join(named)})" if named else "")


def prepare_context(ctx: Path, say: Callable[[str], None]) -> None:
    """Fill ctx/wheelhouse/deps (and deps/nodeps) with exactly the wheels their lock pins, the lock
    beside them, and ctx/wheelhouse/edgebed with edgebed's own wheel, for the image's Python (3.11)."""
    deps = ctx / "wheelhouse" / "deps"
    for folder, lock in ((deps, LOCK_DEPS), (deps / "nodeps", LOCK_NODEPS)):
        folder.mkdir(parents=True, exist_ok=True)
        where = folder.relative_to(ctx).as_posix()
        try:
            say(f"{where}: {len(read_lock(lock))} wheels, pinned by {lock.name}")
            # the lock names every wheel (--no-deps), and its hashes make pip pick the locked files
            _pip("download", "--python-version", "3.11", "--only-binary=:all:", "--no-deps", "-q",
                 "--dest", str(folder), "-r", str(lock))
            check_wheelhouse(folder, lock)
        except LockError as e:
            raise ImageError(f"{where}: {e}") from None
        shutil.copy2(lock, folder / "requirements.txt")
    own = ctx / "wheelhouse" / "edgebed"
    own.mkdir(parents=True, exist_ok=True)
    _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "--wheel-dir", str(own), str(REPO))
    built = sorted(f.name for f in own.iterdir())
    if len(built) != 1 or not built[0].startswith("edgebed-"):
        raise ImageError(f"wheelhouse/edgebed: {len(built)} files where edgebed's own wheel alone belongs")


def _wheel_content_digest(path: Path) -> str:
    """sha256 of a wheel's members (names, modes, bytes): the same files give the same digest
    whatever the zip's timestamps."""
    h = hashlib.sha256()
    with zipfile.ZipFile(path) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            h.update(f"{info.filename}\0{info.external_attr >> 16}\0".encode())
            h.update(hashlib.sha256(z.read(info)).digest())
    return h.hexdigest()


def _content_tag(ctx: Path, base: str) -> str:
    """The image's tag from everything it is made of: `base` (name@image id), then each file of
    the context (Dockerfile, locks, wheels) by path and sha256; edgebed's own wheel by its members."""
    own = ctx / "wheelhouse" / "edgebed"
    h = hashlib.sha256(base.encode() + b"\0")
    for f in sorted(p for p in ctx.rglob("*") if p.is_file()):
        digest = _wheel_content_digest(f) if f.parent == own else file_sha256(f)
        h.update(f"{f.relative_to(ctx).as_posix()}\0{digest}\0".encode())
    return f"{NODE_REPO}:{h.hexdigest()[:12]}"


def _base_reference(client, base: str) -> str:
    """`base@<image id>`: the tag follows the base's content, not only its name."""
    import docker

    try:
        image = client.images.get(base)
    except docker.errors.ImageNotFound:
        repository, tag = base.split(":")
        try:
            image = client.images.pull(repository, tag=tag)
        except docker.errors.APIError as e:
            raise ImageError(f"pulling the base {base} failed: {_last_line(str(e))}") from None
    return f"{base}@{image.id}"


def build_node_image(client, *, source: str = "auto", say: Callable[[str], None] = print,
                     mirror: Optional[str] = None) -> str:
    """Build (or reuse) the node image; returns its tag. source: auto | offline | registry."""
    if source == "auto":
        source = "registry" if _image_exists(client, BASE_REGISTRY) else "offline"
    if source == "offline":
        base = ensure_offline_base(client, say, mirror)
    elif source == "registry":
        base = BASE_REGISTRY
    else:
        raise ImageError(f"unknown image source '{source}' (auto, offline, registry)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="ctx-") as tmp:
        ctx = Path(tmp)
        prepare_context(ctx, say)
        shutil.copy2(DOCKERFILE, ctx / "Dockerfile")
        tag = _content_tag(ctx, _base_reference(client, base))
        if _image_exists(client, tag):
            say(f"image {tag} is up to date")
        else:
            say(f"building {tag} FROM {base} (network off during the build)")
            try:
                client.images.build(path=str(ctx), tag=tag, buildargs={"BASE": base}, network_mode="none",
                                    rm=True, forcerm=True, labels={**LABELS, "edgebed.source": source_hash()},
                                    pull=False)
            except Exception as e:
                raise ImageError(f"docker build failed: {e}") from None
    client.images.get(tag).tag(NODE_REPO, "latest")
    return tag


def source_hash() -> str:
    """Hash of edgebed's own files and the image's recipe (Dockerfile, locks), stamped on the
    image so a stale image is noticed."""
    h = hashlib.sha256()
    package = [f for f in (REPO / "testbed").rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    for f in sorted(package) + [REPO / "pyproject.toml", DOCKERFILE, LOCK_DEPS, LOCK_NODEPS]:
        h.update(f.relative_to(REPO).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def image_unavailable(client) -> Optional[str]:
    """Why the node image can be neither found nor built here now (None: it can)."""
    if _checked_base_exists(client) or any(_image_exists(client, t) for t in (f"{NODE_REPO}:latest", BASE_REGISTRY)):
        return None
    lacks = _offline_base_lacks()
    return None if lacks is None else f"no node image and no {BASE_REGISTRY} base; {lacks}"


def ensure_node_image(client, *, say: Callable[[str], None] = print, source: Optional[str] = None) -> str:
    """The node image for this code: reuse edgebed/node:latest if it carries this code, else build."""
    import docker

    try:
        img = client.images.get(f"{NODE_REPO}:latest")
        if (img.labels or {}).get("edgebed.source") == source_hash():
            return f"{NODE_REPO}:latest"
        say("the node image is older than this code: rebuilding it")
    except docker.errors.ImageNotFound:
        say("no node image yet: building it (once; `edgebed build` does it ahead of time)")
    return build_node_image(client, source=source or os.environ.get("EDGEBED_IMAGE_SOURCE", "auto"), say=say)


USER_LAYER = """FROM {base}
COPY wheels /wheels
RUN /opt/edgebed/bin/pip install --no-cache-dir --no-index --no-deps /wheels/*.whl && rm -rf /wheels
"""


def with_packages(client, base: str, packages: list[str], say: Callable[[str], None] = print) -> str:
    """The node image `base` with a user's packages (plugins) installed: built once per content,
    network off; their own dependencies must be in the image already (edgebed's)."""
    if not packages:
        return base
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="user-") as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        for pkg in packages:
            if pkg.endswith(".whl"):
                shutil.copy2(pkg, wheels)
            else:  # a copy: pip builds in the folder it is given
                src = Path(tmp) / "src" / Path(pkg).resolve().name
                shutil.copytree(pkg, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
                _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "--wheel-dir", str(wheels), str(src))
        h = hashlib.sha256(base.encode())
        for f in sorted(wheels.iterdir()):
            h.update(f.name.encode() + hashlib.sha256(f.read_bytes()).digest())
        tag = f"{NODE_REPO}:u-{h.hexdigest()[:12]}"
        if not _image_exists(client, tag):
            say(f"building {tag}: the node image with {', '.join(sorted(f.name for f in wheels.iterdir()))}")
            (Path(tmp) / "Dockerfile").write_text(USER_LAYER.format(base=base))
            try:
                client.images.build(path=tmp, tag=tag, network_mode="none", rm=True, forcerm=True, pull=False,
                                    labels={**LABELS, "edgebed.source": source_hash()})
            except Exception as e:
                raise ImageError(f"docker build of the user's packages failed: {e}") from None
    return tag


LOCAL_ENGINE = "unix:///var/run/docker.sock"


def swarm_tag() -> str:
    """The node image's tag on a swarm's hosts: this code's own, so no host runs a stale one."""
    return f"{NODE_REPO}:s-{source_hash()}"


def ensure_swarm_image(manager, *, say: Callable[[str], None] = print) -> str:
    """The node image for this code on the swarm manager's engine: there already, else copied
    from this machine's engine (built there if need be), else built on the manager."""
    import docker

    tag = swarm_tag()
    if _image_exists(manager, tag):
        return tag
    local = None
    try:
        # this machine's engine, whatever DOCKER_HOST says (from_env(environment={}) reads os.environ:
        # an empty mapping is falsy there)
        local = docker.DockerClient(base_url=LOCAL_ENGINE, timeout=60)
        if _engine_identity(local) == _engine_identity(manager):
            local = None
    except Exception:
        local = None
    if local is not None:
        src = ensure_node_image(local, say=say)
        say(f"copying the node image to the swarm manager's engine ({tag})")
        copy_image(local, manager, src)
        manager.images.get(src).tag(NODE_REPO, tag.split(":")[1])
    else:
        manager.images.get(ensure_node_image(manager, say=say)).tag(NODE_REPO, tag.split(":")[1])
    return tag


def _engine_identity(client) -> tuple:
    info = client.info()  # engines on one machine may share an ID (/etc/docker/key.json): not enough alone
    return info["ID"], info.get("Name"), info.get("DockerRootDir")


def copy_image(src, dst, tag: str) -> None:
    """`docker save TAG | docker -H DST load`, streamed from engine to engine."""
    dst.api.load_image(src.api.get_image(tag, chunk_size=1 << 20))


def distribute_image(manager, tag: str, hosts, say: Callable[[str], None] = print) -> None:
    """The node image onto every host of `hosts` that lacks it, through each host's engine (its
    swarm node label edgebed.engine). A host whose engine is unknown keeps what it has: if it
    lacks the image, its task is rejected and the runtime names the host."""
    manager_id = (manager.info().get("Swarm") or {}).get("NodeID")
    for host in sorted(hosts, key=lambda h: h.hostname):
        if host.id == manager_id:
            continue
        engine = host.engine_client(timeout=600)
        if engine is None or _image_exists(engine, tag):
            continue
        say(f"loading the node image onto {host.hostname}")
        copy_image(manager, engine, tag)
        if not _image_exists(engine, tag):
            raise ImageError(f"host {host.hostname}: the node image {tag} did not load")
