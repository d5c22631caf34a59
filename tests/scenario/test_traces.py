"""Recorded link traces: the readers (each format), the shipped library, the bad-input lines, the
offset/loop arithmetic, the replay engine against a fake clock and shaper, and one real netns
check that a node's HTB rate follows its trace tick by tick, in place."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from testbed.node.trace_replay import GilbertElliott, LinkGone, NodeReplay, TraceReplay
from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.runtimes.replay import replays_of
from testbed.scenario.scenario_file import read_scenario_file
from testbed.scenario.schema import ScenarioError
from testbed.scenario.traces import CATALOG, TraceSchedule, node_offset, read_link_trace, read_trace_rates, trace_file

from helpers import make_run, needs_root, netns_cluster, write_scenario


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- readers ------------------------------------------------------------------------------------


def test_mahimahi_binned_at_the_resolution_plain_and_gzipped(tmp_path):
    # 0-99 ms: 3 deliveries, 100-199 ms: 1, 200-299 ms: none (the trickle: as if 1), 400 ms (the end, the period): 2
    text = "\n".join(["0", "5", "99", "150", "400", "400"]) + "\n"
    plain = _write(tmp_path, "a.up", text)
    gz = tmp_path / "b.down.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    for p in (plain, gz):
        rates = read_trace_rates(p, 0.1)
        assert rates == pytest.approx((3 * 12000 / 0.1, 1 * 12000 / 0.1, 12000 / 0.1, 2 * 12000 / 0.1))  # 4 ticks
    assert [r for _, r, _ in read_link_trace(plain)] == [6 * 12000.0]  # read_link_trace keeps per-second bins


def test_csv_and_cooked_steps_are_sampled_at_each_tick(tmp_path):
    csv = _write(tmp_path, "t.csv", "time,bandwidth,latency\n0,10mbit,20ms\n0.25,2mbit\n0.5,4mbit\n")
    assert read_trace_rates(csv, 0.1) == pytest.approx((10e6, 10e6, 10e6, 2e6, 2e6, 4e6, 4e6))
    assert read_link_trace(csv)[0] == (0.0, 10e6, 0.02)
    cooked = _write(tmp_path, "n.mbps", "0.0\t1.5\n1.0\t3.0\n")
    assert read_trace_rates(cooked, 0.5) == pytest.approx((1.5e6, 1.5e6, 3e6, 3e6))


def test_the_library_reads_and_a_catalog_name_picks_each_direction():
    for name in CATALOG:
        up, down = trace_file(name, "up"), trace_file(name, "down")
        assert up.is_file() and down.is_file()
        assert len(read_trace_rates(up)) >= 600  # at least a minute at 100 ms
    assert trace_file("att-lte-driving", "up").name == "ATT-LTE-driving.up.gz"
    assert trace_file("att-lte-driving", "down").name == "ATT-LTE-driving.down.gz"
    assert trace_file("mahimahi/ATT-LTE-driving.up", "down").name == "ATT-LTE-driving.up.gz"  # a path is that file
    down = read_trace_rates(trace_file("att-lte-driving", "down"))
    assert sum(down) / len(down) == pytest.approx(5.17e6, rel=0.01)  # the trace's mean (README)


# -- bad input: one line naming the field ---------------------------------------------------------


def _lines(tmp_path: Path, profile: dict, **extra) -> list[str]:
    path = write_scenario(tmp_path, {"name": "t", "profiles": {"edge": profile},
                                     "workers": [{"count": 1, "profile": "edge"}], **extra})
    with pytest.raises(ScenarioError) as e:
        parse_scenario(read_scenario_file(path))
    return e.value.lines


def test_unknown_catalog_name_suggests_the_closest(tmp_path):
    assert _lines(tmp_path, {"trace": "att-lte-drivng"}) == [
        "profiles.edge.trace: unknown trace 'att-lte-drivng' (closest: att-lte-driving)"]


@pytest.mark.parametrize("name,text,why", [
    ("bad.up", "12\nnot a time\n", "line 2 is not a delivery time in whole milliseconds"),
    ("neg.csv", "time,bandwidth\n0,1mbit\n1,-2mbit\n", "line 3: a negative rate"),
    ("neg.mbps", "0 1.0\n1 -2.0\n", "line 2: a negative rate"),
    ("absurd.csv", "time,bandwidth\n0,1mbit\n1,900gbit\n", "line 3: a rate above 100gbit"),
    ("bin.csv", "time,bandwidth\n0,\x01\x02\n", "line 2 is not `time,bandwidth"),
])
def test_bad_trace_files_give_one_line_naming_the_field(tmp_path, name, text, why):
    _write(tmp_path, name, text)
    lines = _lines(tmp_path, {"uplink": {"trace": name}})
    assert len(lines) == 1 and lines[0].startswith("profiles.edge.uplink.trace: ") and why in lines[0]
    assert "\x01" not in lines[0]  # content is never quoted


def test_a_trace_shorter_than_its_resolution_is_refused(tmp_path):
    _write(tmp_path, "short.mbps", "0 1.0\n0.2 2.0\n")
    lines = _lines(tmp_path, {"downlink": {"trace": "short.mbps", "trace_resolution": "1s"}})
    assert lines == [f"profiles.edge.downlink.trace: {tmp_path / 'short.mbps'}: the trace lasts 0.4 s, "
                     "shorter than its resolution 1 s"]


def test_resolution_bounds_wan_traces_and_outside_files_are_refused(tmp_path):
    assert _lines(tmp_path, {"trace": "norway-bus", "trace_resolution": "5ms"}) == [
        "profiles.edge.trace_resolution: 0.005s is outside 10ms-10s"]
    assert _lines(tmp_path, {"bandwidth": "1mbit"}, wan={"default": {"forward": {"trace": "norway-bus"}}}) == [
        "wan.default.forward.trace: traces are replayed on access links only (a profile's uplink/downlink or trace)"]
    lines = _lines(tmp_path, {"trace": "../outside.csv"})
    assert len(lines) == 1 and lines[0].startswith("profiles.edge.trace: ")
    assert "outside the scenario's folder" in lines[0]


# -- offsets and loops ----------------------------------------------------------------------------


def test_schedule_loops_or_holds_its_last_rate():
    s = TraceSchedule((1.0, 2.0, 3.0), 0.1, loop=True)
    assert [s.rate_at(k * 0.1) for k in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    stop = TraceSchedule((1.0, 2.0, 3.0), 0.1, loop=False)
    assert [stop.rate_at(k * 0.1) for k in range(6)] == [1, 2, 3, 3, 3, 3]
    off = TraceSchedule((1.0, 2.0, 3.0), 0.1, loop=True, offset=0.2)
    assert [off.rate_at(k * 0.1) for k in range(4)] == [3, 1, 2, 3]


def test_random_offsets_are_seeded_per_node_on_the_tick_grid():
    offs = [node_offset("random", 140.0, 7, f"w{i}", 0.1) for i in range(50)]
    assert offs == [node_offset("random", 140.0, 7, f"w{i}", 0.1) for i in range(50)]  # same seed, same offsets
    assert len(set(offs)) >= 45  # 50 devices on one trace are not in lockstep
    assert all(0 <= o < 140 and abs(o / 0.1 - round(o / 0.1)) < 1e-6 for o in offs)
    assert offs != [node_offset("random", 140.0, 8, f"w{i}", 0.1) for i in range(50)]
    assert node_offset(150.0, 140.0, 0, "w0", 0.1) == pytest.approx(10.0)  # seconds wrap into the trace
    assert node_offset(None, 140.0, 0, "w0", 0.1) == 0.0


def test_nodes_come_up_at_their_offsets_first_rate():
    sc = parse_scenario({"name": "t", "seed": 3, "profiles": {"lte": {"trace": "tmobile-lte-short",
                                                                      "trace_offset": "random"}},
                         "workers": [{"count": 4, "profile": "lte"}]})
    spec = build_cluster(sc, "abc")
    replays = {r.node: r for r in replays_of(spec, sc.seed)}
    assert sorted(replays) == ["w0", "w1", "w2", "w3"]  # ps and eval have no trace
    for w in spec.workers:
        r = replays[w.name]
        assert w.link.uplink.rate == r.schedules["up"].rate_at(0.0) == r.applied["up"]
        assert w.link.downlink.rate == r.schedules["down"].rate_at(0.0)
        assert r.schedules["up"].offset == r.schedules["down"].offset  # one clock per node: up and down together
    assert len({r.schedules["up"].offset for r in replays.values()}) == 4


# -- the replay engine ------------------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_replay_sets_both_directions_of_a_node_at_each_tick_and_only_changes():
    calls, rows = [], []
    up = TraceSchedule((1.0, 2.0, 2.0, 4.0), 0.1)
    down = TraceSchedule((10.0, 10.0, 30.0, 40.0), 0.1)
    n = NodeReplay("w0", {"up": up, "down": down}, {"up": 1.0, "down": 10.0})
    replay = TraceReplay([n], lambda node, rates: calls.append((node, dict(rates))),
                         lambda *row: rows.append(row), t0=0.0)
    for k in range(1, 5):
        replay.run_once(k * 0.1)
    assert calls == [("w0", {"up": 2.0}), ("w0", {"down": 30.0}), ("w0", {"up": 4.0, "down": 40.0}),
                     ("w0", {"up": 1.0, "down": 10.0})]  # tick 4 loops to the start
    assert replay.counts == {"ticks": 4, "changes": 6, "failed": 0, "late_ticks": 0, "ended": 0}
    assert rows[0][1:4] == ("w0", "up", 2.0)


def test_replay_loop_follows_its_clock_and_skips_late_ticks():
    clock = FakeClock()
    seen = []
    n = NodeReplay("w0", {"up": TraceSchedule(tuple(float(i) for i in range(100)), 0.1, loop=False)}, {"up": 0.0})
    replay = TraceReplay([n], lambda node, rates: seen.append((round(clock.now - 1000.0, 3), rates["up"])),
                         lambda *row: None, t0=1000.0, clock=clock, sleep=clock.sleep)

    def stop_after(s: float) -> None:
        clock.sleep(s)
        if clock.now - 1000.0 >= 0.5 and not seen[-1:] == [(0.5, 5.0)]:
            return
        if clock.now - 1000.0 > 0.55:
            replay._stop.set()

    calls = 0

    def late_once(node, rates):
        nonlocal calls
        calls += 1
        seen.append((round(clock.now - 1000.0, 3), rates["up"]))
        if calls == 2:
            clock.now += 0.35  # this change took 350 ms: the next ticks are late
        if calls >= 4:
            replay._stop.set()

    replay.set_rates = late_once
    replay._sleep = clock.sleep
    replay._loop()
    assert seen == [(0.1, 1.0), (0.2, 2.0), (0.55, 5.0), (0.6, 6.0)]  # ticks 3, 4 skipped, never a burst
    assert replay.counts["late_ticks"] == 2


def test_a_failing_node_does_not_stop_the_others():
    good = []

    def set_rates(node, rates):
        if node == "bad":
            raise OSError("gone")
        good.append(node)

    sched = TraceSchedule((1.0, 2.0), 0.1)
    replay = TraceReplay([NodeReplay("bad", {"up": sched}), NodeReplay("ok", {"up": sched})], set_rates,
                         lambda *row: None, t0=0.0)
    replay.run_once(0.1)
    assert good == ["ok"] and replay.counts["failed"] == 1 and "bad (0.1 s): OSError: gone" in replay.errors[0]


def test_a_node_whose_link_went_with_it_leaves_the_replay_without_failures():
    calls = []

    def set_rates(node, rates):
        calls.append(node)
        if node == "ended":
            raise LinkGone("ended: its container has ended, and its link with it")

    sched = TraceSchedule((1.0, 2.0, 3.0, 4.0), 0.1)
    replay = TraceReplay([NodeReplay("ended", {"up": sched}), NodeReplay("ok", {"up": sched})], set_rates,
                         lambda *row: None, t0=0.0)
    for k in (1, 2, 3):
        replay.run_once(k * 0.1)
    assert calls == ["ended", "ok", "ok", "ok"]  # tried once, then left alone
    assert replay.counts["failed"] == 0 and replay.counts["ended"] == 1 and replay.errors == []
    assert replay.counts["changes"] == 3


def _docker_runtime_with_one_node(monkeypatch, running: bool, eth0: list[int], host_links: list[int]):
    """A DockerRuntime over fakes: a container that runs or has exited, a namespace with or
    without its eth0, a host with or without the container's veth peer (index 42)."""
    from types import SimpleNamespace

    import pyroute2

    from testbed.kernel.shaping import KernelCaps, plan_direction
    from testbed.runtimes.docker import runtime as docker_rt
    from testbed.runtimes.state import RunState
    from testbed.scenario.links import Direction

    class Ipr(FakeIpr):
        def __init__(self, links):
            super().__init__()
            self.links = links

        def link_lookup(self, **kw):
            return list(self.links)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    from testbed.kernel import netlink

    opened = []  # each socket the runtime opens: (namespace or None for the host's)
    monkeypatch.setattr(netlink, "ns_iproute", lambda name: opened.append(name) or Ipr(eth0))
    monkeypatch.setattr(pyroute2, "IPRoute", lambda: opened.append(None) or Ipr(host_links))
    caps = KernelCaps(htb=True, netem=False, tbf=True, ifb=True, bpf_loss=True)
    rt = docker_rt.DockerRuntime(RunState("t33", os.getpid(), "/nonexistent", ""), client=object(), caps=caps)
    d = Direction(rate=5e6)
    link = SimpleNamespace(uplink=d, downlink=d, uplink_peers=[], downlink_peers=[])
    container = SimpleNamespace(reload=lambda: None, attrs={"State": {"Running": running}})
    rt.handles["w0"] = docker_rt.DockerHandle(SimpleNamespace(name="w0", link=link), "eb-t33-w0", container, 42,
                                              plan_direction(d, caps), plan_direction(d, caps), None, {},
                                              host_ifname="veth0a")
    rt.opened = opened
    return rt


@pytest.mark.parametrize("which", ["up", "down"])
def test_docker_rates_of_an_ended_container_say_its_link_is_gone(monkeypatch, which):
    rt = _docker_runtime_with_one_node(monkeypatch, running=False, eth0=[], host_links=[])
    with pytest.raises(LinkGone, match="w0: its container has ended"):
        rt.set_rates("w0", {which: 2e6})  # was IndexError from link_lookup(...)[0]


def test_docker_rates_of_a_running_container_without_its_interface_fail_by_name(monkeypatch):
    rt = _docker_runtime_with_one_node(monkeypatch, running=True, eth0=[], host_links=[42])
    with pytest.raises(RuntimeError, match="w0: eth0 in its namespace is missing"):
        rt.set_rates("w0", {"up": 2e6})
    rt = _docker_runtime_with_one_node(monkeypatch, running=True, eth0=[7], host_links=[42])
    rt.set_rates("w0", {"up": 2e6, "down": 3e6})
    assert rt.handles["w0"].uplink.rate_bps == 2e6 and rt.handles["w0"].downlink.rate_bps == 3e6


def test_docker_keeps_a_link_s_sockets_open_between_rate_changes(monkeypatch):
    """A trace reshapes a link 10 times a second: one socket a namespace and thread, not one a change."""
    rt = _docker_runtime_with_one_node(monkeypatch, running=True, eth0=[7], host_links=[42])
    for k in range(10):
        rt.set_rates("w0", {"up": 1e6 + k, "down": 2e6 + k})
    assert sorted(rt.opened, key=str) == [None, "eb-t33-w0"]
    rt.sockets.close()
    with pytest.raises(RuntimeError, match="closed"):  # teardown: nothing opens one again
        rt.set_rates("w0", {"up": 1e6})


class FakeIpr:
    def __init__(self):
        self.calls = []

    def tc(self, op, *args, **kw):
        self.calls.append((op, args[0] if args else None, kw.get("rate")))


def test_live_set_rates_changes_the_class_in_place_only():
    from contextlib import contextmanager
    from types import SimpleNamespace

    from testbed.kernel.shaping import KernelCaps, plan_direction
    from testbed.runtimes.live import LiveOps
    from testbed.scenario.links import Direction

    caps = KernelCaps(htb=True, netem=False, tbf=True, ifb=True, bpf_loss=True)
    ipr = FakeIpr()

    class Ops(LiveOps):
        def __init__(self):
            super().__init__()
            d = Direction(rate=5e6, loss=0.01)
            link = SimpleNamespace(uplink=d, downlink=d, uplink_peers=[], downlink_peers=[])
            self.handles = {"w0": SimpleNamespace(node=SimpleNamespace(link=link), uplink=plan_direction(d, caps),
                                                  downlink=plan_direction(d, caps))}

        @contextmanager
        def _link_iface(self, node, which):
            yield ipr, 7

    ops = Ops()
    ops.set_rates("w0", {"up": 2e6, "down": 3e6})
    assert ipr.calls == [("change-class", "htb", "2000000bit"), ("change-class", "htb", "3000000bit")]
    assert ops.handles["w0"].uplink.rate_bps == 2e6 and ops.handles["w0"].uplink.bpf_loss == 0.01
    assert ops._directions("w0")["down"].rate == 3e6


def test_gilbert_elliott_bursts_and_mean_loss():
    ge = GilbertElliott(p=0.05, r=0.25, good_loss=0.0, bad_loss=0.5)
    states = [ge.step() for _ in range(20000)]
    assert sum(states) / len(states) == pytest.approx(ge.mean_loss(), rel=0.1)  # 0.5 * 0.05 / 0.3
    bursts, run = [], 0
    for s in states:
        if s:
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    assert sum(bursts) / len(bursts) == pytest.approx(1 / 0.25, rel=0.15)  # mean bad run = 1/r ticks


# -- real: a node's HTB rate follows its trace tick by tick ---------------------------------------------


@needs_root
def test_netns_htb_rate_follows_the_trace_in_place(tmp_path):
    from testbed.kernel.netlink import ns_iproute
    from testbed.kernel.shaping import qdisc_kinds, read_htb_class

    _write(tmp_path, "steps.csv", "time,bandwidth\n0,10mbit\n0.1,2mbit\n0.2,7mbit\n0.3,1mbit\n")
    scenario = {"name": "trace", "profiles": {"lte": {"uplink": {"trace": str(tmp_path / "steps.csv")},
                                                      "downlink": {"trace": str(tmp_path / "steps.csv"),
                                                                   "trace_offset": "200ms"}}},
                "workers": [{"count": 1, "profile": "lte"}]}
    with netns_cluster(tmp_path, scenario) as (rt, spec):
        replay = TraceReplay(replays_of(spec, 0), rt.set_rates, lambda *row: None, t0=0.0)
        h = rt.handles["w0"]
        with ns_iproute(h.netns) as ns:
            idx = ns.link_lookup(ifname="eth0")[0]
            before = [(q["handle"], q.get("kind")) for q in ns.get_qdiscs(index=idx)]
            seen = [read_htb_class(ns, idx)["rate_bps"]]
            for k in range(1, 5):
                replay.run_once(k * 0.1)
                seen.append(read_htb_class(ns, idx)["rate_bps"])
            assert [(q["handle"], q.get("kind")) for q in ns.get_qdiscs(index=idx)] == before  # never rebuilt
            assert "htb" in qdisc_kinds(ns, idx)
        assert seen == pytest.approx([10e6, 2e6, 7e6, 1e6, 10e6], rel=0.01)  # looped at the end
        with rt._link_iface("w0", "down") as (ipr, ifindex):
            assert read_htb_class(ipr, ifindex)["rate_bps"] == pytest.approx(7e6, rel=0.01)  # offset 200 ms, tick 4


def test_bench_fidelity_metrics():
    from testbed.bench.trace import fidelity, pearson

    trace = [1e6, 2e6, 3e6, 2e6]
    assert fidelity(trace, trace)["mae_fraction"] == 0.0 and pearson(trace, trace) == pytest.approx(1.0)
    f = fidelity(trace, [1.1e6, 2.1e6, 3.1e6, 2.1e6])  # 0.1 Mbit/s off everywhere, on a 2 Mbit/s mean
    assert f["mae_fraction"] == pytest.approx(0.05) and f["pearson"] == pytest.approx(1.0)
    assert pearson(trace, [3e6, 2e6, 1e6, 2e6]) == pytest.approx(-1.0)


def test_plot_shows_configured_beside_measured_per_traced_link(tmp_path):
    from testbed.records.columns import LINK_RATE_COLUMNS
    from testbed.records.plot_network import link_rates_figure
    from testbed.records.plot_style import style_for
    from testbed.records.plotting import plot_run
    from testbed.records.reader import load_run
    run = make_run(tmp_path)
    rows = [(t / 10, "w0", "up", 1e6 * (1 + t % 3), t / 10) for t in range(0, 400)]
    rows += [(0.0, "w1", "down", 5e6, 3.0), (20.0, "w1", "down", 2e6, 23.0)]
    (run / "link_rates.csv").write_text(",".join(LINK_RATE_COLUMNS) + "\n" +
                                        "".join(",".join(map(str, r)) + "\n" for r in rows))
    assert "link_rates.png" in [p.name for p in plot_run(run)]
    rec = load_run(run)
    fig = link_rates_figure(rec, style_for(rec))
    axes = fig.axes
    assert [a.get_title(loc="left") for a in axes] == ["w0 up", "w1 down"]
    configured = axes[1].lines[0].get_ydata()
    assert list(configured[:2]) == [5.0, 2.0]  # Mbit/s, as set
    assert len(axes[0].lines) == 2  # configured and measured (traffic.csv) on the same panel


def test_burst_loss_switches_the_links_loss_on_state_changes_only():
    sc = parse_scenario({"name": "t", "seed": 1, "profiles": {"lossy": {"uplink": {
        "burst_loss": {"p": 0.2, "r": 0.5, "good_loss": 0.0, "bad_loss": 0.3}}}},
        "workers": [{"count": 1, "profile": "lossy"}]})
    (n,) = replays_of(build_cluster(sc, "abc"), sc.seed)
    assert n.node == "w0" and n.schedules == {} and set(n.losses) == {"up"}
    n.applied_loss["up"] = 0.0
    calls = []
    replay = TraceReplay([n], lambda *a: None, lambda *row: None, t0=0.0,
                         set_loss=lambda node, which, p: calls.append((node, which, p)))
    for k in range(1, 201):
        replay.run_once(k * 0.1)
    assert calls and all(c[:2] == ("w0", "up") and c[2] in (0.0, 0.3) for c in calls)
    assert all(a[2] != b[2] for a, b in zip(calls, calls[1:]))  # a call per change of state, none in between
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"name": "t", "profiles": {"x": {"uplink": {"burst_loss": {"p": 0.2, "r": 0}}}},
                        "workers": [{"count": 1, "profile": "x"}]})
    assert any("burst_loss.r" in line for line in e.value.lines)


# -- swarm: the node replays its own schedules ---------------------------------------------------------


def test_schedules_travel_to_a_node_and_bad_ones_are_refused():
    from testbed.node import control
    from testbed.node.trace_replay import schedules_from_wire, schedules_to_wire

    scheds = {"up": TraceSchedule((1e6, 2.5e6), 0.1, loop=False, offset=0.1), "down": TraceSchedule((3e6,), 0.2)}
    wire = schedules_to_wire(scheds)
    assert schedules_from_wire(wire) == scheds
    req = control.parse_request({"op": "replay", "schedules": wire, "t0": 12.5})
    assert isinstance(req, control.Replay) and req.t0 == 12.5
    for bad, field in (({"up": {"rates": [-1], "resolution": 0.1}}, "schedules.up.rates"),
                       ({"up": {"rates": [1e6], "resolution": 0.001}}, "schedules.up.resolution"),
                       ({"up": {"rates": [1e6], "resolution": 0.1, "offset": 5}}, "schedules.up.offset"),
                       ({"sideways": {}}, "schedules: keys")):
        with pytest.raises(ValueError, match=field):
            schedules_from_wire(bad)


def test_the_supervisor_keeps_the_clock_and_changes_its_own_link():
    import time
    from types import SimpleNamespace

    from testbed.node import control
    from testbed.node.supervisor import RoleSupervisor
    from testbed.node.trace_replay import schedules_to_wire

    applied = []
    link = SimpleNamespace(set_rates=lambda rates: applied.append(dict(rates)))
    sup = SimpleNamespace(replay=None, _own_link=lambda req: link)
    wire = schedules_to_wire({"up": TraceSchedule((1e6, 2e6, 3e6), 0.02), "down": TraceSchedule((5e6, 6e6), 0.02)})
    detail = RoleSupervisor._on_replay(sup, control.Replay(wire, time.time()))
    try:
        assert detail == "replaying down, up every 0.02 s"
        deadline = time.time() + 3
        while len(applied) < 4 and time.time() < deadline:
            time.sleep(0.01)
    finally:
        sup.replay.stop()
    assert applied[0] == {"up": 2e6, "down": 6e6}  # tick 1: both directions from one clock reading
    assert all(set(a) <= {"up", "down"} for a in applied) and len(applied) >= 4


def test_start_replay_lets_a_self_replaying_node_change_its_own_link(tmp_path):
    from testbed.records.columns import LINK_RATES_FILE
    from testbed.runtimes.replay import start_replay

    sc = parse_scenario({"name": "t", "profiles": {"lte": {"trace": "verizon-lte-short"}},
                         "workers": [{"count": 2, "profile": "lte"}]})
    spec = build_cluster(sc, "abc")
    handed, changed, noted = {}, [], []

    class Runtime:
        def replay_on_node(self, node, schedules, t0):
            handed[node] = schedules
            return node == "w0"  # as swarm would for every node; w1 left to the runner's clock

        def set_rates(self, node, rates):
            changed.append(node)

        def note_rates(self, node, rates):
            noted.append(node)

    replay = start_replay(Runtime(), spec, sc.seed, tmp_path, t0=0.0)
    try:
        replay.stop()
        replay.run_once(0.1)
    finally:
        replay.stop()
    assert set(handed) == {"w0", "w1"} and len(handed["w0"]["up"]["rates"]) == 1400
    assert changed and set(changed) == {"w1"}  # w0 changes its own link
    assert noted and set(noted) == {"w0"}  # and the runner's books follow it
    rows = (tmp_path / LINK_RATES_FILE).read_text().splitlines()
    assert rows[0] == "time,node,direction,rate_bps,trace_time,latency_s"
    assert {r.split(",")[1] for r in rows[1:]} == {"w0", "w1"}
