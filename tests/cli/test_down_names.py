"""`edgebed down` removes only its own: names read back are checked against edgebed's own shapes,
the state dir is this user's alone, and another owner's run needs --all."""
import os
import secrets
import signal
import stat
import subprocess

import pytest
from typer.testing import CliRunner

from testbed.kernel import cgroups, names
from testbed.runtimes import state

from helpers import needs_root

DEAD_PID = 2 ** 22 - 3  # above any pid this machine hands out (pid_max 2**22 at most)


def _cli(*args):
    from testbed.cli import app

    return CliRunner().invoke(app, list(args))


# -- the shapes, both ways ------------------------------------------------------------------------
BAD_NAMES = ["..", "../x", "/etc", "", "abcde", "abcdefa", "ABCDEF", "abc/ef", "abcdef\n", "./abcd", None, 123456]


@pytest.mark.parametrize("bad", BAD_NAMES)
def test_a_run_id_of_another_shape_is_refused(bad):
    assert names.shaped("run id", bad) is None


def test_every_name_edgebed_makes_has_its_shape():
    from testbed.plan import parse_scenario
    from testbed.runtimes.control.network import control_netns
    from testbed.runtimes.fabric import router_netns, switch_netns
    from testbed.runtimes.netns.runtime import netns_name

    sc = parse_scenario({"workers": [{"count": 1016, "name": "grp123"}, {"count": 2}],  # 4-digit names, 1,022 nodes
                         "streaming": {"broker": {"kind": "tansu"}}})
    sites = parse_scenario({"sites": {"a": {}, "site1234": {}}}).sites  # the longest a site's name may be
    for _ in range(20):
        rid = secrets.token_hex(3)
        assert names.shaped("run id", rid)
        made = [netns_name(rid, n) for n in sc.node_names()] + [control_netns(rid), switch_netns(rid)]
        made += [f(rid, s) for s in sites for f in (switch_netns, router_netns)]
        assert all(names.of_run("netns", n, rid) for n in made), [n for n in made if not names.of_run("netns", n, rid)]
        ends = [state.temp_link_name(rid, i, e) for i in (0, 1, 0x3ff, 0xfff) for e in "xy"]
        assert all(names.of_run("veth", n, rid) and len(n) <= 15 for n in ends)
        assert not names.of_run("netns", netns_name(rid, "w0"), "ffffff" if rid != "ffffff" else "000000")


@pytest.mark.parametrize("bad", ["../../etc/x", "eb-abcdef-../x", "eb-abcdef-", "eb-abcdef-W0", "eb-lab-u",
                                 "eb-abcdef-w0/x", "eb-abcdef-w0\n", "/run/netns/eb-abcdef-w0", "eb-abcdef-sw-",
                                 "eb-abcdef-w0 ", "ebcanary", None])
def test_a_netns_of_another_shape_is_refused(bad):
    assert names.shaped("netns", bad) is None and not names.of_run("netns", bad, "abcdef")


def test_owner_runner_and_pid_shapes():
    assert names.shaped("owner", "0@host") and names.shaped("owner", "1000@edge-3.lab.example")
    for bad in ["root@host", "0@", "@host", "0@host;rm -rf", "0@../x", "0@host\n", "0@-host"]:
        assert names.shaped("owner", bad) is None, bad
    assert names.shaped("runner", "1234:5678")["pid"] == "1234"
    for bad in ["0:1", "-1:5", "1234", "1234:x", "1234:5678:9", " 1:2"]:
        assert names.shaped("runner", bad) is None, bad
    assert names.checked_pid(4242, "t") == 4242
    for bad in [0, -1, True, "12", 2 ** 23, 1.5]:  # 0 and -1 would signal a group or everyone
        assert names.checked_pid(bad, "t") is None


def test_a_skipped_name_is_one_escaped_line(capsys):
    assert names.checked("run id", "../\x1b[2Jx" + "y" * 80, "container eb-x") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "skipped run id '../\\x1b[2J" in err
    assert "from container eb-x" in err and len(err) < 200


# -- state files and labels -----------------------------------------------------------------------
@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A machine of this test's own: its state dir, /run/netns and cgroups (no real run is seen)."""
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "netns").mkdir()
    monkeypatch.setattr(state, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(state, "NETNS_DIR", tmp_path / "netns")
    monkeypatch.setattr(state.cgroups, "list_runs", lambda: set())
    monkeypatch.setattr(state, "SWEEPERS", {})
    monkeypatch.setattr("testbed.runtimes.load_backends", lambda: None)
    return tmp_path


def _plant(d, stem, **data):
    import json

    (d / f"{stem}.json").write_text(json.dumps(data))


def test_planted_state_files_are_read_only_in_edgebed_shapes(machine, capsys):
    d = machine / "state"
    base = {"runner_pid": DEAD_PID, "run_dir": "/x", "scenario": "s"}
    _plant(d, "x", run_id="x", **base)  # not a run id's file name
    _plant(d, "aaaaaa", run_id="../aaaaaa", **base)  # another run id than its name
    _plant(d, "bbbbbb", run_id="bbbbbb", **{**base, "runner_pid": -1})  # kill(-1) is everyone
    _plant(d, "cccccc", run_id="cccccc", netns=["../../etc/x", "eb-cccccc-w0", "eb-dddddd-w0", "/etc/passwd",
                                                "eb-cccccc-sw-a", "ebcanary"], **base)
    (machine / "netns" / "eb-cccccc-W0").touch()  # claims run cccccc, not of its shape
    (machine / "netns" / "eb-eeeeee-..").touch()
    runs = state.known_runs()
    assert set(runs) == {"aaaaaa", "bbbbbb", "cccccc"}  # the first two without a state to trust
    assert runs["aaaaaa"] is None and runs["bbbbbb"] is None
    assert runs["cccccc"].netns == ["eb-cccccc-w0", "eb-cccccc-sw-a"]
    assert state.netns_of_run("cccccc") == []
    err = capsys.readouterr().err
    for skipped in ["'x'", "'../../etc/x'", "'eb-dddddd-w0'", "'/etc/passwd'", "'ebcanary'", "'eb-cccccc-W0'",
                    "'eb-eeeeee-..'", "pid -1"]:
        assert skipped in err, skipped


def test_cleanup_refuses_a_run_id_of_another_shape(machine):
    for bad in ["..", "../x", "/etc", "edgebed"]:
        assert "nothing removed" in state.cleanup_run(bad)[0]
        assert "nothing removed" in cgroups.remove_run(bad)[0]


def test_the_labels_say_whose_run_and_which_runner(machine):
    st = state.RunState(run_id="abcdef", runner_pid=os.getpid(), run_dir="/x", scenario="s")
    labels = state.run_labels(st)
    assert labels[state.OWNER_LABEL] == f"{os.geteuid()}@{os.uname().nodename}"
    engine = state.EngineRun.of(labels, "container c")
    assert engine.owner == state.this_owner() and engine.runner_pid == os.getpid() and engine.runner_alive()
    assert state.foreign_owner(engine) is None
    elsewhere = state.EngineRun.of({**labels, state.OWNER_LABEL: f"{os.geteuid()}@elsewhere"}, "service s")
    assert state.foreign_owner(elsewhere) == f"{os.geteuid()}@elsewhere"
    assert not elsewhere.runner_alive()  # a pid on another host is never looked for here
    forged = state.EngineRun.of({**labels, state.OWNER_LABEL: "0@x;y", state.RUNNER_LABEL: "-1:0"}, "c")
    assert forged == state.EngineRun(None, None, None)


def test_a_swarm_run_started_on_another_host_is_not_dead_here(machine, monkeypatch):
    """A service with no local state file whose labels put its runner on another host is that
    host's live run, not this one's remains; a service labelled with a crafted id is skipped."""
    from types import SimpleNamespace

    from testbed.runtimes.swarm import runtime as swarm

    def service(name, labels):
        return SimpleNamespace(name=name, attrs={"Spec": {"Labels": labels}})

    other = f"{os.geteuid()}@elsewhere"
    fake = SimpleNamespace(
        services=SimpleNamespace(list=lambda filters: [
            service("eb-abc123-ps", {state.LABEL: "1", state.RUN_LABEL: "abc123", state.OWNER_LABEL: other,
                                     state.RUNNER_LABEL: f"{os.getpid()}:1"}),
            service("eb-x-ps", {state.LABEL: "1", state.RUN_LABEL: "../../x"})]),
        secrets=SimpleNamespace(list=lambda filters: []),
        networks=SimpleNamespace(list=lambda filters: [SimpleNamespace(
            name="eb-abc123", attrs={"Driver": "overlay", "Labels": {state.LABEL: "1", state.RUN_LABEL: "abc123"}})]))
    monkeypatch.setitem(state.SWEEPERS, "swarm", state.Sweeper("swarm", lambda: swarm.swarm_labels(fake), lambda r: []))
    labelled = state.labelled_runs()
    assert set(labelled) == {"abc123"} and state.foreign_owner(labelled["abc123"]) == other
    assert not labelled["abc123"].runner_alive()  # the pid is this process's, but on this host, not that one
    out = _cli("down")
    assert f"run abc123 belongs to {other}; use --all" in out.stdout and "abc123: removed" not in out.stdout


class Sleeper:
    def __init__(self, *prefix):
        self.proc = subprocess.Popen([*prefix, "sleep", "300"], start_new_session=True)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def sleeper():
    s = Sleeper()
    yield s
    s.stop()


def _fake_engine(monkeypatch, labelled: dict[str, dict]):
    removed = []
    found = [(f"container eb-{rid}", {state.LABEL: "1", state.RUN_LABEL: rid, **extra})
             for rid, extra in labelled.items()]
    monkeypatch.setitem(state.SWEEPERS, "fake",
                        state.Sweeper("fake", lambda: found, lambda rid: removed.append(rid) or []))
    return removed


@needs_root
def test_a_bare_down_removes_only_this_users_runs_whose_runner_is_gone(machine, monkeypatch, sleeper):
    me = state.this_owner()
    removed = _fake_engine(monkeypatch, {
        "aaaaaa": {state.OWNER_LABEL: "1000@elsewhere", state.RUNNER_LABEL: "1:1"},  # its runner on another host
        "bbbbbb": {state.OWNER_LABEL: me, state.RUNNER_LABEL: f"{sleeper.pid}:{state.process_start(sleeper.pid)}"},
        "cccccc": {state.OWNER_LABEL: me, state.RUNNER_LABEL: f"{DEAD_PID}:1"},
        "dddddd": {},  # no owner: an older edgebed's, or a hand's
        "..": {state.OWNER_LABEL: me}, "../x": {state.OWNER_LABEL: me}, "/etc": {state.OWNER_LABEL: me},
    })
    out = _cli("down")
    assert out.exit_code == 0, out.output
    assert "run aaaaaa belongs to 1000@elsewhere; use --all" in out.output
    assert f"bbbbbb: still running (runner pid {sleeper.pid})" in out.output
    assert "dddddd: no state file here and no owner label says whose" in out.output
    assert "cccccc: removed" in out.output and removed == ["cccccc"]
    assert out.output.count("skipped run id") == 3
    assert _cli("down", "aaaaaa").stdout.splitlines() == ["run aaaaaa belongs to 1000@elsewhere; use --all",
                                                          "nothing to remove"]
    assert removed == ["cccccc"] and sleeper.alive()
    out = _cli("down", "--all")
    assert "run aaaaaa belongs to 1000@elsewhere; removing it (--all)" in out.output
    assert sorted(removed) == ["aaaaaa", "bbbbbb", "cccccc", "cccccc", "dddddd"]
    assert sleeper.alive()  # a pid read from a label is never signalled


# -- the state dir ---------------------------------------------------------------------------------
@pytest.fixture
def state_dir_at(monkeypatch):
    def place(path):
        monkeypatch.setattr(state, "STATE_DIR", path)
        monkeypatch.setattr(state, "SWEEPERS", {})
        monkeypatch.setattr("testbed.runtimes.load_backends", lambda: None)
        return path
    return place


def _refused_in_one_line(path, why):
    out = _cli("down")
    assert out.exit_code == 2 and out.output.count("\n") == 1, out.output
    assert out.output.startswith(f"error: state dir {path} {why}"), out.output
    with pytest.raises(state.StateDirError):
        state.RunState(run_id="abcdef", runner_pid=os.getpid(), run_dir="/x", scenario="s").save()


def test_a_world_writable_state_dir_is_refused(tmp_path, state_dir_at):
    d = state_dir_at(tmp_path / "state")
    d.mkdir()
    d.chmod(0o777)
    _refused_in_one_line(d, "is writable by others (mode 777)")


def test_a_symlinked_state_dir_is_refused(tmp_path, state_dir_at):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    d = state_dir_at(tmp_path / "state")
    d.symlink_to(tmp_path / "elsewhere")
    _refused_in_one_line(d, "is a symbolic link")
    assert list((tmp_path / "elsewhere").iterdir()) == []


@needs_root
def test_a_state_dir_of_another_user_is_refused(tmp_path, state_dir_at):
    d = state_dir_at(tmp_path / "state")
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)  # nobody
    _refused_in_one_line(d, f"is owned by uid 65534, not by this user (uid {os.geteuid()})")


def test_a_users_tmp_parent_planted_by_another_is_refused(tmp_path, state_dir_at):
    parent = tmp_path / f"edgebed-{os.geteuid()}"  # as /tmp/edgebed-<uid> without XDG_RUNTIME_DIR
    parent.mkdir()
    parent.chmod(0o775)
    state_dir_at(parent / "edgebed")
    _refused_in_one_line(parent, "is writable by its group (mode 775)")
    assert not (parent / "edgebed").exists()


def test_the_state_dir_and_its_parents_are_made_private(tmp_path, state_dir_at):
    old = os.umask(0o022)
    try:
        d = state_dir_at(tmp_path / f"edgebed-{os.geteuid()}" / "deeper" / "edgebed")
        state.RunState(run_id="abcdef", runner_pid=os.getpid(), run_dir="/x", scenario="s").save()
    finally:
        os.umask(old)
    for p in (d, d.parent, d.parent.parent):
        assert stat.S_IMODE(os.lstat(p).st_mode) == 0o700, p
    assert (d / "abcdef.json").exists()


def test_a_user_without_root_refuses_roots_dir(tmp_path, state_dir_at, monkeypatch):
    d = state_dir_at(tmp_path / "state")
    d.mkdir(mode=0o700)
    monkeypatch.setattr(state.os, "geteuid", lambda: os.stat(d).st_uid + 1000)
    with pytest.raises(state.StateDirError, match="is owned by uid"):
        state.ensure_state_dir()


# -- on a real engine: crafted labels, canaries in a cgroup and a namespace of other names ---------
def _engine_or_skip():
    from testbed.runtimes.engine.client import docker_client

    if os.geteuid() != 0:
        pytest.skip("needs root: namespaces and bind mounts")
    client = docker_client(timeout=3)
    if client is None:
        pytest.skip("no Docker engine answers (CI starts dockerd)")
    return client


def _empty_image(client) -> str:
    """An image of one empty file: its containers are only created, never started."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(tarfile.TarInfo("empty"), io.BytesIO(b""))
    client.api.import_image_from_data(buf.getvalue(), repository="edgebed-test-names", tag="1")
    return "edgebed-test-names:1"


class World:
    """Canaries of other names a crafted id could reach: processes in a cgroup folder outside
    edgebed's run folders and in one of another name inside it (a cgroup tree of the test's own:
    on the real one a `..` that slipped through would kill every process of the machine), a real
    network namespace under another name and under a run's prefix in a wrong shape, a file a
    planted netns name points at, and containers and a network labelled with crafted run ids."""

    def __init__(self, tmp_path, client):
        self.tmp, self.client, self.token = tmp_path, client, secrets.token_hex(4)
        self.ns = f"ebcanary{self.token}"
        self.binds: list = []
        self.cg_sleeper = Sleeper()
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        self.ns_sleeper = Sleeper("ip", "netns", "exec", self.ns)
        self.canary_file = tmp_path / "canary"
        self.canary_file.write_text("still here")

    def cgroup_tree(self):
        root = self.tmp / "cgroup"
        (root / "edgebed" / "W0-canary").mkdir(parents=True)
        (root / "ebcanary").mkdir()
        (root / "cgroup.controllers").write_text("cpu memory\n")  # a v2 root to kill_and_remove
        for d in (root / "ebcanary", root / "edgebed" / "W0-canary"):
            (d / "cgroup.procs").write_text(f"{self.cg_sleeper.pid}\n")
        return root

    def netns_dir(self, good: str):
        d = self.tmp / "netns"
        d.mkdir()
        for name in (self.ns, f"eb-{good}-W0"):
            (d / name).touch()
            subprocess.run(["mount", "--bind", f"/run/netns/{self.ns}", str(d / name)], check=True)
            self.binds.append(d / name)
        return d

    def labelled(self, image, rid, **extra):
        labels = {state.LABEL: "1", state.RUN_LABEL: rid, "edgebed.test": self.token, **extra}
        return self.client.containers.create(image, command=["/none"], labels=labels)

    def mine(self, found):
        return [(what, labels) for what, labels in found if labels.get("edgebed.test") == self.token]

    def close(self):
        for c in self.client.containers.list(all=True, filters={"label": f"edgebed.test={self.token}"}):
            c.remove(force=True)
        for n in self.client.networks.list(filters={"label": f"edgebed.test={self.token}"}):
            n.remove()
        for b in self.binds:
            subprocess.run(["umount", str(b)], check=False)
        self.cg_sleeper.stop()
        self.ns_sleeper.stop()
        subprocess.run(["ip", "netns", "del", self.ns], check=False)


@pytest.fixture
def world(tmp_path):
    client = _engine_or_skip()
    w = World(tmp_path, client)
    yield w
    w.close()
    try:
        client.images.remove("edgebed-test-names:1")
    except Exception:
        pass


def test_down_touches_nothing_outside_edgebeds_names(world, monkeypatch):
    from testbed.runtimes.docker import runtime as docker_rt

    assert not any(names.shaped("run id", b) for b in ("..", "../ebcanary", "/etc"))  # else: stop before harm
    image = _empty_image(world.client)
    good, foreign = secrets.token_hex(3), secrets.token_hex(3)
    me = state.this_owner()
    for crafted in ("..", "../ebcanary", "/etc"):
        world.labelled(image, crafted, **{state.OWNER_LABEL: me, state.RUNNER_LABEL: f"{DEAD_PID}:1"})
    world.client.networks.create(f"eb-test-{world.token}", internal=True,
                                 labels={state.LABEL: "1", state.RUN_LABEL: "../x", "edgebed.test": world.token})
    world.labelled(image, good, **{state.OWNER_LABEL: me, state.RUNNER_LABEL: f"{DEAD_PID}:1"})
    world.labelled(image, foreign, **{state.OWNER_LABEL: "1000@elsewhere.example", state.RUNNER_LABEL: "4242:1"})
    # the run's state file, planted: a netns name that is a path to a file, one of another name, one
    # of the run's prefix in another shape; and a state file whose run id is a cgroup path
    monkeypatch.setattr(state, "STATE_DIR", world.tmp / "state")
    state.RunState(run_id=good, runner_pid=DEAD_PID, run_dir=str(world.tmp), scenario="s", runtime="docker",
                   runner_start=1,
                   netns=[os.path.relpath(world.canary_file, "/run/netns"), world.ns, f"eb-{good}-W0",
                          f"eb-{good}-w0"]).save()
    (world.tmp / "state" / "run.json").write_text(f'{{"run_id": "../ebcanary", "runner_pid": {DEAD_PID}}}')
    monkeypatch.setattr(state, "NETNS_DIR", world.netns_dir(good))
    monkeypatch.setattr(cgroups, "ROOT", world.cgroup_tree())
    removed = []
    engine = docker_rt.remove_docker_resources
    monkeypatch.setattr(state, "SWEEPERS", {"docker": state.Sweeper(
        "docker", lambda: world.mine(docker_rt.docker_labels()), lambda rid: removed.append(rid) or engine(rid))})
    monkeypatch.setattr("testbed.runtimes.load_backends", lambda: None)

    out = _cli("down")
    assert out.exit_code == 0, out.output
    assert f"{good}: removed" in out.output and removed == [good]
    assert f"run {foreign} belongs to 1000@elsewhere.example; use --all" in out.output
    for crafted in ("'..'", "'../ebcanary'", "'/etc'", "'../x'", "'run'", f"'{world.ns}'", f"'eb-{good}-W0'",
                    "'W0-canary'", "'../../"):
        assert f"{crafted}" in out.output, crafted
    assert world.cg_sleeper.alive() and world.ns_sleeper.alive()
    assert world.canary_file.read_text() == "still here"
    assert os.path.exists(f"/run/netns/{world.ns}") and all(os.path.ismount(b) for b in world.binds)
    assert (world.tmp / "cgroup" / "ebcanary" / "cgroup.procs").exists()
    left = {c.labels[state.RUN_LABEL] for c in world.client.containers.list(
        all=True, filters={"label": f"edgebed.test={world.token}"})}
    assert left == {"..", "../ebcanary", "/etc", foreign}  # crafted ones untouched, the foreign one left
    assert world.client.networks.list(filters={"label": f"edgebed.test={world.token}"})
