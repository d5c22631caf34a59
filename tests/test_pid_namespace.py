"""A netns node's process runs in a PID namespace of its own (kernel.pid_namespace): its code
sees its own namespace's processes alone and cannot name the runner's, while the runner still
kills it by the pid it knows, reads its exit code and finds all of it in the node's cgroup."""

import errno
import json
import os
import signal
import time

import pytest
from conftest import needs_root, netns_cluster

from testbed.node import mailbox

pytestmark = [needs_root, pytest.mark.root]


@pytest.fixture
def cluster(tmp_path, clean_host):
    with netns_cluster(tmp_path, {
        "name": "pidns",
        "profiles": {"edge": {"cpus": 0.5, "memory": "512m", "uplink": "50mbit", "downlink": "50mbit"}},
        "ps": {"profile": "edge"},
        "workers": [{"count": 1, "profile": "edge"}],
    }) as c:
        yield c


def _look(slot, runner):
    def kill(pid):
        try:
            os.kill(pid, 0)
            return "ok"
        except OSError as e:
            return errno.errorcode[e.errno]

    mailbox.write_text(slot, json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "listed": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "ns": os.readlink("/proc/self/ns/pid"), "runner": kill(runner), "init": kill(1)}))


def _nspids(pid):
    """The pids of process `pid` in each namespace it is in, outermost first (host's /proc)."""
    with open(f"/proc/{pid}/status") as f:
        return [int(x) for x in next(line for line in f if line.startswith("NSpid:")).split()[1:]]


def _sleep_in(slot):
    mailbox.write_text(slot, "up")
    time.sleep(60)


def _wait_for(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.read_text()


def test_a_nodes_code_sees_only_its_own_pid_namespace(cluster):
    rt, _ = cluster
    slot = rt.mailbox("pidns") / "look"
    p = rt.start("w0", _look, {"slot": str(slot), "runner": os.getpid()})
    p.join(60)
    assert p.exitcode == 0
    got = json.loads(slot.read_text())
    assert got["pid"] == 2 and got["ppid"] == 1, got  # init is 1, the node's code the first it forked
    assert got["ns"] != os.readlink("/proc/self/ns/pid"), got
    assert got["listed"] == [2], got  # its /proc is its namespace's: no runner, no neighbour, init hidden
    assert got["runner"] == "ESRCH" and got["init"] == "EPERM", got


def test_the_runner_kills_the_namespace_by_the_pid_it_knows(cluster):
    rt, _ = cluster
    slot = rt.mailbox("pidns") / "up"
    p = rt.start("w0", _sleep_in, {"slot": str(slot)})
    _wait_for(slot)
    members = rt.handles["w0"].cgroup.member_pids()
    assert p.pid in members and len(members) == 3, members  # outside, init and the node's code: one cgroup
    assert _nspids(p.pid) == [p.pid]  # the runner's pid stays in the host's namespace
    inside = sorted(_nspids(pid)[1] for pid in members - {p.pid})
    assert inside == [1, 2], inside
    p.kill()
    p.join(10)
    assert p.exitcode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while rt.handles["w0"].cgroup.member_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not rt.handles["w0"].cgroup.member_pids()  # init went with its parent, the namespace with init


def test_kill_node_ends_every_process_of_the_node(cluster):
    rt, _ = cluster
    slot = rt.mailbox("pidns") / "up"
    p = rt.start("w0", _sleep_in, {"slot": str(slot)})
    _wait_for(slot)
    rt.kill_node("w0")
    p.join(10)
    assert p.exitcode == -signal.SIGKILL  # what a crash records


def _exit_with(code):
    os._exit(code)


def _raise():
    raise RuntimeError("a role that fails")


def _signal_self(sig):
    os.kill(os.getpid(), sig)  # not PID 1: a default action ends it, as on the host
    time.sleep(30)


def _leave_a_child(slot):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    mailbox.write_text(slot, "forked")


@pytest.mark.parametrize("target, kwargs, code", [
    (_exit_with, {"code": 7}, 7), (_exit_with, {"code": 0}, 0), (_raise, {}, 1),
    (_signal_self, {"sig": signal.SIGTERM}, -signal.SIGTERM), (_signal_self, {"sig": signal.SIGKILL}, -signal.SIGKILL),
    (_signal_self, {"sig": signal.SIGSEGV}, -signal.SIGSEGV)])
def test_the_runner_reads_the_nodes_exit_code(cluster, target, kwargs, code):
    rt, _ = cluster
    p = rt.start("w0", target, kwargs)
    p.join(60)
    assert p.exitcode == code


def test_what_a_node_left_running_ends_with_it(cluster):
    rt, _ = cluster
    slot = rt.mailbox("pidns") / "forked"
    p = rt.start("w0", _leave_a_child, {"slot": str(slot)})
    p.join(60)
    assert p.exitcode == 0 and _wait_for(slot) == "forked"
    assert not rt.handles["w0"].cgroup.member_pids()  # gone by the time the runner reads the exit code


def test_each_process_of_a_node_has_a_namespace_of_its_own(cluster):
    """A role and its node's stress start apart and end apart (a stress change, a per-round
    trainer's end): neither's namespace may take the other with it."""
    rt, _ = cluster
    box = rt.mailbox("pidns")
    ps = [rt.start("w0", _sleep_in, {"slot": str(box / f"up{k}")}) for k in range(2)]
    try:
        for k in range(2):
            _wait_for(box / f"up{k}")
        inside = [pid for pid in rt.handles["w0"].cgroup.member_pids() if _nspids(pid)[1:] == [2]]
        assert len(inside) == 2 and len({os.readlink(f"/proc/{pid}/ns/pid") for pid in inside}) == 2, inside
        ps[0].kill()
        ps[0].join(10)
        assert ps[1].is_alive()
    finally:
        for p in ps:
            p.kill()
            p.join(10)
