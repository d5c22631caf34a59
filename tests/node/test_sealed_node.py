"""A netns node's code as a hostile program would use it: it runs as its node's own unprivileged
uid, so the runner's forkserver, its neighbours' processes, the host's sysfs knobs, /run/netns
and the run dir are closed to it by the kernel's own checks (SECURITY.md, "What runs with which
powers"). Each probe here succeeded when a node kept uid 0 without capabilities."""

import json
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time

import pytest

from testbed.kernel.identity import run_block
from testbed.node import mailbox, reach

from helpers import needs_root, netns_cluster

pytestmark = [needs_root, pytest.mark.root]

@pytest.fixture
def cluster(tmp_path, clean_host):
    with netns_cluster(tmp_path, {
        "name": "sealed",
        "profiles": {"edge": {"cpus": 0.5, "memory": "512m", "uplink": "50mbit", "downlink": "50mbit"}},
        "ps": {"profile": "edge"},
        "workers": [{"count": 2, "profile": "edge"}],
    }) as c:
        yield c


def _sleeper(seconds, slot):
    mailbox.write_text(slot, str(os.getpid()))
    time.sleep(seconds)


def _probe(slot, forkserver, neighbour, runner, forkserver_pid, run_dir, netns_link):
    """reach.attempts (the knobs among its writes, a file made in the run dir), and the runner's
    interpreter and torch, under root's 0700 folders here, started as this uid. The pids are the
    host's: in its own PID namespace, the node cannot name them."""
    out = reach.attempts(read=[f"/proc/{neighbour}/mem"], write=[], signal=[neighbour, runner, forkserver_pid],
                         plant=[netns_link], connect=[forkserver], create=[os.path.join(run_dir, "planted")])
    out["python"] = subprocess.run([sys.executable, "-c", "import torch, testbed; print(torch.ones(2).sum().item())"],
                                   capture_output=True, text=True, timeout=120).stdout.strip()
    mailbox.write_text(slot, json.dumps(out))


def test_a_nodes_code_reaches_nothing_of_the_runner_or_its_neighbours(cluster, tmp_path):
    rt, spec = cluster
    run_dir = tmp_path / "logs"  # the run dir's one folder a node can reach (a command's log)
    run_dir.mkdir(mode=0o755)
    box = rt.mailbox("sealed")
    pid_slot, result = box / "pid", box / "result"
    neighbour = rt.start("w1", _sleeper, {"seconds": 60, "slot": str(pid_slot)})
    try:
        assert pid_slot.read_text() == "1"  # the first process of its own PID namespace
        server = multiprocessing.forkserver._forkserver
        address = server._forkserver_address
        assert address and os.path.exists(address)
        probe = rt.start("w0", _probe, {"slot": str(result), "forkserver": address, "neighbour": neighbour.pid,
                                         "runner": os.getpid(), "forkserver_pid": server._forkserver_pid,
                                         "run_dir": str(run_dir), "netns_link": f"/run/netns/eb-{rt.run_id}-zz"})
        probe.join(150)
        got = json.loads(result.read_text())
    finally:
        neighbour.kill()
    uid = got["ids"][0][0]
    assert uid in run_block(rt.run_id) and got["ids"] == [[uid] * 3, [uid] * 3, []], got["ids"]
    assert uid != rt.handles["w1"].identity.uid
    denied = ("Permission denied", "Operation not permitted", "Read-only file system")
    tried = [*got["create"].values(), got["modules"], *got["connect"].values(),
             *got["plant"].values()]  # the forkserver's socket; /run/netns
    assert len(tried) == 4 and all(v in denied for v in tried), got
    # the neighbour, the runner and the forkserver are not in its PID namespace: no such process
    assert list(got["signal"].values()) == ["No such process"] * 3, got["signal"]
    gone = (*denied, "No such file or directory")  # nor listed in the node's /proc
    assert all(v in gone for v in [*got["environ"].values(), *got["read"].values()]), got
    assert got["write"] and all(v in denied for v in got["write"].values()), got["write"]  # the knobs
    assert got["listed"] == [], got["listed"]  # neither the neighbour, nor the forkserver, nor init
    assert not (run_dir / "planted").exists() and not os.path.lexists(f"/run/netns/eb-{rt.run_id}-zz")
    assert got["python"] == "2.0", got


def test_a_command_log_is_the_nodes_own_file(cluster, tmp_path):
    """A command's output file is made by the runner for the node's uid, mode 0600, never followed."""
    from testbed.runtimes.netns.runtime import _own_file

    rt, _ = cluster
    log = tmp_path / "w0.log"
    _own_file(log, rt.handles["w0"].identity)
    st = os.lstat(log)
    assert (st.st_uid, st.st_mode & 0o777) == (rt.handles["w0"].identity.uid, 0o600)
    link = tmp_path / "w1.log"
    link.symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        _own_file(link, rt.handles["w1"].identity)
    assert not (tmp_path / "target").exists()


def _try_to_stop(stop_event, slot, seen):
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    out = {}
    try:
        stop_event.set()
        out["set"] = "ok"
    except PermissionError as e:
        out["set"] = str(e)
    lines = [ln for ln in open("/proc/self/maps") if "edgebed-stop" in ln]
    start = int(lines[0].split("-")[0], 16) if lines else 0
    made = libc.mprotect(start, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_WRITE) if start else -1
    out["mprotect"] = "ok" if made == 0 else os.strerror(ctypes.get_errno())
    out["mapped"] = bool(lines)
    mailbox.write_text(slot, json.dumps(out))
    deadline = time.monotonic() + 30
    while not stop_event.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    mailbox.write_text(seen, json.dumps(stop_event.is_set()))


def test_only_the_runner_sets_the_runs_stop(cluster):
    """Every netns node mapped the runner's one stop arena writable: any node could stop the run."""
    rt, _ = cluster
    stop = rt.make_stop_event()
    box = rt.mailbox("stop")
    tried = box / "tried"
    job = rt.start("w0", _try_to_stop, {"stop_event": stop, "slot": str(tried), "seen": str(box / "seen")})
    got = json.loads(tried.read_text())
    assert got["set"] == "the run's stop is the runner's to set" and not stop.is_set(), got
    assert got["mapped"] and got["mprotect"] == "Permission denied", got
    stop.set()
    job.join(30)
    assert json.loads((box / "seen").read_text()) is True


def _docker_or_skip():
    from testbed.runtimes.engine.client import docker_client

    client = docker_client(timeout=3)
    if client is None:
        pytest.skip("no Docker engine answers (CI starts dockerd; elsewhere start it to run these)")
    return client


def test_a_docker_nodes_code_runs_as_its_own_uid_and_reaches_nothing_of_its_supervisor(tmp_path, clean_host):
    """As uid 0 without capabilities, a docker node's job could rewrite the image's modules (root
    owns them) that the supervisor, which keeps the container's powers, imports later, read
    both key files and signal the supervisor. The container's root file system is read-only
    even to its root (its keys in a volume of its own, gone with the run), /tmp writable."""
    import secrets

    from testbed.kernel.identity import container_identity
    from testbed.node.channel_keys import KEY_FILE, SUPERVISOR_KEY_FILE
    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster
    from testbed.runtimes.docker.runtime import DockerRuntime
    from testbed.runtimes.engine.images import ensure_node_image
    from testbed.runtimes.state import RUN_LABEL, RunState

    client = _docker_or_skip()
    image = ensure_node_image(client, say=lambda s: None)
    sc = parse_scenario({"name": "sealed", "runtime": "docker",
                         "profiles": {"edge": {"cpus": 0.5, "memory": "300m", "bandwidth": "50mbit"}},
                         "workers": [{"count": 1, "profile": "edge"}]})
    run_id = secrets.token_hex(3)
    state = RunState(run_id=run_id, runner_pid=os.getpid(), run_dir=str(tmp_path), scenario="sealed",
                     runtime="docker")
    state.save()
    rt = DockerRuntime(state, client, image)
    try:
        rt.create(build_cluster(sc, run_id))
        slot = rt.mailbox("sealed") / "w0"
        job = rt.start("w0", "testbed.node.reach:probe", {
            "slot": str(slot), "read": [KEY_FILE, SUPERVISOR_KEY_FILE], "signal": [1],
            "write": ["/usr/local/lib", "/etc/passwd"], "plant": ["/run/edgebed/planted"]})
        job.join(60)
        got = json.loads(slot.read_text())
        container = rt.handles["w0"].container
        as_root = container.exec_run(["sh", "-c", "touch /opt/x; touch /tmp/x && echo tmp written"]).output.decode()
        volumes = client.volumes.list(filters={"label": f"{RUN_LABEL}={run_id}"})
        containers = len(rt.handles)
    finally:
        rt.make_stop_event().set()
        assert rt.teardown() == []
    assert "Read-only file system" in as_root and "tmp written" in as_root, as_root
    assert len(volumes) == containers == 3 and client.volumes.list(filters={"label": f"{RUN_LABEL}={run_id}"}) == []
    me = container_identity()
    assert got["ids"] == [[me.uid] * 3, [me.gid] * 3, []], got["ids"]
    denied = ("Permission denied", "Operation not permitted", "Read-only file system", "Is a directory")
    assert all(v in denied for v in got["read"].values()), got["read"]
    assert all(v in denied for v in got["signal"].values()), got["signal"]
    assert all(v in denied for v in got["write"].values()), got["write"]
    assert got["modules"] in denied and all(v in denied for v in got["plant"].values()), got


def test_a_node_keeps_its_parent_death_signal_as_its_own_uid():
    """The kernel clears the parent-death signal when a process's ids change: a netns node would
    outlive a killed runner (tests/runs/test_lifecycle.py's kill -9 test found it)."""
    from testbed.kernel.identity import node_identity
    from testbed.kernel.parent_death import die_with_parent, parent_death_signal
    from testbed.kernel.privileges import drop_privileges

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(signal.SIGKILL)
            drop_privileges(node_identity("abcdef", 3))
            os.write(w, json.dumps({"uid": os.getuid(), "pdeathsig": parent_death_signal()}).encode())
        finally:
            os._exit(0)  # never back into pytest from a forked child
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    assert got == {"uid": node_identity("abcdef", 3).uid, "pdeathsig": signal.SIGKILL}, got


def test_a_swarm_nodes_root_and_a_fleet_hosts_are_read_only():
    """A node's supervisor task, like a docker node's container, gets a read-only root file
    system with tmpfs where its code writes (its keys are secrets, mounted by the engine); so does
    a fleet host, with /run a tmpfs too for the namespaces and cgroups it mounts there."""
    from testbed.runtimes.engine.supervised import FLEET_HOST_TMPFS, WRITABLE_TMPFS, tmpfs_mode
    from testbed.runtimes.swarm.hosts import SwarmHost
    from testbed.runtimes.swarm.runtime import SwarmRuntime

    made: list[dict] = []

    class Runtime(SwarmRuntime):
        labels = {"edgebed": "1", "edgebed.run": "abc123"}
        run_id = "abc123"

    rt = Runtime.__new__(Runtime)
    rt.client = type("Manager", (), {"services": type("Services", (), {
        "create": lambda self, image, **kw: made.append(kw) or kw})()})()
    rt.image, rt._urls, rt._services = "edgebed/node:x", ("tcp://a:1", "tcp://a:2"), {}
    host = SwarmHost(id="n1", hostname="h1", address="", cpus=2, memory=1, gpus=0)
    rt.service("w0", host, [], role="worker", secret=["its keys"])
    rt.service("h1-fleet", host, [], secret=["its keys"], caps=["NET_ADMIN", "SYS_ADMIN"], command=["python"],
               args=["-m", "testbed.node.fleet"])
    node, fleet = made
    assert node["read_only"] is True
    assert {(m["Target"], m["Type"], m["TmpfsOptions"]["Mode"]) for m in node["mounts"]} == \
        {(at, "tmpfs", 0o1777) for at in WRITABLE_TMPFS}
    assert fleet["read_only"] is True
    assert {(m["Target"], m["TmpfsOptions"]["Mode"]) for m in fleet["mounts"]} == \
        {("/tmp", 0o1777), ("/var/tmp", 0o1777), ("/run", 0o755)} == \
        {(at, tmpfs_mode(o)) for at, o in {**WRITABLE_TMPFS, **FLEET_HOST_TMPFS}.items()}
