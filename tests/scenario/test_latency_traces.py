"""Latency traces: the readers (`ping -D` output, `time,latency` CSVs, a rate trace's latency
column), the bad-input lines, the schedule a node comes up with, the replay's delay changes and
records, and the runner's books when a node replays its own rates (swarm) while the runner
changes its delay: a later change must not set back the rate the node's trace is at."""

from __future__ import annotations

import gzip
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed.kernel.shaping import KernelCaps, plan_direction
from testbed.node.trace_replay import NodeReplay, TraceReplay
from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.runtimes.live import LiveOps
from testbed.runtimes.replay import replays_of, start_replay
from testbed.scenario.latency_traces import read_delay_rows, read_trace_delays
from testbed.scenario.links import Direction
from testbed.scenario.scenario_file import read_scenario_file
from testbed.scenario.schema import ScenarioError
from testbed.scenario.traces import TraceSchedule

from helpers import make_run, needs_root, netns_cluster, write_scenario

PING = """PING 10.0.0.1 (10.0.0.1) 56(84) bytes of data.
[1700000000.000000] 64 bytes from 10.0.0.1: icmp_seq=1 ttl=64 time=40.0 ms
[1700000001.000000] 64 bytes from 10.0.0.1: icmp_seq=2 ttl=64 time=60.2 ms
[1700000002.000000] no answer yet for icmp_seq=3
[1700000003.000000] 64 bytes from 10.0.0.1: icmp_seq=4 ttl=64 time=100 ms

--- 10.0.0.1 ping statistics ---
4 packets transmitted, 3 received, 25% packet loss, time 3004ms
rtt min/avg/max/mdev = 40.0/66.7/100.0/24.9 ms
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# -- readers ------------------------------------------------------------------------------------


def test_ping_output_gives_half_of_each_rtt_from_its_first_reply(tmp_path):
    rows = read_delay_rows(_write(tmp_path, "cell.ping", PING))
    assert rows == [(0.0, 0.020), (1.0, pytest.approx(0.0301)), (3.0, 0.050)]  # the lost ping holds the delay
    gz = tmp_path / "cell.ping.gz"
    gz.write_bytes(gzip.compress(PING.encode()))
    assert read_delay_rows(gz) == rows
    # sampled at 1 s: each reply holds until the next; the last for the mean spacing (1 s)
    assert read_trace_delays(tmp_path / "cell.ping", 1.0) == pytest.approx((0.020, 0.0301, 0.0301, 0.050))


@pytest.mark.parametrize("text, want", [
    ("time,rtt_ms\n0,40\n0.5,80\n", [(0.0, 0.020), (0.5, 0.040)]),  # round trip in ms: halved
    ("time,latency\n0,20ms\n0.5,0.04\n", [(0.0, 0.020), (0.5, 0.040)]),  # one-way: a duration or seconds
    ("time,delay_ms\n0.5,40\n0,20\n", [(0.0, 0.020), (0.5, 0.040)]),  # sorted by time
    ("0,20ms\n1,30ms\n", [(0.0, 0.020), (1.0, 0.030)]),  # no header
])
def test_csv_latency_traces_say_their_unit_and_kind_in_the_header(tmp_path, text, want):
    assert read_delay_rows(_write(tmp_path, "d.csv", text)) == [(t, pytest.approx(d)) for t, d in want]


@pytest.mark.parametrize("name, text, why", [
    ("a.ping", "64 bytes from 10.0.0.1: icmp_seq=1 ttl=64 time=40.0 ms\n", "line 1: a reply without a [timestamp]"),
    ("a.ping", "PING 10.0.0.1\n", "no delays"),
    ("a.csv", "time,latency\n0,fast\n", "line 2 is not `time,latency`"),
    ("a.csv", "time,latency_ms\n0,40000\n", "line 2: a one-way delay outside 0-10 s"),
    ("a.csv", "time,latency\n-1,20ms\n", "line 2: the time is not within"),
])
def test_bad_latency_traces_give_one_line_naming_the_line(tmp_path, name, text, why):
    with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("`", ".")):
        read_delay_rows(_write(tmp_path, name, text))


# -- the scenario: a node comes up at its trace's first delay --------------------------------------


def test_a_profile_wide_ping_trace_gives_each_direction_half_the_rtt(tmp_path):
    _write(tmp_path, "cell.ping", PING)
    path = write_scenario(tmp_path, {"name": "t", "profiles": {"cell": {"bandwidth": "10mbit",
                                                                        "latency_trace": "cell.ping",
                                                                        "trace_resolution": "1s"}},
                                     "workers": [{"count": 1, "profile": "cell"}]})
    sc = parse_scenario(read_scenario_file(path))
    spec = build_cluster(sc, "abc")
    w0 = spec.workers[0]
    assert w0.link.uplink.latency == w0.link.downlink.latency == 0.020  # 40 ms round trip at the start
    assert w0.link.uplink.rate == 10e6
    (r,) = replays_of(spec, sc.seed)
    assert r.node == "w0" and r.schedules == {} and set(r.delays) == {"up", "down"}
    assert r.delays["up"].rates == pytest.approx((0.020, 0.0301, 0.0301, 0.050)) and r.applied_delay["up"] == 0.020


def test_a_rate_trace_s_latency_column_is_replayed_and_a_second_source_is_refused(tmp_path):
    _write(tmp_path, "steps.csv", "time,bandwidth,latency\n0,10mbit,5ms\n1,2mbit,50ms\n")
    _write(tmp_path, "d.csv", "time,latency\n0,20ms\n")
    base = {"name": "t", "workers": [{"count": 1, "profile": "x"}]}
    sc = parse_scenario(read_scenario_file(write_scenario(tmp_path, {
        **base, "profiles": {"x": {"uplink": {"trace": "steps.csv", "trace_resolution": "500ms"}}}})))
    (r,) = replays_of(build_cluster(sc, "abc"), sc.seed)
    assert r.schedules["up"].rates == (10e6, 10e6, 2e6, 2e6) and r.delays["up"].rates == (0.005, 0.005, 0.05, 0.05)
    with pytest.raises(ScenarioError) as e:
        parse_scenario(read_scenario_file(write_scenario(tmp_path, {**base, "profiles": {"x": {"uplink": {
            "trace": "steps.csv", "latency_trace": "d.csv"}}}})))
    assert any(line.startswith("profiles.x.uplink.latency_trace: its trace has a latency column too")
               for line in e.value.lines), e.value.lines


def test_latency_traces_are_checked_and_kept_to_access_links(tmp_path):
    _write(tmp_path, "bad.ping", "PING x\n")
    _write(tmp_path, "d.csv", "time,latency\n0,20ms\n")
    with pytest.raises(ScenarioError) as e:
        parse_scenario(read_scenario_file(write_scenario(tmp_path, {
            "name": "t", "profiles": {"x": {"downlink": {"latency_trace": "bad.ping"}}},
            "links": [{"between": ["w0", "ps"], "forward": {"latency_trace": "d.csv"}}],
            "workers": [{"count": 1, "profile": "x"}]})))
    assert any(line.startswith("profiles.x.downlink.latency_trace:") and "no delays" in line for line in e.value.lines)
    assert any(line.startswith("links[0].forward.latency_trace: traces are replayed on access links only")
               for line in e.value.lines), e.value.lines
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"name": "t", "profiles": {"x": {"latency_trace": "att-lte-driving"}},
                        "workers": [{"count": 1, "profile": "x"}]})
    assert any(line.startswith("profiles.x.latency_trace: att-lte-driving is a rate trace of the catalog")
               for line in e.value.lines), e.value.lines
    outside = tmp_path / "sub"
    outside.mkdir()
    with pytest.raises(ScenarioError) as e:
        read_scenario_file(write_scenario(outside, {"name": "t", "profiles": {"x": {"latency_trace": "../d.csv"}},
                                                    "workers": [{"count": 1, "profile": "x"}]}))
    assert any("latency_trace" in line and "outside the scenario's folder" in line for line in e.value.lines)


# -- the replay: delays change when due, and are recorded --------------------------------------------


def test_replay_changes_a_delay_only_when_it_changes_and_records_both_columns():
    calls, rows = [], []
    n = NodeReplay("w0", {"up": TraceSchedule((1e6, 2e6), 0.1)}, {"up": 1e6},
                   delays={"up": TraceSchedule((0.01, 0.01, 0.05, 0.05), 0.1)}, applied_delay={"up": 0.01})
    replay = TraceReplay([n], lambda node, rates: calls.append(("rate", dict(rates))), lambda *row: rows.append(row),
                         t0=0.0, set_delay=lambda node, which, s: calls.append(("delay", which, s)))
    for k in range(1, 5):
        replay.run_once(k * 0.1)
    assert calls == [("rate", {"up": 2e6}), ("rate", {"up": 1e6}), ("delay", "up", 0.05), ("rate", {"up": 2e6}),
                     ("rate", {"up": 1e6}), ("delay", "up", 0.01)]
    assert rows[2] == (pytest.approx(0.2), "w0", "up", 1e6, pytest.approx(0.2), 0.05)  # the delay's row: rate as it is
    assert rows[0][5] == 0.01  # a rate's row carries the delay in force
    assert replay.counts["changes"] == 6 and replay.counts["failed"] == 0


class FakeIpr:
    def __init__(self):
        self.calls = []

    def tc(self, op, *args, **kw):
        self.calls.append((op, args[0] if args else None, kw.get("rate"), kw.get("delay")))


class Ops(LiveOps):
    """LiveOps over a fake netlink socket and a fake hub, as netns's would be."""

    def __init__(self, caps: KernelCaps):
        super().__init__()
        d = Direction(rate=5e6, latency=0.01)
        link = SimpleNamespace(uplink=d, downlink=d, uplink_peers=[], downlink_peers=[])
        self.caps, self.fabric, self.ipr, self.published = caps, None, FakeIpr(), []
        self.hub = SimpleNamespace(set_delay=lambda node, delays: self.published.append((node, delays)))
        self.handles = {"w0": SimpleNamespace(node=SimpleNamespace(link=link), uplink=plan_direction(d, caps),
                                              downlink=plan_direction(d, caps))}

    def caps_of(self, node):
        return self.caps

    @contextmanager
    def _link_iface(self, node, which):
        yield self.ipr, 7


def test_a_delay_change_keeps_the_rate_a_self_replaying_node_set():
    """swarm: the node changed its rate itself (note_rates keeps the books); the runner's delay
    change then reshapes from that rate, not the one the link came up with."""
    ops = Ops(KernelCaps(htb=True, netem=False, tbf=True, ifb=True))
    ops.note_rates("w0", {"up": 2e6})
    assert ops.ipr.calls == []  # books only
    ops.set_link("w0", "up", {"latency": 0.08})
    assert ops.ipr.calls == [("change-class", "htb", "2000000bit", None)]
    assert ops.handles["w0"].uplink.transport_delay_s == 0.08 and ops.handles["w0"].uplink.rate_bps == 2e6
    assert ops.published[-1] == ("w0", {"up": 0.08, "up_jitter": 0.0, "down": 0.01, "down_jitter": 0.0})


def test_with_netem_a_delay_change_is_netem_changed_in_place():
    ops = Ops(KernelCaps(htb=True, netem=True, tbf=True, ifb=True))
    ops.set_link("w0", "up", {"latency": 0.08})
    assert ops.ipr.calls == [("change-class", "htb", "5000000bit", None), ("change", "netem", None, 80000)]


def test_the_runner_keeps_its_books_for_a_node_that_replays_its_rates_and_sets_its_delays(tmp_path):
    from testbed.records.columns import LINK_RATES_FILE

    _write(tmp_path, "steps.csv", "time,bandwidth,latency\n0,10mbit,5ms\n0.1,2mbit,50ms\n")
    sc = parse_scenario(read_scenario_file(write_scenario(tmp_path, {
        "name": "t", "profiles": {"x": {"trace": "steps.csv"}}, "workers": [{"count": 1, "profile": "x"}]})))
    calls = []

    class Runtime:
        def replay_on_node(self, node, schedules, t0):
            calls.append(("handed", node, sorted(schedules)))
            return True

        def note_rates(self, node, rates):
            calls.append(("noted", node, dict(rates)))

        def set_rates(self, node, rates):
            calls.append(("set_rates", node))

        def set_link(self, node, which, fields):
            calls.append(("set_link", node, which, fields))

    replay = start_replay(Runtime(), build_cluster(sc, "abc"), sc.seed, tmp_path, t0=0.0)
    replay.stop()
    replay.run_once(0.1)
    assert calls[0] == ("handed", "w0", ["down", "up"])
    assert ("noted", "w0", {"up": 2e6, "down": 2e6}) in calls and ("set_rates", "w0") not in calls
    assert {c[2] for c in calls if c[0] == "set_link"} == {"up", "down"}
    assert all(c[3] == {"latency": 0.05} for c in calls if c[0] == "set_link")
    rows = (tmp_path / LINK_RATES_FILE).read_text().splitlines()
    assert rows[0] == "time,node,direction,rate_bps,trace_time,latency_s"
    first = rows[1].split(",")
    assert first[1:3] == ["w0", "down"] and float(first[3]) == 10e6 and float(first[5]) == 0.005


def test_a_reshape_from_the_runner_makes_a_node_s_replay_set_its_rates_again():
    from testbed.node import control
    from testbed.node.supervisor import RoleSupervisor

    reshaped = []
    n = NodeReplay("self", {"up": TraceSchedule((1e6, 2e6), 0.1)}, {"up": 2e6})
    sup = SimpleNamespace(replay=SimpleNamespace(forget_applied=lambda: n.applied.clear()),
                          _own_link=lambda req: SimpleNamespace(reshape=lambda *a: reshaped.append(a) or "up reshaped"))
    assert RoleSupervisor._on_reshape(sup, control.Reshape("up", {}, {})) == "up reshaped"
    assert reshaped and n.applied == {} and n.due(0.1) == {"up": 2e6}


# -- real: the kernel's delay follows the trace ------------------------------------------------------


@needs_root
def test_netns_link_delay_follows_a_latency_trace(tmp_path):
    from testbed.kernel.netlink import ns_iproute

    _write(tmp_path, "d.csv", "time,latency\n0,10ms\n0.1,40ms\n0.2,40ms\n0.3,5ms\n")
    scenario = {"name": "lat", "profiles": {"cell": {"uplink": {"rate": "10mbit",
                                                                "latency_trace": str(tmp_path / "d.csv")}}},
                "workers": [{"count": 1, "profile": "cell"}]}
    with netns_cluster(tmp_path, scenario) as (rt, spec):
        calls = []
        replay = TraceReplay(replays_of(spec, 0), rt.set_rates, lambda *row: None, t0=0.0,
                             set_delay=lambda node, which, s: calls.append(rt.set_link(node, which, {"latency": s})))
        h = rt.handles["w0"]
        seen = [h.uplink.netem.get("delay", h.uplink.transport_delay_s * 1e6)]
        with ns_iproute(h.netns) as ns:
            idx = ns.link_lookup(ifname="eth0")[0]
            before = [(q["handle"], q.get("kind")) for q in ns.get_qdiscs(index=idx)]
            for k in range(1, 5):
                replay.run_once(k * 0.1)
                seen.append(h.uplink.netem.get("delay", h.uplink.transport_delay_s * 1e6))
            assert [(q["handle"], q.get("kind")) for q in ns.get_qdiscs(index=idx)] == before  # nothing rebuilt
            if rt.caps.netem:
                (netem,) = [q for q in ns.get_qdiscs(index=idx) if q.get("kind") == "netem"]
                assert netem.get_attr("TCA_OPTIONS")["delay"] > 0
        assert seen == pytest.approx([10e3, 40e3, 40e3, 5e3, 10e3])  # us; looped at the end
        assert len(calls) == 3  # 40 ms, 5 ms, 10 ms: a change only when the delay changes
        assert h.uplink.rate_bps == 10e6


def test_plot_draws_the_delay_a_trace_set_on_its_own_axis(tmp_path):
    from testbed.records.columns import LINK_RATE_COLUMNS
    from testbed.records.plot_network import link_rates_figure
    from testbed.records.plot_style import style_for
    from testbed.records.reader import load_run
    run = make_run(tmp_path)
    rows = [f"{t / 10},w0,up,,{t / 10},{0.01 * (1 + t % 2)}" for t in range(50)]  # a delay trace alone
    rows += ["0.0,w1,up,5000000,0,", "2.0,w1,up,2000000,2,"]  # a rate trace alone: no delay axis
    (run / "link_rates.csv").write_text(",".join(LINK_RATE_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    rec = load_run(run)
    fig = link_rates_figure(rec, style_for(rec))
    titled = [a for a in fig.axes if a.get_title(loc="left")]
    assert [a.get_title(loc="left") for a in titled] == ["w0 up", "w1 up"]
    delay_axes = [a for a in fig.axes if a.get_ylabel() == "delay (ms)"]
    assert len(delay_axes) == 1
    assert set(delay_axes[0].lines[0].get_ydata()) == {10.0, 20.0}  # ms, as set


def test_the_shipped_5g_round_trips_read_by_name_and_as_files(tmp_path):
    from testbed.scenario.latency_traces import LATENCY_CATALOG, latency_file

    arterial = read_delay_rows(latency_file("cicv5g-arterial-60", "up"))
    assert len(arterial) == 1095 and arterial[0] == (0.0, 0.011)  # the first echo: 22 ms round trip
    assert 60 < arterial[-1][0] < 62 and max(d for _, d in arterial) == 0.134  # 268 ms at worst
    assert set(LATENCY_CATALOG) == {"cicv5g-arterial-60", "cicv5g-urban-30"}
    sc = parse_scenario({"name": "t", "profiles": {"car": {"latency_trace": "cicv5g-urban-30",
                                                           "trace_offset": "random"}},
                         "workers": [{"count": 3, "profile": "car"}]})
    replays = replays_of(build_cluster(sc, "abc"), sc.seed)
    assert len({r.delays["up"].offset for r in replays}) == 3  # 3 cars, not in lockstep
    assert all(len(r.delays["up"].rates) == 2443 for r in replays)  # 244.3 s at 100 ms
    _write(tmp_path, "mine.txt", "pub_time(ms) sub_time(ms) delay(ms) sinr(db)\n1000 1040 40 20\n1100 1130 30 20\n")
    assert read_delay_rows(tmp_path / "mine.txt") == [(0.0, 0.020), (pytest.approx(0.1), 0.015)]
