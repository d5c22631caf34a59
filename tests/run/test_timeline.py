"""The scenario timeline: event schema, expansion (targets, traces) and the engine's timing on a fake clock."""

from pathlib import Path

import pytest

from testbed.plan import parse_scenario
from testbed.run.timeline import Change, Timeline, expand_events
from testbed.scenario.schema import ScenarioError
from testbed.scenario.traces import read_link_trace


def _sc(events, **kw):
    return parse_scenario({"name": "t", "workers": [{"count": 2}, {"count": 2, "name": "slow"}], "events": events,
                           **kw})


def test_event_schema_errors_name_the_field():
    bad = [
        ({"at": "5s", "target": "w0", "action": "link"}, "events[0]: a link event needs"),
        ({"at": 1, "at_step": 3, "target": "w0", "action": "kill"}, "exactly one of 'at'"),
        ({"target": "w0", "action": "kill"}, "exactly one of 'at'"),
        ({"at": 1, "target": "w0", "action": "cpu"}, "a cpu event needs cpus"),
        ({"at": 1, "target": "w0", "action": "kill", "rate": "1mbit"}, "rate do not apply to a kill event"),
        ({"at": 1, "target": "w0", "action": "link", "rate": "-5mbit"}, "events[0].rate: '-5mbit' is not a rate"),
        ({"at": 1, "target": "w0", "action": "explode"}, "events[0].action"),
        ({"at": 1, "target": "w9", "action": "kill"}, "events[0].target: 'w9' is no node"),
        ({"at": 1, "target": "w0", "action": "link", "trace": "/nonexistent.csv"}, "events[0].trace"),
    ]
    for ev, msg in bad:
        with pytest.raises(ScenarioError, match=msg.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
            _sc([ev])


def test_targets_expand_to_nodes_in_due_order():
    sc = _sc([{"at": "10s", "target": "slow", "action": "cpu", "cpus": 0.1},
              {"at": "2s", "target": "workers", "action": "link", "direction": "up", "rate": "2mbit"},
              {"at_step": 50, "target": "ps", "action": "pause"},
              {"at": 3, "target": "w1", "action": "kill"}])
    changes = expand_events(sc)
    assert [(c.time, c.step, c.node, c.action) for c in changes] == [
        (2.0, None, "slow0", "link"), (2.0, None, "slow1", "link"), (2.0, None, "w0", "link"),
        (2.0, None, "w1", "link"), (3.0, None, "w1", "kill"), (10.0, None, "slow0", "cpu"),
        (10.0, None, "slow1", "cpu"), (None, 50, "ps", "pause")]
    assert changes[0].fields == {"direction": "up", "rate": 2e6}
    assert changes[0].describe() == "direction=up rate=2mbit"


def test_link_traces_csv_and_mahimahi(tmp_path: Path):
    csv = tmp_path / "t.csv"
    csv.write_text("time,bandwidth,latency\n0,10mbit,20ms\n5,2mbit,\n2.5,5000000,40ms\n")
    assert read_link_trace(csv) == [(0.0, 10e6, 0.02), (2.5, 5e6, 0.04), (5.0, 2e6, None)]
    mahi = tmp_path / "lte.up"
    # second 0: 100 delivery opportunities (1.2 Mbit/s), second 1: none (an outage), second 2: 10
    mahi.write_text("\n".join([str(i * 10) for i in range(100)] + [str(2000 + i) for i in range(10)]) + "\n")
    rows = read_link_trace(mahi)
    # the outage: 1 frame/s
    assert rows == [(0.0, 100 * 1500 * 8, None), (1.0, 1500 * 8, None), (2.0, 10 * 1500 * 8, None)]
    sc = _sc([{"at": "10s", "target": "w0", "action": "link", "direction": "down", "trace": str(csv)}])
    # one change: the trace is replayed from then on (run/events.py), not a change per row
    assert [(c.time, c.node, c.fields) for c in expand_events(sc)] == [
        (10.0, "w0", {"direction": "down", "trace": str(csv)})]
    with pytest.raises(ValueError, match="line 2"):
        bad = tmp_path / "bad.csv"
        bad.write_text("time,bandwidth\n1,-3mbit\n")
        read_link_trace(bad)


def test_relative_trace_paths_are_the_scenario_files(tmp_path: Path):
    from testbed.plan import load_scenario

    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "x.csv").write_text("0,1mbit\n")
    (tmp_path / "s.yaml").write_text("name: s\nevents:\n  - {at: 1, target: w0, action: link, trace: traces/x.csv}\n")
    sc = load_scenario(tmp_path / "s.yaml")
    assert sc.events[0].trace == str((tmp_path / "traces" / "x.csv").resolve())


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_engine_applies_each_change_when_due_on_a_fake_clock():
    clock = FakeClock()
    applied, recorded = [], []
    step = {"v": 0}
    changes = [Change(5.0, None, "w0", "link", {"rate": 1e6}), Change(1.5, None, "w1", "kill"),
               Change(None, 20, "w1", "restart"), Change(5.0, None, "w2", "cpu", {"cpus": 0.1})]
    tl = Timeline(changes, apply=lambda c: applied.append((clock() - 1000.0, c.node)) or "ok",
                  record=lambda c, at, d: recorded.append((c.node, c.action, at, c.time, d)),
                  t0=1000.0, step=lambda: step["v"], clock=clock, sleep=clock.sleep)
    for _ in range(400):  # the engine's own loop, one iteration at a time
        tl.run_once()
        if clock() - 1000.0 > 10 and step["v"] < 20:
            step["v"] = 25  # training reaches step 25 at t = 10 s
        wait = min([c.time for c in tl.timed] + [clock() - 1000.0 + tl.poll]) - (clock() - 1000.0)
        clock.sleep(max(wait, 0.0) or tl.poll)
        if not tl.pending():
            break
    assert [n for _, n in applied] == ["w1", "w0", "w2", "w1"]
    times = [t for t, _ in applied]
    assert times[0] == pytest.approx(1.5) and times[1] == pytest.approx(5.0) and times[2] == pytest.approx(5.0)
    assert 10.0 < times[3] <= 10.0 + 2 * tl.poll  # a step-triggered change within a poll of the step
    assert recorded[0][:4] == ("w1", "kill", pytest.approx(1.5), 1.5) and recorded[-1][3] is None


def test_engine_keeps_going_after_a_failed_change():
    clock = FakeClock()
    recorded = []

    def apply(c):
        if c.node == "w0":
            raise RuntimeError("no such link")
        return "done"

    tl = Timeline([Change(0.0, None, "w0", "link", {}, "events[0]"), Change(0.0, None, "w1", "cpu")], apply,
                  lambda c, at, d: recorded.append((c.node, d)), t0=1000.0, clock=clock, sleep=clock.sleep)
    tl.run_once()
    assert recorded == [("w0", "FAILED: RuntimeError: no such link"), ("w1", "done")]
    assert tl.errors == ["events[0] (link w0): no such link"]


def test_engine_thread_applies_within_100ms_of_schedule():
    """The real thread on the wall clock: each change lands on time (loosely: a loaded 2-core CI
    machine may delay a thread; 100 ms is benchmarks/timing_bounds.py --only timeline)."""
    import time

    t0 = time.time()
    got = []
    changes = [Change(t, None, f"w{i}", "cpu", {"cpus": 1.0}) for i, t in enumerate((0.2, 0.5, 0.9))]
    tl = Timeline(changes, apply=lambda c: "ok", record=lambda c, at, d: got.append((c.time, at)), t0=t0)
    tl.start()
    deadline = time.time() + 5
    while len(got) < 3 and time.time() < deadline:
        time.sleep(0.05)
    tl.stop()
    assert len(got) == 3
    for scheduled, applied in got:
        assert 0 <= applied - scheduled < 0.5, got


def test_shipped_trace_loads():
    """scenarios/traces/lte-synthetic.up (Mahimahi format): 30 one-second rows, a 2 s outage."""
    from helpers import REPO

    rows = read_link_trace(REPO / "scenarios" / "traces" / "lte-synthetic.up")
    assert len(rows) == 30 and [t for t, _, _ in rows] == [float(i) for i in range(30)]
    assert rows[12][1] == rows[13][1] == 12000.0  # the outage: a trickle of one frame a second (traces.trickle)
    assert all(1e6 <= r <= 25e6 for t, r, _ in rows if t not in (12.0, 13.0))


def test_partition_events_resolve_peers():
    sc = _sc([{"at": 1, "target": "slow", "action": "partition", "peers": ["ps", "w"]},
              {"at": 2, "target": "slow0", "action": "heal"}])
    changes = expand_events(sc)
    assert [(c.node, c.fields["peers"]) for c in changes] == [
        ("slow0", ["ps", "w0", "w1"]), ("slow1", ["ps", "w0", "w1"]), ("slow0", [])]
    with pytest.raises(ScenarioError, match="needs peers"):
        _sc([{"at": 1, "target": "w0", "action": "partition"}])
    with pytest.raises(ScenarioError, match=r"events\[0\].peers: 'nobody'"):
        _sc([{"at": 1, "target": "w0", "action": "partition", "peers": ["nobody"]}])
    with pytest.raises(ScenarioError, match="peers do not apply to a kill event"):
        _sc([{"at": 1, "target": "w0", "action": "kill", "peers": ["ps"]}])


def test_soak_faults_are_seeded_and_each_is_undone_within_its_minute():
    from testbed.bench.soak import UNDO, soak_events, soak_scenario
    from testbed.plan import parse_scenario

    a, b = soak_events(30, 4, seed=1, base_rate="50mbit", base_cpus=0.25), soak_events(30, 4, 1, "50mbit", 0.25)
    assert a == b and a != soak_events(30, 4, 2, "50mbit", 0.25)
    assert len(a) == 2 * 29
    for fault, undo in zip(a[::2], a[1::2]):
        start, end = float(fault["at"][:-1]), float(undo["at"][:-1])
        minute = int(start // 60)
        assert minute >= 1 and start < end < 60 * (minute + 1)  # undone before the next fault
        assert undo["action"] == UNDO[fault["action"]] and undo["target"] == fault["target"]
    sc = parse_scenario(soak_scenario(30, 4, 1, "netns", "bsp"))
    assert len(sc.events) == 58 and sc.stop.seconds == 1800


def test_wan_link_targets():
    import yaml

    from testbed.plan import load_scenario
    from testbed.scenario.schema import resolve_target

    from helpers import REPO

    data = yaml.safe_load((REPO / "scenarios/topologies/dlion-p-network.yaml").read_text())
    sc = load_scenario(REPO / "scenarios/topologies/dlion-p-network.yaml")
    assert resolve_target(sc, "wan:a-b") == ["wan:a-b"] and resolve_target(sc, "wan:b-a") == ["wan:b-a"]
    assert resolve_target(sc, "wan:a-c") == [] and resolve_target(sc, "wan:a-a") == []
    ok = parse_scenario({**data, "events": [{"at": "5s", "target": "wan:a-b", "action": "link", "rate": "5mbit",
                                             "direction": "up"}]})
    (change,) = expand_events(ok)
    assert change.node == "wan:a-b" and change.fields == {"direction": "up", "rate": 5e6}
    with pytest.raises(ScenarioError) as e:
        parse_scenario({**data, "events": [{"at": "5s", "target": "wan:a-b", "action": "kill"}]})
    assert "events[0].action: a WAN link (wan:a-b) takes link events only" in str(e.value)
    with pytest.raises(ScenarioError) as e:
        parse_scenario({**data, "events": [{"at": "5s", "target": "wan:a-x", "action": "link", "rate": "1mbit"}]})
    assert "events[0].target: 'wan:a-x' is no node" in str(e.value)


@pytest.mark.parametrize("req,needle", [
    ({"node": "w0", "action": "stress", "fields": {"load": 1e7}}, "less than or equal to 64"),
    ({"action": "kill", "fields": {}}, "not a request"),
    ([1, 2], "not a request"),
    ({"node": "w0", "action": "explode", "fields": {}}, "action"),
    ({"node": "w0", "action": "link", "fields": {"direction": "both", "rate": 1e30}}, "above the most"),
])
def test_control_requests_are_checked_as_events_are(req, needle):
    from testbed.run.timeline import request_change

    with pytest.raises(ValueError, match=needle):
        request_change(req, "r1")
    ok = request_change({"node": "w0", "action": "link", "fields": {"direction": "up", "rate": 2e6}}, "r1")
    assert (ok.node, ok.action, ok.fields) == ("w0", "link", {"direction": "up", "rate": 2e6})


def test_a_bad_request_file_is_refused_and_recorded_not_fatal(tmp_path):
    (tmp_path / "1-bad.json").write_text('{"action": "kill"}')
    (tmp_path / "2-good.json").write_text('{"node": "w1", "action": "kill", "fields": {}}')
    applied, recorded = [], []
    tl = Timeline([], lambda c: applied.append((c.node, c.action)) or "done",
                  lambda c, at, detail: recorded.append((c.action, detail)), t0=0.0, clock=lambda: 1.0,
                  control_dir=tmp_path)
    tl.run_once()
    assert applied == [("w1", "kill")]
    assert recorded[0][0] == "refused" and "REFUSED: 1-bad.json: not a request" in recorded[0][1]
    assert not list(tmp_path.glob("*.json"))


def test_a_request_says_who_asked_whatever_source_it_names(tmp_path):
    """A node's request is recorded as that node's (the hub let in only its requests for itself),
    its own words after its name; a request file is the command line's: neither can pass for a
    scenario event, an availability change or the other."""
    (tmp_path / "1-x.json").write_text('{"node": "w1", "action": "kill", "fields": {}, "source": "events[0]"}')
    inbox = [{"id": "c1", "node": "w0", "action": "pause", "fields": {}, "source": "command line (1-x)"},
             {"id": "c2", "node": "w1", "action": "pause", "fields": {},
              "source": "availability: offline\n" + "x" * 500},
             {"id": "c3", "node": "w2", "action": "kill", "fields": {}, "source": "crash after push at step 3 (p=0.1)"},
             {"id": "c4", "node": "w3", "action": "kill", "fields": {}}]
    recorded = []
    tl = Timeline([], lambda c: "done", lambda c, at, detail: recorded.append(c.source), t0=0.0, clock=lambda: 1.0,
                  control_dir=tmp_path, inbox=lambda: inbox)
    tl.run_once()
    assert recorded[0] == "command line (1-x)"
    assert recorded[1] == "asked by w0: command line (1-x)"
    assert recorded[2].startswith("asked by w1: availability: offline?xxx") and len(recorded[2]) <= 100
    assert recorded[3] == "asked by w2: crash after push at step 3 (p=0.1)"
    assert recorded[4] == "asked by w3"
