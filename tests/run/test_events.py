"""A link event's trace (run/events.py LinkTraces): replayed through the run's trace replay at the
trace's resolution from the event's time, in place of the direction's earlier trace, until an
event sets the rate; on a runtime whose nodes replay themselves, handed to the node again."""

import time
from pathlib import Path

import pytest

from testbed.node.trace_replay import schedules_from_wire
from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.run.events import Events
from testbed.run.monitor import LiveState
from testbed.run.timeline import event_trace_tick, expand_events
from testbed.runtimes.replay import start_replay
from testbed.scenario.schema import ScenarioError

FRAME = 1500 * 8
# deliveries per 100 ms in the trace below: ten ticks of one second, each at its own rate
PER_TICK = [10, 2, 30, 5, 0, 20, 8, 1, 40, 12]


def _mahimahi(path: Path) -> Path:
    ms = sorted(t * 100 + j * (100 // max(n, 1)) % 100 for t, n in enumerate(PER_TICK) for j in range(n))
    ms[-1] = 999  # the trace lasts a whole second
    path.write_text("\n".join(str(m) for m in ms) + "\n")
    return path


class Runtime:
    """What the replay and the timeline call on a runtime, written down."""

    def __init__(self, self_replaying: bool = False):
        self.rates: list[tuple[str, dict]] = []
        self.changes: list[tuple[str, str, dict]] = []
        self.handed: list[tuple[str, dict]] = []
        self.self_replaying = self_replaying
        self.hub = None

    def set_rates(self, node, rates):
        self.rates.append((node, dict(rates)))

    def note_rates(self, node, rates):
        self.rates.append((node, dict(rates)))

    def set_link(self, node, which, fields):
        self.changes.append((node, which, fields))
        return "set"

    def apply_change(self, action, node, fields):
        self.changes.append((node, action, fields))
        return "changed"

    def replay_on_node(self, node, schedules, t0):
        self.handed.append((node, schedules))
        return self.self_replaying


def _run(tmp_path, events, profile=None, runtime=None, now=None):
    """The run's pieces, its clock `now` s after the nodes' start (the first event's time)."""
    sc = parse_scenario({"name": "t", "profiles": {"edge": profile or {"bandwidth": "10mbit"}},
                         "workers": [{"count": 2, "profile": "edge"}], "events": events})
    spec = build_cluster(sc, "abc")
    rt = runtime or Runtime()
    replay = start_replay(rt, spec, sc.seed, tmp_path, 0.0, event_trace_tick(sc))
    ev = Events(rt, spec, {}, lambda node: None, LiveState(), tmp_path, lambda line: None, replay=replay,
                seed=sc.seed)
    ev.t0 = time.time() - (now if now is not None else sc.events[0].at)  # as Events.start sets it
    return sc, rt, replay, ev


def _tick_rates(rt, replay, node, which, times):
    """The rate set for `which` of `node` at each of `times` (None: not changed at that tick)."""
    out = []
    for t in times:
        rt.rates.clear()
        replay.run_once(t)
        out.append(next((r[which] for n, r in rt.rates if n == node and which in r), None))
    return out


def test_an_events_trace_steps_every_100ms_from_the_events_time(tmp_path):
    trace = _mahimahi(tmp_path / "lte.up")
    sc, rt, replay, ev = _run(tmp_path, [{"at": "5s", "target": "w1", "action": "link", "direction": "up",
                                          "trace": str(trace)}])
    changes = expand_events(sc)
    assert [(c.time, c.node, c.fields) for c in changes] == [(5.0, "w1", {"direction": "up", "trace": str(trace)})]
    assert replay.tick == 0.1 and replay.nodes == []  # nothing traced before the event
    assert "up follows the trace from 5.0 s, every 0.1 s" in ev.apply(changes[0])
    assert rt.rates == [("w1", {"up": PER_TICK[0] * FRAME / 0.1})]  # the first tick's rate at once
    got = _tick_rates(rt, replay, "w1", "up", [5.0 + 0.1 * k for k in range(1, 10)])
    # each 100 ms its own rate (an empty tick: one frame a tick), where a per-second binning held one
    assert got == [max(n, 1) * FRAME / 0.1 for n in PER_TICK[1:]]
    assert _tick_rates(rt, replay, "w1", "up", [6.0]) == [PER_TICK[0] * FRAME / 0.1]  # it loops
    assert not any(n == "w0" for n, _ in rt.rates)


def test_an_event_applied_late_starts_where_the_trace_is_by_then(tmp_path):
    trace = _mahimahi(tmp_path / "lte.up")
    sc, rt, replay, ev = _run(tmp_path, [{"at": 2, "target": "w0", "action": "link", "direction": "up",
                                          "trace": str(trace)}], now=2.35)
    ev.apply(expand_events(sc)[0])  # the timeline came 0.35 s late (a busy host)
    assert rt.rates == [("w0", {"up": PER_TICK[3] * FRAME / 0.1})]
    assert _tick_rates(rt, replay, "w0", "up", [2.4, 2.5]) == [max(PER_TICK[4], 1) * FRAME / 0.1,
                                                                PER_TICK[5] * FRAME / 0.1]


def test_an_events_trace_settings_are_a_directions(tmp_path):
    trace = _mahimahi(tmp_path / "lte.up")
    sc, rt, replay, ev = _run(tmp_path, [{"at": 2, "target": "w0", "action": "link", "direction": "up",
                                          "trace": str(trace), "trace_resolution": "200ms", "trace_loop": False,
                                          "trace_offset": "0.4s"}])
    assert replay.tick == pytest.approx(0.2)
    ev.apply(expand_events(sc)[0])
    per_200ms = [(PER_TICK[k] + PER_TICK[k + 1]) * FRAME / 0.2 for k in range(0, 10, 2)]
    assert rt.rates == [("w0", {"up": per_200ms[2]})]  # from 0.4 s into the trace
    got = _tick_rates(rt, replay, "w0", "up", [2.0, 2.2, 2.4, 2.6, 3.0, 4.0])
    # at its end it holds its last rate (no change made)
    assert got == [None, per_200ms[3], per_200ms[4], None, None, None]


def test_an_events_trace_replaces_the_profiles_and_a_rate_ends_it(tmp_path):
    trace = _mahimahi(tmp_path / "lte.up")
    events = [{"at": 2, "target": "w0", "action": "link", "direction": "up", "trace": str(trace)},
              {"at": 4, "target": "w0", "action": "link", "rate": "3mbit"}]
    sc, rt, replay, ev = _run(tmp_path, events, profile={"trace": "verizon-lte-short"})
    profile_up = replay.node("w0").schedules["up"]
    first, rate_event = expand_events(sc)
    ev.apply(first)
    assert replay.node("w0").schedules["up"] is not profile_up
    assert rt.rates[-1][0] == "w0" and rt.rates[-1][1]["up"] == PER_TICK[0] * FRAME / 0.1
    assert _tick_rates(rt, replay, "w0", "up", [2.1, 2.2]) == [PER_TICK[1] * FRAME / 0.1, PER_TICK[2] * FRAME / 0.1]
    assert replay.node("w1").schedules["up"] is not None  # the other node's profile trace goes on
    said = ev.apply(rate_event)
    assert said.startswith("up+down trace ended; ") and rt.changes[-1] == ("w0", "link", rate_event.fields)
    rt.rates.clear()
    for t in (4.0, 4.1, 4.2):
        replay.run_once(t)
    assert not any(n == "w0" for n, _ in rt.rates)  # the rate given holds
    assert any(n == "w1" for n, _ in rt.rates)


def test_a_self_replaying_node_is_handed_the_events_trace(tmp_path):
    trace = _mahimahi(tmp_path / "lte.up")
    events = [{"at": 7, "target": "w0", "action": "link", "direction": "up", "trace": str(trace)},
              {"at": 9, "target": "w0", "action": "link", "direction": "up", "rate": "3mbit"}]
    sc, rt, replay, ev = _run(tmp_path, events, runtime=Runtime(self_replaying=True))
    follow, rate_event = expand_events(sc)
    ev.apply(follow)
    node, wire = rt.handed[-1]
    assert node == "w0" and set(wire) == {"up"} and wire["up"]["offset"] == pytest.approx(-7.0)
    sched = schedules_from_wire(wire)["up"]  # what the node checks and replays, by the run's clock
    assert [sched.rate_at(7.0 + 0.1 * k) for k in range(10)] == [max(n, 1) * FRAME / 0.1 for n in PER_TICK]
    assert rt.rates == [("w0", {"up": PER_TICK[0] * FRAME / 0.1})]  # the runner's books, at once
    ev.apply(rate_event)
    assert rt.handed[-1] == ("w0", {})  # the node's replay stops
    with pytest.raises(ValueError, match="offset"):
        schedules_from_wire({"up": {**wire["up"], "offset": -400 * 86400.0}})


def test_trace_settings_apply_only_with_a_trace(tmp_path):
    trace = _mahimahi(tmp_path / "lte.up")
    for ev, msg in (
            ({"at": 1, "target": "w0", "action": "link", "rate": "1mbit", "trace_resolution": "50ms"},
             "events[0]: trace_resolution apply only to a link event with a trace"),
            ({"at": 1, "target": "w0", "action": "link", "trace": str(trace), "trace_resolution": "2s"},
             "events[0].trace: "),
            ({"at": 1, "target": "w0", "action": "link", "rate": "1mbit", "latency_trace": "cicv5g-urban-30"},
             "events[0]: latency_trace belong to a profile's link")):
        with pytest.raises(ScenarioError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            _run(tmp_path, [ev])
