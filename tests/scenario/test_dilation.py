"""Virtual time (scenario.dilation): the scenario as the wall runs it, k times slower, and what
stays the world's."""

import pytest
from pydantic import BaseModel

from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.records.virtual import Virtual
from testbed.scenario.checks import ScenarioError, validate_schema
from testbed.scenario.dilation import DilationError, factor, mark_of, wall_scenario
from testbed.scenario.schema import Scenario
from testbed.scenario.traces import TraceSchedule

WORLD = {
    "profiles": {"edge": {"bandwidth": "10mbit", "latency": "20ms", "jitter": "2ms", "loss": "1%", "cpus": 0.5,
                          "cpu_period": "50ms", "stress": {"cpu": 0.2}},
                 "traced": {"trace": "norway-bus", "trace_resolution": "200ms", "trace_offset": 3}},
    "workers": [{"count": 2, "profile": "edge"}, {"count": 1, "profile": "traced", "name": "t"}],
    "stop": {"seconds": 60, "steps": 100},
    "faults": {"worker_timeout": "10s"},
    "events": [{"at": 5, "target": "w0", "action": "link", "rate": "5mbit", "latency": "30ms"},
               {"at": 7, "target": "w1", "action": "cpu", "cpus": 0.4}],
    "availability": [{"target": "w1", "online": 30, "offline": 10, "cycle": 100, "cycle_peak": 20}],
    "workload": {"eval_seconds": 2, "batch_size": 32},
    "algorithm": {"name": "fedavg", "params": {"deadline_s": 4, "clients": 2}},
}


def test_every_time_the_world_states_is_k_times_as_long_and_every_rate_k_times_smaller():
    sc = parse_scenario(WORLD)
    w = wall_scenario(sc, 4)
    edge = w.profiles["edge"]
    assert (edge.bandwidth, edge.latency, edge.jitter) == (pytest.approx(2.5e6), pytest.approx(0.08),
                                                         pytest.approx(0.008))
    assert (edge.cpus, edge.stress.cpu) == (pytest.approx(0.125), pytest.approx(0.05))
    assert (w.stop.seconds, w.faults.worker_timeout, w.workload.eval_seconds) == (240, 40, 8)
    assert (w.events[0].at, w.events[0].rate, w.events[0].latency) == (20, pytest.approx(1.25e6), pytest.approx(0.12))
    assert w.events[1].cpus == pytest.approx(0.1)
    a = w.availability[0]
    assert (a.online, a.offline, a.cycle, a.cycle_peak, a.time_scale) == (120, 40, 400, 80, 4)
    assert w.algorithm.params == {"deadline_s": 16, "clients": 2}
    assert factor(w) == 4
    # what is not a quantity of the world stays as stated
    assert edge.cpu_period == pytest.approx(0.2)  # 50 ms x 4: a period holds the world's CPU time
    assert (edge.loss, w.stop.steps, w.workload.batch_size, w.seed) == (0.01, 100, 32, 0)
    traced = w.profiles["traced"]
    assert (traced.trace_resolution, traced.trace_offset) == (0.2, 3)  # its replay schedule dilates instead
    assert sc.profiles["edge"].bandwidth == 10e6 and sc.stop.seconds == 60  # the world's scenario untouched


def test_k_1_is_the_scenario_itself():
    sc = parse_scenario(WORLD)
    assert wall_scenario(sc, 1).model_dump() == sc.model_dump()


def test_a_factor_outside_1_to_64_is_refused():
    with pytest.raises(DilationError, match="dilation: 0.5 is outside 1-64"):
        wall_scenario(parse_scenario({}), 0.5)
    with pytest.raises(ScenarioError, match="dilation"):
        validate_schema({"dilation": 100})
    assert validate_schema({"dilation": "auto"}).dilation == "auto"


def test_a_quotas_period_stretches_with_it_up_to_the_kernels_second():
    sc = parse_scenario({"profiles": {"tiny": {"cpus": 0.02}}, "workers": [{"count": 1, "profile": "tiny"}]})
    tiny = wall_scenario(sc, 4).profiles["tiny"]
    assert (tiny.cpus, tiny.cpu_period) == (pytest.approx(0.005), pytest.approx(0.4))  # 2 ms a period, as at k 1
    assert wall_scenario(sc, 20).profiles["tiny"].cpu_period == 1.0
    with pytest.raises(DilationError, match=r"^profiles\.tiny\.cpus: under dilation 40, .*kernel's 1ms"):
        wall_scenario(sc, 40)  # 0.0005 cores over the longest period: under the kernel's floor
    assert sc.profiles["tiny"].cpu_period is None


def test_a_command_workload_is_refused_under_dilation_in_one_line():
    with pytest.raises(ScenarioError, match="dilation: a command workload's programs keep their own clocks"):
        validate_schema({"dilation": 2, "workload": {"command": {"worker": "{python} -c pass"}}})
    validate_schema({"dilation": 1, "workload": {"command": {"worker": "{python} -c pass"}}})


# Fields that hold a time or a rate of something other than the emulated world: each says why.
NOT_THE_WORLDS = {
    ("Profile", "cpu_period"): "scaled with its quota (scenario.dilation.wall_period)",
    ("Direction", "trace_resolution"): "the trace's own clock: its replay schedule dilates",
    ("Direction", "trace_offset"): "the trace's own clock",
    ("Profile", "trace_resolution"): "the trace's own clock",
    ("Profile", "trace_offset"): "the trace's own clock",
    ("Event", "trace_resolution"): "the trace's own clock",
    ("Event", "trace_offset"): "the trace's own clock",
    ("Scenario", "dilation"): "the factor itself",
    ("Speed", "cores"): "a count: the device's step time dilates where it is planned (run.devices)",
    ("Device", "cores"): "a count: as Speed's",
    ("Speed", "gflops"): "dilated where it is planned: the device's step time x k (run.devices)",
    ("Device", "gflops"): "as Speed's",
    ("Accelerator", "peak_tflops"): "a device's: its whole step time dilates where it is planned (run.devices)",
    ("Accelerator", "memory_gbps"): "as peak_tflops",
    ("Accelerator", "overhead_ms"): "as peak_tflops",
}
TIME_WORDS = ("second", "seconds", "timeout", "latency", "jitter", "rate", "cores", "period", "deadline", "time",
              "flops", "_ms", "bps")


def _models(model: type, seen: set) -> list[type]:
    if model in seen:
        return []
    seen.add(model)
    out = [model]
    for info in model.model_fields.values():
        for arg in _args(info.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _models(arg, seen)
    return out


def _args(annotation) -> list:
    from typing import get_args

    args = list(get_args(annotation))
    return [annotation] + [a for arg in args for a in _args(arg)]


def test_every_field_that_reads_as_a_time_or_rate_is_marked_or_says_why_not():
    """A new field with 'seconds', 'latency', 'rate', ... in its name or description must carry
    a Virtual mark (or be listed above with its reason): else a dilated run would keep it on the
    wall's clock, silently."""
    unmarked = []
    for model in _models(Scenario, set()):
        for name, info in model.model_fields.items():
            text = f"{name} {info.description or ''}".lower()
            numeric = any(a in (float, int) for a in _args(info.annotation))
            if not numeric or mark_of(info) is not None or (model.__name__, name) in NOT_THE_WORLDS:
                continue
            if any(w in name.lower() for w in TIME_WORDS) or "seconds" in text or "per second" in text:
                unmarked.append(f"{model.__name__}.{name}")
    assert unmarked == []


def test_the_marks_are_kinds_of_time_or_rate():
    with pytest.raises(ValueError, match="'time' or 'rate'"):
        Virtual("bytes")


def test_a_trace_replays_k_times_slower_at_a_kth_of_its_rates():
    s = TraceSchedule((8e6, 4e6, 2e6), 0.1, True, 0.1)
    d = s.dilated(4, 1 / 4)
    assert d.resolution == pytest.approx(0.4) and d.offset == pytest.approx(0.4)
    assert d.rates == (2e6, 1e6, 5e5)
    for wall in (0.0, 0.35, 0.45, 0.9, 1.3):  # at wall t the world is at t / k
        assert d.rate_at(wall) == pytest.approx(s.rate_at(wall / 4) / 4)
        assert d.trace_time(wall) / 4 == pytest.approx(s.trace_time(wall / 4))
    delays = TraceSchedule((0.01, 0.03), 0.1).dilated(2, 2)
    assert delays.rates == (0.02, 0.06) and delays.resolution == 0.2


def test_the_plan_brings_a_traced_link_up_at_its_dilated_start_rate():
    sc = parse_scenario(WORLD)
    plain = build_cluster(wall_scenario(sc, 1), "abc123")
    slow = build_cluster(wall_scenario(sc, 4), "abc123")
    assert slow.dilation == 4 and plain.dilation == 1
    up = plain.node("t0").link.uplink.rate
    assert slow.node("t0").link.uplink.rate == pytest.approx(up / 4)
    assert slow.node("w0").link.uplink.rate == pytest.approx(2.5e6)
    assert slow.node("w0").link.uplink.latency == pytest.approx(0.08)
