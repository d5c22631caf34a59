"""Runtime swarm's fleets: a per-round fleet's devices packed into one container a host
(node.fleet.host, runtimes.swarm.fleet). Planning without an engine; one real run on the lab."""

import ipaddress
import json
import time

import pandas as pd
import pytest
import zmq

from testbed.node.channel_keys import ChannelKeys
from testbed.node.fleet.plan import DevicePlan, FleetPlan, keys_from_text, keys_to_text
from testbed.plan import parse_scenario as scenario_from_dict
from testbed.runtimes.swarm.fleet import device_lans, fleet_problems, packs_workers
from testbed.runtimes.swarm.hosts import SwarmHost, SwarmPlacer
from testbed.runtimes.swarm.runtime import SwarmRuntime

from helpers import _ours_on, needs_root, run_up, write_scenario


def _keys(node: str) -> ChannelKeys:
    public, secret = zmq.curve_keypair()
    return ChannelKeys(node, public, secret, zmq.curve_keypair()[0])


def _plan(**change) -> dict:
    plan = FleetPlan("abc123", "10.205.0.0/28", "10.205.0.1",
                     [DevicePlan("d0", "10.205.0.2", 0.05), DevicePlan("d1", "10.205.0.3", None, 0.01, 1 << 28)],
                     {"dataset": "mnist5k", "seed": 1})
    data = json.loads(plan.to_text())
    for path, value in change.items():
        *where, last = path.split("__")
        target = data
        for part in where:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return data


def test_a_fleet_plan_comes_back_as_it_was_written_and_holds_no_key():
    text = json.dumps(_plan())
    back = FleetPlan.from_text(text)
    assert [d.node for d in back.devices] == ["d0", "d1"] and "secret" not in text
    assert back.devices[0].cpus == 0.05 and back.devices[1].memory == 1 << 28 and back.devices[1].cpu_period == 0.01
    assert back.warm == {"dataset": "mnist5k", "seed": 1}


@pytest.mark.parametrize("change, field", [
    ({"run": "../etc"}, "run"),
    ({"gateway": "10.9.0.1"}, "gateway"),
    ({"devices__0__address": "10.205.1.2"}, "devices.d0.address"),
    ({"devices__0__address": "10.205.0.1"}, "devices.d0.address"),  # the gateway's
    ({"devices__1__address": "10.205.0.2"}, "devices"),  # twice
    ({"devices__0__node": "../../x"}, "devices"),
    ({"devices__0__cpus": -1}, "devices.d0.cpus"),
    ({"devices__0__cpus": True}, "devices.d0.cpus"),
    ({"devices__1__memory": 1.5}, "devices.d1.memory"),
])
def test_a_fleet_plan_with_a_field_of_the_wrong_shape_is_refused_naming_it(change, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        FleetPlan.from_text(json.dumps(_plan(**change)))


def test_the_keys_are_exactly_the_plans_devices_each_its_own_with_its_supervisors():
    plan = FleetPlan.from_text(json.dumps(_plan()))
    d0, d1 = (_keys("d0"), _keys("d0")), (_keys("d1"), _keys("d1"))
    assert keys_from_text(keys_to_text([d0, d1]), plan) == {"d0": d0, "d1": d1}
    with pytest.raises(ValueError, match="^keys: not exactly"):
        keys_from_text(keys_to_text([d0]), plan)
    without = json.loads(keys_to_text([d0, d1]))
    del without["d1"]["supervisor"]
    with pytest.raises(ValueError, match="^keys: not exactly the plan's devices, each with its supervisor's"):
        keys_from_text(json.dumps(without), plan)
    swapped = json.loads(keys_to_text([d0, d1]))
    swapped["d0"], swapped["d1"] = swapped["d1"], swapped["d0"]
    with pytest.raises(ValueError, match="another node's keys"):
        keys_from_text(json.dumps(swapped), plan)
    crossed = json.loads(keys_to_text([d0, d1]))
    crossed["d0"]["supervisor"] = crossed["d1"]["supervisor"]
    with pytest.raises(ValueError, match="keys.d0: another node's keys"):
        keys_from_text(json.dumps(crossed), plan)


def test_each_host_gets_a_lan_of_its_own_that_holds_its_devices():
    lans = device_lans({"b": 1000, "a": 10, "c": 1022})
    assert [lans[h].num_addresses for h in "abc"] == [16, 1024, 2048]  # 1,022 + gateway + network + broadcast > 1,024
    nets = sorted(lans.values())
    assert all(not x.overlaps(y) for i, x in enumerate(nets) for y in nets[i + 1:])
    assert all(n.subnet_of(ipaddress.IPv4Network("10.205.0.0/16")) for n in nets)
    with pytest.raises(RuntimeError, match="do not fit the fleet pool"):
        device_lans({"a": 40_000, "b": 40_000})


def _host(name):
    return SwarmHost(id=name, hostname=name, address="", cpus=2.0, memory=8 << 30, gpus=0, labels={})


def _fleet(workers=1000, **extra):
    return scenario_from_dict({"profiles": {"phone": {"cpus": 0.05}}, "ps": {"profile": {"cpus": 0.5}},
                               "workers": [{"count": workers, "profile": "phone", "name": "d"}],
                               "algorithm": {"name": "fedavg", "params": {"clients": 10, "deadline_s": 20,
                                                                         "trainers": "per_round"}}, **extra})


def test_packed_devices_book_no_cpu_and_are_dealt_out_to_the_hosts_evenly():
    from testbed.plan.cluster import build_cluster

    sc = _fleet(placement={"d7": "a"})
    assert packs_workers(sc)
    spec = build_cluster(sc, "abc123")
    with pytest.raises(RuntimeError, match="needs 0.05 CPUs"):  # unpacked, 50 cores of devices do not fit 4
        SwarmPlacer([_host("a"), _host("b")], sc).place(spec)
    out = SwarmPlacer([_host("a"), _host("b")], sc, packed=lambda n: n.role == "worker").place(spec)
    on_a = sum(1 for n, h in out.items() if n.startswith("d") and h == "a")
    assert on_a == 500 and out["d7"] == "a"  # the pin kept, the rest evenly


def test_what_a_packed_fleet_cannot_have_is_one_line_each_and_the_overlay_cap_does_not_apply():
    assert SwarmRuntime.scenario_problems(_fleet(workers=2000)) == []  # devices are not on the overlay
    assert SwarmRuntime.scenario_problems(_fleet(workers=2000, algorithm={"name": "fedavg"})) != []  # they are
    gpus = _fleet(profiles={"phone": {"cpus": 0.05, "gpus": 1}})
    assert [line.split(":")[0] for line in fleet_problems(gpus)] == ["workers"]


def test_a_device_reads_the_runners_address_in_its_requests_as_its_gateways():
    from testbed.node.fleet.device import FleetDevice

    sup = FleetDevice.__new__(FleetDevice)  # no channel: only the rewrite is tried
    sup._prefixes = (b"tcp://10.201.0.254:", b"tcp://10.205.0.1:")
    sup.dropped = __import__("testbed.node.untrusted", fromlist=["Drops"]).Drops("d0")
    req = sup._request(b'{"seq": 3, "cfg": {"control": "tcp://10.201.0.254:4100", "other": "tcp://10.201.0.25:1"}}')
    assert req == {"seq": 3, "cfg": {"control": "tcp://10.205.0.1:4100", "other": "tcp://10.201.0.25:1"}}


def test_a_node_cut_from_every_other_is_cut_from_everyone_and_a_partial_heal_cuts_the_rest_again():
    """Availability's offline device on swarm (runtimes.swarm.runtime._cut_traffic): one cut from
    everyone, not a filter pair for each of the cluster's addresses; healing some of them while
    cut from everyone heals all and cuts the others again; any other cut names its addresses."""
    from types import SimpleNamespace

    rt = SwarmRuntime.__new__(SwarmRuntime)
    rt._cut_off = set()
    rt.handles = {n: SimpleNamespace(node=SimpleNamespace(address=a))
                  for n, a in (("ps", "10.201.0.2"), ("d0", "10.205.0.2"), ("d1", "10.205.0.3"), ("d2", "10.205.0.4"))}
    sent = []
    rt._request = lambda node, wire: sent.append((node, {k: v for k, v in wire.items() if k != "op"}))
    everyone = ["10.201.0.2", "10.205.0.3", "10.205.0.4"]
    rt._cut_traffic("d0", everyone, True)
    rt._cut_traffic("d0", everyone, False)
    rt._cut_traffic("d0", everyone, True)
    rt._cut_traffic("d0", ["10.205.0.3"], False)  # d1 back, the others still cut
    rt._cut_traffic("d1", ["10.205.0.2"], True)  # one peer: named
    assert sent == [("d0", {"addresses": [], "cut": True, "everyone": True}),
                    ("d0", {"addresses": [], "cut": False, "everyone": True}),
                    ("d0", {"addresses": [], "cut": True, "everyone": True}),
                    ("d0", {"addresses": [], "cut": False, "everyone": True}),
                    ("d0", {"addresses": ["10.201.0.2", "10.205.0.4"], "cut": True, "everyone": False}),
                    ("d1", {"addresses": ["10.205.0.2"], "cut": True, "everyone": False})]
    assert rt._cut_off == set()

def check_where_i_am(netns_inode: int, node: str, hold: float = 0.0, uid: int = 40001, hidden: str = "") -> None:
    """A forkserver's job (below): exits 0 where it runs in `netns_inode` with `node`'s keys, no
    capability left, uid `uid` (its device's own) and no mount at `hidden`, 3 otherwise; holds on
    `hold` s first."""
    import os
    import sys
    import time

    from testbed.node import channel_keys

    time.sleep(hold)
    status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    keys = channel_keys.held()
    ok = os.stat("/proc/self/ns/net").st_ino == netns_inode and keys is not None and keys.node == node \
        and int(status["CapEff"], 16) == 0 and os.getresuid() == (uid,) * 3 \
        and not (hidden and os.path.ismount(hidden))
    sys.exit(0 if ok else 3)


@needs_root
def test_the_forkserver_forks_into_a_device_s_namespace_with_its_keys_alone_and_reports_ends(job_out):
    """A fleet host's processes come from its forkserver (node.fleet.spawner): a job runs in the
    device's namespace, with that device's keys and no capability; keys of another device are
    refused in the child; a kill comes back as -9; the forkserver's end stops what it forked; the
    device's processes run as its own uid (40001 + its index on the host) and do not see the
    host's cgroup hierarchy (a mount the host's forkserver hides from them)."""
    import multiprocessing as mp
    import os
    import signal
    import socket
    import subprocess
    import uuid

    from testbed.kernel.netlink import NETNS_DIR, create_netns, remove_netns
    from testbed.node.fleet.spawner import Forks, Forkserver
    from testbed.node.stop_flag import StopFlag

    name = f"eb-fs-{uuid.uuid4().hex[:6]}"
    hierarchy = job_out / "cgroup"  # stands for the host's cgroup mount, where a device's uid may look
    hierarchy.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(hierarchy)], check=True)
    create_netns(name, ipv6=False)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stop = StopFlag(mp.get_context("fork"))
    server = os.fork()
    if server == 0:
        code = 1
        try:
            mine.close()
            code = Forkserver(theirs, stop, lambda: None, hidden=(str(hierarchy),)).run()
        finally:
            os._exit(code)  # never back into pytest from a forked child
    theirs.close()
    try:
        forks, inode, keys = Forks(mine), os.stat(f"{NETNS_DIR}/{name}").st_ino, _keys("d7")
        job = {"target": "test_swarm_fleet:check_where_i_am", "kwargs": {"netns_inode": inode, "node": "d7",
                                                                         "uid": 40008, "hidden": str(hierarchy)}}
        ok = forks.fork("job", "d7", f"{NETNS_DIR}/{name}", job, keys.to_text(), (), index=7)
        ok.join(timeout=30)
        assert ok.exitcode == 0
        wrong = forks.fork("job", "d8", f"{NETNS_DIR}/{name}", job, keys.to_text(), ())  # d7's keys for d8
        wrong.join(timeout=30)
        assert wrong.exitcode == 1
        held = forks.fork("job", "d7", f"{NETNS_DIR}/{name}", {**job, "kwargs": {**job["kwargs"], "hold": 60}},
                          keys.to_text(), (), index=7)
        time.sleep(1.0)
        os.killpg(held.pid, signal.SIGKILL)  # the job is its process group's leader (node.supervisor)
        held.join(timeout=10)
        assert held.exitcode == -9
        last = forks.fork("job", "d7", f"{NETNS_DIR}/{name}", {**job, "kwargs": {**job["kwargs"], "hold": 60}},
                          keys.to_text(), ())
    finally:
        mine.close()  # the forkserver's end: it stops its children within its grace
        os.waitpid(server, 0)
        remove_netns(name)
        still_mounted = os.path.ismount(hierarchy)  # hidden from the devices only
        subprocess.run(["umount", str(hierarchy)], check=False)
    assert still_mounted
    with pytest.raises(ProcessLookupError):
        os.kill(last.pid, 0)


# -- on the lab's two hosts (tests/conftest.py's `lab` fixture) --------------------------------
def test_a_per_round_fleet_trains_from_one_container_a_host(tmp_path, lab, clean_host):
    """24 devices packed into two fleet hosts: every device a namespace with its own shaped link
    and quota inside its host's container, FedAvg selecting 5 a round; the records show rounds
    that finished, the devices on both hosts, their own links and cgroups counted, and nothing of
    the run left on either host."""
    sc = {"name": "fleet-swarm", "seed": 1, "runtime": "swarm",
          "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_seconds": 5},
          "stop": {"seconds": 45},
          "algorithm": {"name": "fedavg", "params": {"period": 4, "clients": 5, "over_selection": 1.3,
                                                      "deadline_s": 20, "trainers": "per_round"}},
          "profiles": {"phone": {"cpus": 0.05, "bandwidth": "20mbit", "latency": "30ms"},
                       "server": {"cpus": 0.4, "bandwidth": "1gbit"}},
          "ps": {"profile": "server"}, "evaluator": {"profile": "server"},
          "workers": [{"count": 24, "profile": "phone", "name": "d"}]}
    run_dir = tmp_path / "run"
    run_up(write_scenario(tmp_path, sc), run_dir, "-q", timeout=900)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_accuracy"] > 0.5
    meta = json.loads((run_dir / "meta.json").read_text())
    devices = {n: m for n, m in meta["nodes"].items() if n.startswith("d")}
    assert len(devices) == 24 and {m["host"] for m in devices.values()} == {"eb-lab-h1", "eb-lab-h2"}
    assert all(m["compute"]["engine"] == "swarm fleet host" and m["compute"]["cpu_quota"] == 0.05
               for m in devices.values())
    rounds = pd.read_csv(run_dir / "rounds.csv")
    assert (rounds.n_finished > 0).sum() >= 3
    traffic = pd.read_csv(run_dir / "traffic.csv")
    up = traffic[traffic.node.str.match(r"d\d+$") & (traffic.direction == "up")].groupby("node").bytes.max()
    assert (up > 100_000).sum() >= 5  # trainers' updates crossed their own devices' links
    # the trainers ran in their devices' cgroups, under their quotas (their supervisors did not)
    res = pd.read_csv(run_dir / "resources.csv")
    res = res[res.node.str.match(r"d\d+$")]
    assert (res.groupby("node").cpu_seconds.max() > 0.5).sum() >= 5 and set(res.cpu_quota.dropna()) == {0.05}
    for k in (0, 1):  # each host's log: its devices up, the relay never restarted, nothing failed
        log = (run_dir / "logs" / f"fh-{k}.log").read_text()
        assert "12 devices made" in log and "serving 12 devices" in log, log
        assert "Traceback" not in log and "relay ended" not in log, log
    assert not (run_dir / "logs" / "d0.log").exists()
    for h in lab:
        assert _ours_on(h) == ({"containers": [], "networks": [], "services": []} if h.name.endswith("h1")
                               else {"containers": [], "networks": []}), h.name


def test_a_device_silent_past_its_reports_is_gone_while_its_host_runs():
    """A fleet host's task can outlive the process that serves its devices (stuck, or ended with
    the container still up): a device's silence (it reports every 10 s while idle) is what says it
    is gone, so a request to it ends at once."""
    import time

    from testbed.runtimes.live import LiveOps
    from testbed.runtimes.swarm.runtime import DEVICE_SILENT_S

    rt = object.__new__(SwarmRuntime)
    LiveOps.__init__(rt)
    host = type("Service", (), {"id": "s-fh0"})()
    rt._services = {"d0": host, "d1": host, "d2": host}
    rt._tasks = {"s-fh0": (time.monotonic(), True)}
    rt.fleet = type("Fleet", (), {"of": {"d0": None, "d1": None, "d2": None}})()
    now = time.monotonic()
    rt.hub = type("Hub", (), {"stats_at": {"d0": now - 1, "d1": now - DEVICE_SILENT_S - 1}})()
    assert rt.task_running("d0") and not rt.task_running("d1")
    assert rt.task_running("d2")  # never reported: not shaped yet, not taken for gone
    rt._tasks = {"s-fh0": (time.monotonic(), False)}
    assert not rt.task_running("d0")  # its host's task ended
