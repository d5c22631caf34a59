"""The LXC-style runtime on real namespaces: shaping installed, connectivity, limits, teardown."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import needs_root, netns_cluster

pytestmark = [needs_root, pytest.mark.root]


def _echo_server(port, path):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    s.settimeout(20)
    c, addr = s.accept()
    data = c.recv(100)
    c.sendall(data.upper())
    Path(path).write_text(json.dumps({"peer": addr[0], "data": data.decode()}))


def _echo_client(addr, port, path):
    for _ in range(100):
        try:
            c = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            time.sleep(0.05)
    c.sendall(b"hello")
    Path(path).write_text(json.dumps({"reply": c.recv(100).decode()}))


def _read_cgroup_quota(run_id, node):
    from testbed.kernel import cgroups

    if cgroups.is_v2():
        q, p = (cgroups.ROOT / f"edgebed/{run_id}/{node}/cpu.max").read_text().split()
        return int(q) / int(p)
    base = cgroups.v1_mount("cpu") / f"edgebed/{run_id}/{node}"
    return int((base / "cpu.cfs_quota_us").read_text()) / int((base / "cpu.cfs_period_us").read_text())


@pytest.fixture
def cluster(tmp_path, clean_host):
    with netns_cluster(tmp_path, {
        "name": "t",
        "profiles": {
            "edge": {"cpus": 0.25, "memory": "256m", "uplink": "10mbit", "downlink": "30mbit"},
            "dc": {"bandwidth": "1gbit"},
        },
        "ps": {"profile": "dc"},
        "workers": [{"count": 2, "profile": "edge"}],
    }) as c:
        yield c


def test_shaping_installed_per_direction(cluster):
    from testbed.kernel.netlink import in_netns
    from testbed.kernel.shaping import qdisc_kinds, read_htb_class
    from testbed.runtimes.fabric import switch_netns

    rt, spec = cluster
    h = rt.handles["w0"]
    with in_netns(h.netns) as ns:
        idx = ns.link_lookup(ifname="eth0")[0]
        assert "htb" in qdisc_kinds(ns, idx)
        assert read_htb_class(ns, idx)["rate_bps"] == pytest.approx(10e6, rel=0.01)
    with in_netns(switch_netns(rt.run_id)) as sw:
        idx = sw.link_lookup(ifname="w0")[0]
        assert read_htb_class(sw, idx)["rate_bps"] == pytest.approx(30e6, rel=0.01)
        ps_idx = sw.link_lookup(ifname="ps")[0]
        assert read_htb_class(sw, ps_idx)["rate_bps"] == pytest.approx(1e9, rel=0.01)
    # the evaluator has no profile: nothing shaped
    ev = rt.handles["eval"]
    assert ev.uplink.rate_bps is None and ev.downlink.rate_bps is None


def test_change_rate_in_place(cluster):
    from testbed.kernel.netlink import in_netns
    from testbed.kernel.shaping import change_rate, read_htb_class

    rt, _ = cluster
    with in_netns(rt.handles["w1"].netns) as ns:
        idx = ns.link_lookup(ifname="eth0")[0]
        change_rate(ns, idx, 5e6)
        assert read_htb_class(ns, idx)["rate_bps"] == pytest.approx(5e6, rel=0.01)


def test_cgroup_limits(cluster):
    rt, _ = cluster
    assert _read_cgroup_quota(rt.run_id, "w0") == pytest.approx(0.25)
    assert rt.handles["w0"].compute["memory_bytes"] == 256 * 1024 ** 2


def test_cpu_period_kept_when_the_quota_changes(tmp_path, clean_host):
    from testbed.kernel import cgroups

    with netns_cluster(tmp_path, {"name": "t", "profiles": {"short": {"cpus": 0.25, "cpu_period": "10ms"}},
                                  "workers": [{"count": 1, "profile": "short"}]}) as (rt, _):
        cg = rt.handles["w0"].cgroup
        assert cg.period_us() == 10_000
        assert _read_cgroup_quota(rt.run_id, "w0") == pytest.approx(0.25)
        assert rt.handles["w0"].compute["cpu_period_s"] == pytest.approx(0.010)
        rt.set_cpus("w0", 0.5)  # a timeline cpu event
        assert cg.period_us() == 10_000
        assert _read_cgroup_quota(rt.run_id, "w0") == pytest.approx(0.5)
        assert cgroups.NodeCgroup(rt.run_id, "eval").period_us() == cgroups.PERIOD_US


@pytest.mark.serial  # it measures the cores a quota gives: another lane's load takes some
def test_cpu_benchmark_over_a_short_period(clean_host):
    from testbed.bench.cpu import cpu_benchmark

    res = cpu_benchmark(0.3, seconds=2, say=lambda s: None, cpu_period=0.01)
    assert res["cpu_period_s"] == pytest.approx(0.01)
    assert res["achieved_cores"] == pytest.approx(0.3, abs=0.05)
    # 10 ms periods: about 200 in the 2 s window (20 at the default 100 ms), nearly all throttled
    assert 150 <= res["periods"] <= 230 and res["throttled_periods"] >= 0.8 * res["periods"]


def test_nodes_talk_across_the_bridge_and_nothing_else(cluster, job_out):
    """Connectivity between namespaces (also with Docker's FORWARD DROP on the host), and no route out."""
    rt, spec = cluster
    srv_out, cli_out = job_out / "srv.json", job_out / "cli.json"
    srv = rt.start("ps", _echo_server, {"port": 7000, "path": str(srv_out)})
    cli = rt.start("w1", _echo_client, {"addr": spec.ps.address, "port": 7000, "path": str(cli_out)})
    cli.join(30)
    srv.join(30)
    assert json.loads(cli_out.read_text())["reply"] == "HELLO"
    assert json.loads(srv_out.read_text())["peer"] == spec.node("w1").address
    routes = subprocess.run(["ip", "netns", "exec", rt.handles["w1"].netns, "ip", "route"],
                            capture_output=True, text=True).stdout
    assert "default" not in routes  # no way out of the machine
    counters = rt.counters()
    assert counters["w1"]["up_bytes"] > 0 and counters["ps"]["down_bytes"] > 0


def test_processes_join_cgroup_and_netns(cluster, job_out):
    rt, _ = cluster
    out = job_out / "who.json"
    p = rt.start("w0", _whoami, {"path": str(out)})
    p.join(20)
    info = json.loads(out.read_text())
    assert "edgebed/" + rt.run_id + "/w0" in info["cgroup"]
    assert info["netns_inode"] == os.stat(f"/run/netns/{rt.handles['w0'].netns}").st_ino


def _whoami(path):
    Path(path).write_text(json.dumps({
        "cgroup": Path("/proc/self/cgroup").read_text(),
        "netns_inode": os.stat("/proc/self/ns/net").st_ino,
    }))


@pytest.fixture
def host_forward_drop():
    """The host as Docker leaves it: FORWARD policy DROP (restored afterwards)."""
    pol = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True)
    if pol.returncode != 0:
        pytest.skip("iptables not usable here")
    old = "DROP" if "-P FORWARD DROP" in pol.stdout else "ACCEPT"
    subprocess.run(["iptables", "-P", "FORWARD", "DROP"], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-P", "FORWARD", old], check=True)


def test_connectivity_with_host_forward_drop(host_forward_drop, cluster, job_out):
    """Docker's FORWARD DROP drops a root-namespace bridge's traffic; ours lives in its own namespace."""
    rt, spec = cluster
    srv_out, cli_out = job_out / "srv.json", job_out / "cli.json"
    srv = rt.start("w0", _echo_server, {"port": 7001, "path": str(srv_out)})
    cli = rt.start("w1", _echo_client, {"addr": spec.node("w0").address, "port": 7001, "path": str(cli_out)})
    cli.join(30)
    srv.join(30)
    assert json.loads(cli_out.read_text())["reply"] == "HELLO"


def test_loss_is_measured_where_a_mechanism_exists(clean_host):
    """20% configured loss on an uplink drops 20% of paced UDP datagrams (netem or the eBPF fallback)."""
    from testbed.bench.links import loss_benchmark
    from testbed.kernel.shaping import probe_kernel

    caps = probe_kernel()
    if not (caps.netem or caps.bpf_loss):
        pytest.skip("this kernel has neither sch_netem nor a usable bpf classifier: loss cannot be made")
    res = loss_benchmark("20%", packets=4000, say=lambda s: None)
    assert res["measured"] == pytest.approx(0.20, abs=0.025), res


def test_the_control_network_reaches_the_runner_and_no_other_node(cluster):
    """ctl0: each node reaches the runner's address on the control bridge, never another node
    (its bridge ports are isolated), and it does not go over the node's shaped link."""
    rt, spec = cluster
    ctl = rt.control
    listen = ("import socket, sys, time; s = socket.socket(); s.bind((sys.argv[1], 7100)); s.listen(); "
              "s.settimeout(20); s.accept(); time.sleep(0.2)")
    connect = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 7100), timeout=2); print('ok')\n"
               "except OSError as e:\n    print(type(e).__name__)")
    listeners = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", listen, addr])
                 for ns, addr in ((ctl.netns, "169.254.0.1"), (rt.handles["w1"].netns, ctl.addresses["w1"]))]
    try:
        time.sleep(1.0)
        reach = {addr: subprocess.run(["ip", "netns", "exec", rt.handles["w0"].netns, sys.executable, "-c", connect,
                                       addr], capture_output=True, text=True).stdout.strip()
                 for addr in ("169.254.0.1", ctl.addresses["w1"])}
        assert reach == {"169.254.0.1": "ok", ctl.addresses["w1"]: "TimeoutError"}
        for addr in ("169.254.0.1", ctl.addresses["w1"]):  # over ctl0, not the shaped eth0
            route = subprocess.run(["ip", "-n", rt.handles["w0"].netns, "route", "get", addr],
                                   capture_output=True, text=True).stdout
            assert " dev ctl0 " in route, route
    finally:
        for p in listeners:
            p.kill()
            p.wait()
