"""A netns node's process is PID 1 of a PID namespace of its own (kernel.pid_namespace): its code
sees its own namespace's processes alone and cannot name the runner's, while the runner still
kills it by the pid it knows, reads its exit code and finds it in the node's cgroup."""

import errno
import json
import os
import signal
import threading
import time

import pytest

from testbed.kernel import pid_namespace
from testbed.kernel.parent_death import ParentWatch
from testbed.node import mailbox

from helpers import needs_root, netns_cluster, until


@pytest.fixture
def cluster(tmp_path, clean_host):
    with netns_cluster(tmp_path, {
        "name": "pidns",
        "profiles": {"edge": {"cpus": 0.5, "memory": "512m", "uplink": "50mbit", "downlink": "50mbit"}},
        "ps": {"profile": "edge"},
        "workers": [{"count": 2, "profile": "edge"}],
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
        "ns": os.readlink("/proc/self/ns/pid"), "runner": kill(runner)}))


def _nspids(pid):
    """The pids of process `pid` in each namespace it is in, outermost first (host's /proc)."""
    with open(f"/proc/{pid}/status") as f:
        return [int(x) for x in next(line for line in f if line.startswith("NSpid:")).split()[1:]]


def _sleep_in(slot):
    mailbox.write_text(slot, "up")
    time.sleep(60)


@needs_root
@pytest.mark.root
def test_each_node_process_sees_only_its_own_pid_namespace(cluster):
    rt, _ = cluster
    box = rt.mailbox("pidns")
    procs = [rt.start(node, _look, {"slot": str(box / node), "runner": os.getpid()}) for node in ("w0", "w1")]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seen = [json.loads((box / node).read_text()) for node in ("w0", "w1")]
    for got in seen:
        assert got["pid"] == 1 and got["ppid"] == 0, got  # its parent, the forkserver, is outside
        assert got["ns"] != os.readlink("/proc/self/ns/pid"), got
        assert got["listed"] == [1], got  # its /proc is its namespace's: no runner, no neighbour
        assert got["runner"] == "ESRCH", got
    assert seen[0]["ns"] != seen[1]["ns"]  # each its own, not one for the run


@needs_root
@pytest.mark.root
def test_the_runner_kills_a_node_process_by_the_pid_it_knows(cluster):
    rt, _ = cluster
    slot = rt.mailbox("pidns") / "up"
    p = rt.start("w0", _sleep_in, {"slot": str(slot)})
    assert slot.read_text() == "up"
    assert rt.handles["w0"].cgroup.member_pids() == {p.pid}
    assert _nspids(p.pid) == [p.pid, 1]  # the host's pid, and 1 in its own
    p.kill()
    p.join(10)
    assert p.exitcode == -signal.SIGKILL
    assert until(lambda: not rt.handles["w0"].cgroup.member_pids(), 10)


def _exit_with(code):
    os._exit(code)


def _raise():
    raise RuntimeError("a role that fails")


def _fault():
    import ctypes

    ctypes.string_at(0)


def _signal_self(sig):
    os.kill(os.getpid(), sig)  # an init's own signal with the default action: dropped
    os._exit(3)


@needs_root
@pytest.mark.root
@pytest.mark.parametrize("target, kwargs, code", [
    (_exit_with, {"code": 7}, 7), (_exit_with, {"code": 0}, 0), (_raise, {}, 1), (_fault, {}, -signal.SIGSEGV),
    (os.abort, {}, -signal.SIGSEGV), (_signal_self, {"sig": signal.SIGTERM}, 3)])
def test_the_runner_reads_a_node_process_exit_code(cluster, target, kwargs, code):
    rt, _ = cluster
    p = rt.start("w0", target, kwargs)
    p.join(60)
    assert p.exitcode == code


def _leave_a_child(slot):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    mailbox.write_text(slot, "forked")


@needs_root
@pytest.mark.root
def test_what_a_node_process_left_running_ends_with_it(cluster):
    rt, _ = cluster
    slot = rt.mailbox("pidns") / "forked"
    p = rt.start("w0", _leave_a_child, {"slot": str(slot)})
    p.join(60)
    assert p.exitcode == 0 and slot.read_text() == "forked"
    assert until(lambda: not rt.handles["w0"].cgroup.member_pids(), 10)  # the kernel ended the namespace's rest


def _forkserver_like(new_namespaces, out_w):
    """A process that forks two children the way the runner's forkserver does, then starts a thread."""
    pid_namespace.fork_children_apart(new_namespaces)
    seen = []
    for _ in range(2):
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(w, json.dumps([os.getpid(), os.readlink("/proc/self/ns/pid"), pid_namespace.forked_by]).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(child, 0)
        seen.append(json.loads(os.read(r, 4096)))
        os.close(r)
    t = threading.Thread(target=lambda: None)
    t.start()  # refused while its children's namespace is not its own
    t.join()
    os.write(out_w, json.dumps({"me": os.getpid(), "ns": os.readlink("/proc/self/ns/pid"), "children": seen}).encode())


@needs_root
@pytest.mark.root
@pytest.mark.parametrize("new_namespaces", [True, False])
def test_a_forkserver_forks_each_child_into_a_namespace_of_its_own(new_namespaces):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _forkserver_like(new_namespaces, w)
        finally:
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got = json.loads(os.read(r, 65536))
    (pid1, ns1, by1), (pid2, ns2, by2) = got["children"]
    assert by1 == by2 == got["me"]
    if new_namespaces:
        assert pid1 == pid2 == 1 and len({ns1, ns2, got["ns"]}) == 3
    else:
        assert pid1 != 1 and ns1 == ns2 == got["ns"]


def test_a_parent_watch_sees_its_parent_end():
    """The watcher's parent ends while it runs: the watch says so (the host's procfs names its reaper)."""
    out_r, out_w = os.pipe()
    ready_r, ready_w = os.pipe()
    middle = os.fork()
    if middle == 0:
        if os.fork() == 0:
            watch = ParentWatch(os.getppid())
            before = watch.gone()
            os.write(ready_w, b"x")
            after = until(watch.gone, 10)
            os.write(out_w, json.dumps([before, after]).encode())
            os._exit(0)
        os.read(ready_r, 1)  # ends only once the watcher looked
        os._exit(0)
    os.close(out_w)
    os.close(ready_w)
    os.waitpid(middle, 0)
    data = b""
    while more := os.read(out_r, 4096):
        data += more
    assert json.loads(data) == [False, True]


PER_ROUND = {"name": "fedavg", "params": {"trainers": "per_round", "deadline_s": 20, "clients": 1, "period": 10}}


def test_the_plan_says_when_trainers_start_per_round():
    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster

    base = {"name": "plan", "ps": {}, "workers": [{"count": 2}]}
    assert build_cluster(parse_scenario({**base, "algorithm": PER_ROUND}), "abc123").trainers_per_round
    assert not build_cluster(parse_scenario(base), "abc123").trainers_per_round


@needs_root
@pytest.mark.root
def test_per_round_trainers_share_the_hosts_pid_namespace(tmp_path, clean_host):
    """A process started for every round it is drawn in keeps the host's PID namespace (its own
    uid and procfs still hide the rest): its namespace made large fleets' rounds slower."""
    with netns_cluster(tmp_path, {
        "name": "pidns-rounds", "algorithm": PER_ROUND,
        "profiles": {"edge": {"cpus": 0.5, "memory": "512m", "uplink": "50mbit", "downlink": "50mbit"}},
        "ps": {"profile": "edge"}, "workers": [{"count": 1, "profile": "edge"}],
    }) as (rt, _):
        slot = rt.mailbox("pidns") / "w0"
        p = rt.start("w0", _look, {"slot": str(slot), "runner": os.getpid()})
        p.join(60)
        assert p.exitcode == 0
        got = json.loads(slot.read_text())
    assert got["pid"] == p.pid and got["ns"] == os.readlink("/proc/self/ns/pid"), got
    assert got["listed"] == [p.pid] and got["runner"] == "EPERM", got  # hidden and refused by its uid
