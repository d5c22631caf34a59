"""Workers that come and go (availability): the seeded on/off model, traces of online
intervals, their validation, and the timeline changes they become."""

from __future__ import annotations

import pytest

from testbed.plan import parse_scenario
from testbed.plan.availability import model_offline, plan_offline, read_trace, trace_offline
from testbed.run.timeline import expand_events
from testbed.scenario.checks import ScenarioError
from testbed.scenario.document import Availability
from testbed.scenario.scenario_file import read_scenario_file


def _sc(availability, workers=None, seconds=600, **extra):
    return parse_scenario({"workers": workers or [{"count": 3}], "stop": {"seconds": seconds},
                           "availability": availability, **extra})


def _lines(data) -> list[str]:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(data)
    return e.value.lines


def test_the_model_is_seeded_per_worker_and_offline_for_its_share_of_the_time():
    entry = Availability(online="60s", offline="20s")
    a = model_offline(entry, "w0", 1, 200_000.0)
    assert a == model_offline(entry, "w0", 1, 200_000.0)  # the same seed, the same plan
    assert a != model_offline(entry, "w1", 1, 200_000.0) and a != model_offline(entry, "w0", 2, 200_000.0)
    off = sum(e - s for s, e in a)
    assert off / 200_000.0 == pytest.approx(20 / 80, abs=0.02)
    assert sum(e - s for s, e in a) / len(a) == pytest.approx(20.0, rel=0.1)  # mean offline stretch
    assert all(0 <= s < e <= 200_000.0 for s, e in a) and all(x[1] < y[0] for x, y in zip(a, a[1:]))
    first = model_offline(Availability(online="60s", offline="20s", start="online"), "w0", 1, 1000.0)
    assert first[0][0] > 0  # starts online


def test_a_trace_s_gaps_are_the_offline_intervals(tmp_path):
    f = tmp_path / "avail.csv"
    f.write_text("node,start,end\nw0,0,30\nw0,50,80\nw1,10,600\n\n")
    trace = read_trace(f)
    assert trace == {"w0": [(0.0, 30.0), (50.0, 80.0)], "w1": [(10.0, 600.0)]}
    assert trace_offline(trace["w0"], 100.0) == [(30.0, 50.0), (80.0, 100.0)]
    assert trace_offline(trace["w1"], 100.0) == [(0.0, 10.0)]
    sc = _sc([{"target": "workers", "trace": str(f)}], seconds=100)
    assert plan_offline(sc) == {"w0": [(30.0, 50.0), (80.0, 100.0)], "w1": [(0.0, 10.0)]}  # w2: always online


@pytest.mark.parametrize("text, why", [
    ("device,start,end\nw0,0,1\n", "line 1: the header must be node,start,end"),
    ("node,start,end\nw0,0\n", "line 2: not 3 fields"),
    ("node,start,end\nW 0,0,1\n", "line 2: not a node name"),
    ("node,start,end\nw0,zero,1\n", "line 2: start and end are not numbers"),
    ("node,start,end\nw0,5,5\n", "line 2: not 0 <= start < end"),
    ("node,start,end\nw0,nan,5\n", "line 2: not 0 <= start < end"),
    ("node,start,end\nw0,0,10\nw0,5,20\n", "w0's online intervals overlap"),
])
def test_a_bad_trace_is_one_line_naming_the_field_and_line(tmp_path, text, why):
    f = tmp_path / "avail.csv"
    f.write_text(text)
    line, = _lines({"workers": [{"count": 2}], "availability": [{"trace": str(f)}]})
    assert line.startswith("availability[0].trace: ") and why in line
    assert "W 0" not in line and "zero" not in line  # the file's text is never quoted


def test_what_the_entries_may_not_be():
    assert _lines({"availability": [{"online": "60s"}]}) == [
        "availability[0]: give the model's online and offline (mean seconds), or a trace"]
    assert "not both" in _lines({"availability": [{"online": "1m", "offline": "1m", "trace": "x.csv"}]})[0]
    assert "at least 1s" in _lines({"availability": [{"online": "0.5s", "offline": "1m"}]})[0]
    line, = _lines({"availability": [{"target": "ps", "online": "1m", "offline": "1m"}]})
    assert line == "availability[0].target: 'ps' names no worker, worker group or 'workers'"
    line, = _lines({"availability": [{"online": "1m", "offline": "1m"}, {"target": "w1", "online": "1m",
                                                                          "offline": "1m"}]})
    assert line == "availability[1].target: w1 is in availability[0] too"
    line, = _lines({"workers": [{"count": 3}], "stop": {"seconds": 86400},  # about 43,200 each
                    "availability": [{"online": "1s", "offline": "1s"}]})
    assert line.startswith("availability: ") and "more than 100000" in line


def test_a_trace_naming_a_node_outside_its_target(tmp_path):
    f = tmp_path / "avail.csv"
    f.write_text("node,start,end\nw0,0,10\nw5,0,10\n")
    line, = _lines({"workers": [{"count": 2}], "availability": [{"trace": str(f)}]})
    assert line == "availability[0].trace: names w5, not a worker of 'workers'"


def test_offline_becomes_a_cut_and_a_freeze_then_a_heal_and_a_thaw(tmp_path):
    f = tmp_path / "avail.csv"
    f.write_text("node,start,end\nw1,0,20\nw1,35,600\n")
    sc = _sc([{"target": "workers", "trace": str(f)}], workers=[{"count": 2}], seconds=100)
    changes = [c for c in expand_events(sc) if c.node == "w1"]
    assert [(c.time, c.action) for c in changes] == [(20.0, "partition"), (20.0, "pause"), (35.0, "heal"),
                                                      (35.0, "resume")]
    assert changes[0].fields == {"peers": ["ps", "eval", "w0"]} and changes[2].fields == {"peers": []}
    assert changes[0].source == "availability: offline"
    assert [c for c in expand_events(sc) if c.node == "w0"] == []


def test_a_stopped_trainer_is_killed_offline_and_started_again_online(tmp_path):
    f = tmp_path / "avail.csv"
    f.write_text("node,start,end\nw1,0,20\nw1,35,600\n")
    sc = _sc([{"target": "w1", "trace": str(f), "while_offline": "stop"}, {"target": "w0", "online": "1m",
              "offline": "1m"}], workers=[{"count": 2}], seconds=100)
    changes = [c for c in expand_events(sc) if c.node == "w1"]
    assert [(c.time, c.action) for c in changes] == [(20.0, "kill"), (20.0, "partition"), (35.0, "heal"),
                                                      (35.0, "restart")]
    assert {c.action for c in expand_events(sc) if c.node == "w0"} <= {"partition", "pause", "heal", "resume"}
    assert "while_offline" in _lines({"availability": [{"online": "1m", "offline": "1m", "while_offline": "nap"}]})[0]


def test_a_relative_trace_is_read_from_the_scenario_s_folder(tmp_path):
    (tmp_path / "avail.csv").write_text("node,start,end\nw0,0,10\n")
    path = tmp_path / "sc.yaml"
    path.write_text("workers: [{count: 1}]\navailability: [{trace: avail.csv}]\n")
    data = read_scenario_file(path)
    assert data["availability"][0]["trace"] == str((tmp_path / "avail.csv").resolve())
    outside = tmp_path / "sub"
    outside.mkdir()
    (outside / "sc.yaml").write_text("workers: [{count: 1}]\navailability: [{trace: ../avail.csv}]\n")
    with pytest.raises(ScenarioError) as e:
        read_scenario_file(outside / "sc.yaml")
    assert e.value.lines[0].startswith("availability[0].trace: ")
    assert "outside the scenario's folder" in e.value.lines[0]


# --- a daily cycle, FedScale's traces, time_scale ------------------------------------------------


def _online_at(offline: list[tuple[float, float]], t: float) -> bool:
    return not any(s <= t < e for s, e in offline)


def test_a_daily_cycle_puts_more_workers_online_around_its_peak():
    """cycle 1000 s, peak at 250 s, amplitude 0.8: over 300 workers and 20 days, the share online
    near the peak (250 s into each day) is well above the share near the trough (750 s)."""
    entry = Availability(online="60s", offline="60s", cycle="1000s", cycle_peak="250s", cycle_amplitude=0.8)
    plans = [model_offline(entry, f"w{i}", 1, 20_000.0) for i in range(300)]
    share = {phase: sum(_online_at(p, day * 1000 + phase) for p in plans for day in range(1, 20)) / (300 * 19)
             for phase in (250.0, 750.0)}
    assert share[250.0] > 0.8 and share[750.0] < 0.2, share
    flat = [model_offline(Availability(online="60s", offline="60s"), f"w{i}", 1, 20_000.0) for i in range(300)]
    flat_share = [sum(_online_at(p, day * 1000 + phase) for p in flat for day in range(1, 20)) / (300 * 19)
                  for phase in (250.0, 750.0)]
    assert all(abs(x - 0.5) < 0.05 for x in flat_share), flat_share


def test_a_cycle_belongs_to_the_model():
    line, = _lines({"availability": [{"trace": "x.csv", "cycle": "1h"}]})
    assert line.startswith("availability[0]: cycle: ")
    assert "at least 10s" in _lines({"availability": [{"online": "1m", "offline": "1m", "cycle": "5s"}]})[0]


def _fedscale(tmp_path, data) -> str:
    import pickle

    f = tmp_path / "client_behave_trace"
    f.write_bytes(pickle.dumps(data))
    return str(f)


def test_a_fedscale_trace_maps_clients_to_workers_repeats_and_scales(tmp_path):
    path = _fedscale(tmp_path, {
        1: {"active": [0], "inactive": [100], "finish_time": 100, "duration": 100, "model": "x"},
        2: {"active": [10, 60], "inactive": [30, 80], "finish_time": 100, "duration": 40, "model": "x"},
        3: {"active": [50], "inactive": [100], "finish_time": 200, "duration": 50, "model": "x"}})
    sc = _sc([{"target": "workers", "trace": path, "trace_format": "fedscale", "first_client": 2,
               "time_scale": 0.5}], workers=[{"count": 2}], seconds=120)
    # w0 is client 2 (online 10-30 and 60-80 every 100 trace seconds), w1 client 3; run s = trace s / 2
    assert plan_offline(sc) == {"w0": [(0.0, 5.0), (15.0, 30.0), (40.0, 55.0), (65.0, 80.0), (90.0, 105.0),
                                       (115.0, 120.0)],
                                "w1": [(0.0, 25.0), (50.0, 120.0)]}


@pytest.mark.parametrize("data, why", [
    ({1: {"active": [0], "inactive": [10], "finish_time": 10}}, "no client 2"),
    ({2: {"active": [0, 5], "inactive": [10], "finish_time": 10}}, "differ in length"),
    ({2: {"active": ["0"], "inactive": [10], "finish_time": 10}}, "not active/inactive lists"),
    ([1, 2], "a dict of clients")])
def test_a_bad_fedscale_trace_is_one_line(tmp_path, data, why):
    path = _fedscale(tmp_path, data)
    line, = _lines({"workers": [{"count": 1}], "availability": [{"trace": path, "trace_format": "fedscale",
                                                                  "first_client": 2}]})
    assert line.startswith("availability[0].trace: ") and why in line, line


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/edgebed-pickle-ran",))


def test_a_fedscale_trace_cannot_run_code(tmp_path):
    import os
    import pickle

    if os.path.exists("/tmp/edgebed-pickle-ran"):
        os.remove("/tmp/edgebed-pickle-ran")
    f = tmp_path / "client_behave_trace"
    f.write_bytes(pickle.dumps({1: {"active": [0], "inactive": [10], "finish_time": 10, "model": _Boom()}}))
    line, = _lines({"workers": [{"count": 1}], "availability": [{"trace": str(f), "trace_format": "fedscale"}]})
    assert "not loaded" in line and not os.path.exists("/tmp/edgebed-pickle-ran")


def _flash(tmp_path, users: dict) -> str:
    """FLASH's state_traces.json: {uid: {"guid", "model", "messages": "stamp<TAB>state" lines}}."""
    import json

    f = tmp_path / "state_traces.json"
    f.write_text(json.dumps({uid: {"guid": f"g{uid}", "model": "x", "messages": "\n".join(lines) + "\n"}
                             for uid, lines in users.items()}))
    return str(f)


FLASH_USERS = {
    "5": ["2020-01-02 00:00:00\tscreen_on", "2020-01-02 00:00:10\tbattery_charged_on", "2020-01-02 00:00:20\twifi",
          "2020-01-02 00:00:30\tscreen_lock", "2020-01-02 00:00:50\tscreen_unlock", "2020-01-02 00:01:00\t80%",
          "2020-01-02 00:01:10\tscreen_lock", "2020-01-02 00:01:20\t4g", "2020-01-02 00:01:40\tscreen_on"],
    # its trace starts 100 s after FLASH's reference and repeats every 80 s, on the reference's clock
    "6": ["2020-01-02 00:01:40\tbattery_charged_on", "2020-01-02 00:01:45\twifi", "2020-01-02 00:01:50\tscreen_lock",
          "2020-01-02 00:02:30\tbattery_charged_off", "2020-01-02 00:03:00\tscreen_unlock"],
    "7": ["2020-01-02 00:00:00\twifi", "yesterday\tscreen_lock"]}  # FLASH cannot read it: never ready


def test_a_flash_trace_is_online_while_locked_on_wifi_and_charging(tmp_path):
    path = _flash(tmp_path, FLASH_USERS)
    sc = _sc([{"target": "workers", "trace": path, "trace_format": "flash", "first_client": 5}], seconds=200)
    assert plan_offline(sc) == {"w0": [(0.0, 30.0), (50.0, 70.0), (80.0, 130.0), (150.0, 170.0), (180.0, 200.0)],
                                "w1": [(0.0, 30.0), (70.0, 110.0), (150.0, 190.0)],
                                "w2": [(0.0, 200.0)]}
    half = _sc([{"target": "w0", "trace": path, "trace_format": "flash", "first_client": 5, "time_scale": 0.5}],
               seconds=40)
    assert plan_offline(half) == {"w0": [(0.0, 15.0), (25.0, 35.0)]}


@pytest.mark.parametrize("users, why", [
    ({"5": ["2020-01-02 00:00:00\tairplane_mode"]}, "user 5: a state FLASH does not know"),
    ({"4": ["2020-01-02 00:00:00\twifi"]}, "no user 5 with messages")])
def test_a_bad_flash_trace_is_one_line(tmp_path, users, why):
    path = _flash(tmp_path, users)
    line, = _lines({"workers": [{"count": 1}], "availability": [{"trace": path, "trace_format": "flash",
                                                                  "first_client": 5}]})
    assert line.startswith("availability[0].trace: ") and why in line, line
    (tmp_path / "state_traces.json").write_text("[1, 2]")
    line, = _lines({"workers": [{"count": 1}], "availability": [{"trace": path, "trace_format": "flash"}]})
    assert "a JSON object of users" in line
