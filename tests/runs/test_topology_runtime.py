"""Topologies made real (netns runtime): sites, routers and WAN links, per-destination classes, cleanup."""

import json
import subprocess

import pytest
from helpers import REPO, edgebed_cmd, needs_root, our_netns, run_up, write_scenario

pytestmark = [needs_root, pytest.mark.root]


def _root_links(run_id: str) -> list[str]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()
                if run_id in (link.get_attr("IFLA_IFNAME") or "")]


def _docker_or_skip(runtime):
    if runtime == "docker":
        from testbed.runtimes.engine.client import docker_client

        if docker_client(timeout=3) is None:
            pytest.skip("no Docker engine answers (CI starts dockerd)")


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_lan_transfers_stay_off_the_wan_and_wan_transfers_run_at_its_rate(clean_host, runtime):
    """Two sites, 200 Mbit/s LANs, a 20 Mbit/s WAN: measured TCP transfers, both directions. Loose
    bounds (60-105% of the rate: a path shaped by the other link's rate, or not at all, fails); the
    95% +/- 5 points bound is benchmarks/timing_bounds.py --only topology."""
    from testbed.bench.links import topology_benchmark

    _docker_or_skip(runtime)
    res = topology_benchmark(lan="200mbit", wan="20mbit", seconds=3.0, say=lambda s: None, tolerance=0.40,
                             runtime=runtime)
    by = {(r["path"], r["direction"]): r for r in res["results"]}
    for d in ("up", "down"):
        assert 0.6 <= by[("lan", d)]["goodput_ratio"] <= 1.05, by[("lan", d)]
        assert by[("lan", d)]["wan_bytes"] < 1e5  # a transfer inside a site never crosses the WAN
        assert 0.6 <= by[("wan", d)]["goodput_ratio"] <= 1.05, by[("wan", d)]
        # ...and one across sites all does: ~3 s at 20 Mbit/s plus the warm-up (the loose 60% as above)
        assert by[("wan", d)]["wan_bytes"] > 0.6 * 20e6 / 8 * 3
    assert res["ok"], res  # (the per-path bounds above, and a clean teardown)


def test_per_destination_classes_shape_one_peer_apart(clean_host):
    """w0's access link is 40 Mbit/s, but its traffic with w1 is held to 8 Mbit/s (u32 on the address).
    Loose bounds (a class ignored gives 2.5-5x, a wrong one 0.2x); 95% +/- 6 points is
    benchmarks/timing_bounds.py --only peer-classes."""
    from testbed.bench.harness import Bench, measure_transfer
    from testbed.kernel.netlink import in_netns
    from testbed.kernel.shaping import read_htb_class

    scenario = {"name": "bench", "runtime": "netns", "profiles": {"edge": {"bandwidth": "40mbit", "loss": 0.0001}},
                "workers": [{"count": 2, "profile": "edge"}],
                "links": [{"between": ["w0", "w1"], "forward": "8mbit", "reverse": "16mbit"}]}
    bench = Bench({}, "netns", scenario=scenario)
    with bench as (rt, spec):
        w0, w1, ps = spec.node("w0"), spec.node("w1"), spec.node("ps")
        meta = rt.node_meta()
        peers = meta["w0"]["uplink"]["peers"]
        assert [(p["peer"], p["match"], p["rate_bps"]) for p in peers] == [("w1", f"dst {w1.address}", 8e6)]
        assert meta["w1"]["downlink"]["peers"][0]["match"] == f"src {w0.address}"
        to_w1, _ = measure_transfer(bench, w0, w1, 3.0, 1, "pair", lambda: rt.counters()["w0"]["up_bytes"])
        back, _ = measure_transfer(bench, w1, w0, 3.0, 1, "back", lambda: rt.counters()["w1"]["up_bytes"])
        to_ps, _ = measure_transfer(bench, w0, ps, 3.0, 1, "ps", lambda: rt.counters()["w0"]["up_bytes"])
        with in_netns(rt.handles["w0"].netns) as ns:
            assert read_htb_class(ns, ns.link_lookup(ifname="eth0")[0])["rate_bps"] == 40e6
    assert 0.6 <= to_w1 / 8e6 <= 1.05
    assert 0.6 <= back / 16e6 <= 1.05
    assert 0.6 <= to_ps / 40e6 <= 1.05  # the loss filter lets classification go on
    assert bench.problems == []


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_p_network_training_run_records_lan_and_wan(tmp_path, clean_host, runtime):
    """scenarios/topologies/dlion-p-network.yaml trains; w3 (site b) is the WAN's only traffic."""
    import pandas as pd

    _docker_or_skip(runtime)
    run_dir = tmp_path / "run"
    run_up("scenarios/topologies/dlion-p-network.yaml", run_dir, "--runtime", runtime, timeout=400)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] > 10
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["runtime"] == runtime
    assert meta["topology"]["sites"]["b"]["nodes"] == ["w3"]
    assert meta["topology"]["wan"]["a->b"]["rate_bps"] == 100e6
    assert meta["nodes"]["w3"]["site"] == "b" and meta["nodes"]["w3"]["address"].startswith("10.77.1.")
    t = pd.read_csv(run_dir / "traffic.csv")
    last = t.sort_values("time").groupby(["node", "link", "direction"]).bytes.last()
    wan_ba, wan_ab = last[("b", "wan:a", "up")], last[("a", "wan:b", "up")]
    w3_up, w3_down = last[("w3", "access", "up")], last[("w3", "access", "down")]
    assert wan_ba > 1e6 and wan_ab > 1e6
    assert wan_ba == pytest.approx(w3_up, rel=0.02)  # everything w3 sent crossed the WAN (and nothing else)
    assert wan_ab == pytest.approx(w3_down, rel=0.02)
    assert not our_netns() or all(meta["run_id"] not in n for n in our_netns())
    assert _root_links(meta["run_id"]) == []
    p = subprocess.run(edgebed_cmd() + ["plot", str(run_dir)], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    for name in ("topology.png", "wan.png", "traffic.png"):
        assert (run_dir / "plots" / name).stat().st_size > 10_000


@pytest.mark.slow
def test_dlion_peer_to_peer_on_docker_sites(tmp_path, clean_host):
    """DLion on the P-network in containers: workers reach each other directly across the
    sites' switches and the WAN; w3's exchange with site a is the WAN's only training traffic."""
    import pandas as pd
    import yaml

    _docker_or_skip("docker")
    data = yaml.safe_load((REPO / "scenarios" / "topologies" / "dlion-p-network.yaml").read_text())
    data.update(runtime="docker", stop={"seconds": 25},
                algorithm={"name": "dlion", "params": {"total_batch": 64, "link_share": 0.2}})
    path = write_scenario(tmp_path, data)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, timeout=400)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["decentralized"] and summary["best_accuracy"] > 0.5
    peers = pd.read_csv(run_dir / "peers.csv")
    grads = peers[peers.kind == "grad"]
    assert len(set(zip(grads.node, grads.peer))) == 12  # 4 workers, every ordered pair
    wan = grads[(grads.node == "w3") | (grads.peer == "w3")]
    lan = grads[(grads.node != "w3") & (grads.peer != "w3")]
    assert wan.entries.median() < lan.entries.median()  # the 100 Mbit/s WAN carries less than the 1 Gbit/s LAN
    t = pd.read_csv(run_dir / "traffic.csv")
    last = t.sort_values("time").groupby(["node", "link", "direction"]).bytes.last()
    assert last[("b", "wan:a", "up")] == pytest.approx(last[("w3", "access", "up")], rel=0.02)
    assert last[("b", "wan:a", "up")] > 1e6
