"""`dilation: auto` and what a dilated run does with its factor (run.dilation, run.devices, the
timeline's requests, the streams, the outcome line)."""

import pytest

from testbed.errors import HostCannot
from testbed.plan import parse_scenario
from testbed.records.fidelity import Interval
from testbed.run import dilation as rd

SMOKE_LIKE = {"profiles": {"dc": {"cpus": 0.5}, "fast": {"cpus": 0.3}, "slow": {"cpus": 0.2}},
              "ps": {"profile": "dc"}, "evaluator": {"profile": "dc"},
              "workers": [{"count": 2, "profile": "fast"}, {"count": 2, "profile": "slow"}], "dilation": "auto"}


def no_step():
    raise AssertionError("no device: nothing to time")


def test_auto_picks_the_least_half_step_that_fits_the_host():
    sc = parse_scenario(SMOKE_LIKE)
    said = []
    # 2.0 cores promised + the runner's 0.2 + 6 nodes' share: 2.203 / (0.8 x 2) = 1.38 -> 1.5
    assert rd.choose_dilation(sc, said.append, cores=2, step=no_step).dilation == 1.5
    assert said == ["dilation: auto chose k = 1.5 (the world asks 2.20 cores; this host has 2, 80% for the nodes)"]
    assert rd.choose_dilation(sc, said.append, cores=16, step=no_step).dilation == 1.0
    given = parse_scenario({**SMOKE_LIKE, "dilation": 3})
    assert rd.choose_dilation(given, said.append, cores=2, step=no_step) is given


def test_a_device_asks_its_step_cpu_over_its_step_time():
    sc = parse_scenario({"profiles": {"pi": {"device": "raspberry-pi-4"}}, "ps": {"profile": {"cpus": 0.5}},
                         "evaluator": {"profile": {"cpus": 0.5}}, "workers": [{"count": 3, "profile": "pi"}]})
    # the Pi 4's 7.2 GFLOP/s: a 7.2e7-FLOP step takes it 10 ms; this host's takes 20 ms of CPU: 2 cores each
    calls = []

    def step():
        calls.append(1)
        return {"cpu_s_median": 0.02, "flops_per_step": 7.2e7}

    assert rd.node_demand(sc, "w0", step) == pytest.approx(2.0)
    assert rd.world_demand(sc, step) == pytest.approx(3 * 2.0 + 1.0 + 0.2 + 5 * 0.0005)
    assert rd.least_factor(7.2025, 2) == 5.0  # 7.2025 / 1.6 = 4.5016: the next half step up
    calls.clear()
    chosen = rd.choose_dilation(sc.model_copy(update={"dilation": "auto"}), lambda s: None, cores=2, step=step)
    assert chosen.dilation == 5.0 and len(calls) == 1  # the host is timed once for every device


def test_a_node_promised_nothing_asks_a_core():
    sc = parse_scenario({"workers": [{"count": 2}]})
    assert rd.world_demand(sc, no_step) == pytest.approx(4 * 1.0 + 0.2 + 4 * 0.0005)


def test_a_world_past_64_is_refused_in_one_line():
    sc = parse_scenario({"profiles": {"big": {"cpus": 64}}, "workers": [{"count": 4, "profile": "big"}],
                         "dilation": "auto"})
    with pytest.raises(HostCannot, match=r"^dilation: auto: the world asks 258\.2 cores and this host has 2: k "):
        rd.choose_dilation(sc, lambda s: None, cores=2, step=no_step)


def iv(name, start, got, wait, verdict="faithful", promised=0.5):
    return Interval("node", name, start, start + 0.5, got, promised, wait, verdict)


def test_enough_is_what_the_nodes_ran_and_waited_for_against_the_host():
    # k 2, two nodes: each ran 0.5 world cores (0.25 wall) and waited 0.1 of the interval: 0.7 wall cores
    ivs = [iv(n, t / 2, 0.5, 0.1) for n in ("a", "b") for t in range(20)]
    out = rd.enough_dilation(ivs, 2.0, 2)
    assert out["host_cores_wanted"] == pytest.approx(0.7)
    assert out["enough"] == 1.0 and out["verdict"] == "enough"  # 2 x 0.7 / 1.6 = 0.875
    busy = [iv(n, t / 2, 1.6, 0.3) for n in ("a", "b") for t in range(20)]  # 0.8 + 0.3 each: 2.2 wall cores
    out = rd.enough_dilation(busy, 2.0, 2)
    assert out["enough"] == 3.0 and out["verdict"] == "not enough: k 3 would have been"  # 2 x 2.2 / 1.6 = 2.75
    start = [iv("a", 0.0, 9.0, 1.0, verdict="startup")] + ivs
    assert rd.enough_dilation(start, 2.0, 2)["host_cores_wanted"] == pytest.approx(0.7)
    assert rd.enough_dilation(ivs, 2.0, None)["enough"] is None


def test_a_request_states_the_worlds_rate_and_delay():
    from testbed.run.timeline import request_change

    req = {"node": "w0", "action": "link", "fields": {"direction": "up", "rate": "8mbit", "latency": "10ms",
                                                      "loss": 0.01}}
    change = request_change(req, "r1", dilation=4.0)
    assert change.fields == {"direction": "up", "rate": pytest.approx(2e6), "latency": pytest.approx(0.04),
                             "loss": 0.01}
    assert request_change(req, "r1").fields["rate"] == "8mbit"  # k 1: as asked (the runtime parses it)
    cpu = request_change({"node": "w0", "action": "cpu", "fields": {"cpus": 0.5}}, "r2", dilation=2.0)
    assert cpu.fields == {"cpus": 0.25}


def test_an_event_trace_is_replayed_k_times_slower(tmp_path):
    from testbed.plan.cluster import build_cluster
    from testbed.run.events import Events
    from testbed.run.monitor import LiveState
    from testbed.run.timeline import event_trace_tick, expand_events
    from testbed.runtimes.replay import start_replay
    from testbed.scenario.dilation import wall_scenario

    trace = tmp_path / "t.csv"
    trace.write_text("time,bandwidth\n0,8mbit\n0.1,4mbit\n0.2,2mbit\n")
    world = parse_scenario({"workers": [{"count": 1}],
                            "events": [{"at": 1, "target": "w0", "action": "link", "direction": "up",
                                        "trace": str(trace)}]})
    sc = wall_scenario(world, 2)
    spec = build_cluster(sc, "abc")
    set_rates = []

    class Runtime:
        hub = None

        def set_rates(self, node, rates):
            set_rates.append(rates["up"])

        def replay_on_node(self, node, schedules, t0):
            return False

    replay = start_replay(Runtime(), spec, sc.seed, tmp_path, 0.0, event_trace_tick(sc))
    assert replay.tick == pytest.approx(0.2)  # 100 ms of the world
    ev = Events(Runtime(), spec, {}, lambda node: None, LiveState(), tmp_path, lambda line: None, replay=replay,
                seed=sc.seed)
    change = expand_events(sc)[0]
    assert change.time == 2.0  # the world's 1 s
    assert "every 0.2 s" in ev.traces.follow("w0", change.fields, at=2.0, now=2.0)  # the run's, built dilated
    for t in (2.2, 2.4, 2.6):
        replay.run_once(t)
    assert set_rates == [pytest.approx(4e6), pytest.approx(2e6), pytest.approx(1e6), pytest.approx(4e6)]


def test_a_devices_step_is_k_times_as_long_on_the_wall():
    from testbed.run import devices as run_devices
    from testbed.scenario.devices import catalog as cat

    def cal():
        return run_devices.Calibration(node="w0", host="h1", device="raspberry-pi-4", gflops_per_core=1.8, cores=4,
                                       model="m", flops_per_step=7.2e8, step_s=[0.05] * 5, cpu_s=[0.05] * 5,
                                       host_cpus=2)

    speed = cat.builtin()["raspberry-pi-4"].speed
    plain, slow = run_devices.plan_quota(cal(), speed), run_devices.plan_quota(cal(), speed, dilation=4)
    assert plain.target_step_s == pytest.approx(0.1) and slow.target_step_s == pytest.approx(0.4)
    assert slow.quota_cores == pytest.approx(plain.quota_cores / 4)
    assert slow.extra["world_step_s"] == pytest.approx(0.1) and "world_step_s" not in plain.extra
    assert run_devices.shortfall_line(slow) is None


def test_a_stream_is_produced_k_times_slower_and_batched_at_the_worlds_rate():
    from testbed.data.streaming.buffer import StreamBatch, StreamBuffer
    from testbed.data.streaming.consumer import StreamFeeder
    from testbed.data.streaming.rates import RateSchedule
    from testbed.node.roles.broker import wall_schedule

    assert wall_schedule({"times": [0.0, 10.0], "rates": [8.0, 16.0]}, 4) == {"times": [0.0, 40.0],
                                                                             "rates": [2.0, 4.0]}
    import time

    schedule = RateSchedule([0.0, 10.0], [8.0, 16.0])
    feeder = StreamFeeder("127.0.0.1:1", "t", StreamBuffer("truncation", 8.0), time.time() - 30.0,
                          schedule=schedule, batch_policy=StreamBatch(1, 64), dilation=4.0)
    assert feeder.rate_now() == 8.0  # 30 s of the wall: 7.5 s of the world, before the change at 10
    assert feeder.next_take()[0] == 8


def test_the_outcome_line_says_the_worlds_seconds_and_the_walls():
    from testbed.cli.core import _outcome

    summary = {"status": "completed", "reason": "steps", "final_accuracy": 0.9, "steps": 10, "wall_seconds": 100.0,
               "seconds": 25.0, "dilation": 4.0, "ps_ingress_bytes": 2e6}
    assert "10 steps, 25.0 s of the world (100.0 s wall, k 4)" in _outcome(summary, None)
    assert "10 steps, 100.0 s, PS" in _outcome({**summary, "dilation": 1}, None)


def test_the_model_is_timed_on_this_host_without_privileges():
    sc = parse_scenario({"workload": {"batch_size": 8}})
    got = rd.host_step(sc)
    assert got["flops_per_step"] > 1e6 and got["cpu_s_median"] > 0 and got["threads"] == 1


def test_nodes_of_no_stated_speed_are_said_under_dilation():
    sc = parse_scenario({"profiles": {"edge": {"cpus": 0.3}}, "workers": [{"count": 2, "profile": "edge"}],
                         "evaluator": {"profile": {"device": "raspberry-pi-4"}}})
    line = rd.unstated_speed_warning(sc, 2.0)
    assert line.startswith("dilation 2: ps state no speed (cpus, device or speed): they run as fast as this host ")
    assert rd.unstated_speed_warning(sc, 1.0) is None
    assert rd.unstated_speed_warning(parse_scenario(SMOKE_LIKE), 2.0) is None


def test_up_takes_dilation_from_the_command_line():
    from testbed.cli.core import _overridden

    sc = parse_scenario({"workers": [{"count": 1}]})
    assert _overridden(sc, None, None, [], False, "auto").dilation == "auto"
    assert _overridden(sc, None, None, [], False, "2.5").dilation == 2.5
    assert _overridden(sc, None, None, [], False).dilation == 1.0


def test_make_demo_runs_the_smoke_at_auto():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "edgebed up scenarios/smoke.yaml --dilation auto" in makefile
