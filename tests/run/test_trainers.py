"""Per-round trainers from the runner's side (run/trainers.py): what the PS asks for is started
unless it runs already, is no worker, or its device is offline now."""

import time

from testbed.plan import parse_scenario
from testbed.plan.availability import offline_at
from testbed.plan.cluster import build_cluster
from testbed.run.trainers import Trainers


class Proc:
    def __init__(self, alive: bool):
        self.alive = alive

    def is_alive(self) -> bool:
        return self.alive


def test_the_asked_trainers_start_once_and_the_others_are_counted_by_why():
    spec = build_cluster(parse_scenario({"workers": [{"count": 4}]}), "abcdef")
    procs = {"w0": Proc(True), "w1": Proc(False)}  # w0 runs (selected again); w1's ended (parked)
    started, asked = [], [["w0", "w1", "w2", "w3", "ps", "nobody"]]

    def start(node):
        started.append(node.name)
        procs[node.name] = Proc(True)

    t0 = time.time() - 10.0  # run second 10: w3 is offline from 5 to 20
    trainers = Trainers(spec, procs, start, lambda: asked.pop() if asked else [], {"w3": [[5.0, 20.0]]}, t0)
    trainers.run_once()
    assert started == ["w1", "w2"]
    assert trainers.counts == {"started": 2, "running already": 1, "offline": 1, "not a worker": 2, "failed": 0,
                              "cut off by the end": 0}
    trainers.run_once()  # nothing more asked: nothing more started
    assert started == ["w1", "w2"]


def test_a_trainer_that_cannot_start_is_counted_and_the_rest_start():
    spec = build_cluster(parse_scenario({"workers": [{"count": 2}]}), "abcdef")

    def start(node):
        if node.name == "w0":
            raise OSError("no memory")

    trainers = Trainers(spec, {}, start, lambda: ["w0", "w1"], {}, time.time())
    trainers.run_once()
    assert trainers.counts["failed"] == 1 and trainers.counts["started"] == 1
    assert trainers.errors == ["w0: OSError: no memory"]


def test_a_start_cut_off_by_the_run_s_end_is_no_failure():
    """A container's first role still starting when the run ends: the control channel closes under
    the request; that is the end's doing, not a trainer that could not start."""
    spec = build_cluster(parse_scenario({"workers": [{"count": 2}]}), "abcdef")
    trainers = None

    def start(node):
        trainers._stop.set()  # the runner's teardown, while this start waited for an answer
        raise RuntimeError(f"{node.name}: no answer to a go request: the run has ended")

    trainers = Trainers(spec, {}, start, lambda: ["w0", "w1"], {}, time.time())
    trainers.run_once()
    assert trainers.counts["cut off by the end"] == 2 and trainers.counts["failed"] == 0 and trainers.errors == []


def test_offline_at_holds_each_interval_from_its_start_to_before_its_end():
    plan = {"a": [[0.0, 5.0], [10.0, 12.0]], "b": [[3.0, 4.0]]}
    assert offline_at(plan, 0.0) == {"a"} and offline_at(plan, 3.5) == {"a", "b"}
    assert offline_at(plan, 5.0) == set() and offline_at(plan, 11.9) == {"a"} and offline_at(plan, 12.0) == set()


def test_a_trainer_asked_for_while_it_parks_starts_once_it_has_ended():
    spec = build_cluster(parse_scenario({"workers": [{"count": 1}]}), "abcdef")
    procs = {"w0": Proc(True)}  # parking on the round before, as the PS draws it again
    started, asked = [], [["w0"]]
    trainers = Trainers(spec, procs, lambda node: started.append(node.name), lambda: asked.pop() if asked else [],
                        {}, time.time())
    trainers.run_once()
    assert started == [] and trainers.counts["running already"] == 1
    procs["w0"].alive = False  # it ended
    trainers.run_once()
    assert started == ["w0"] and trainers.counts["started"] == 1 and trainers.counts["running already"] == 0
    trainers.run_once()
    assert started == ["w0"]  # watched once


def test_the_offline_clock_agrees_with_offline_at_as_time_goes_forward():
    import random

    from testbed.plan.availability import OfflineClock

    rng = random.Random(4)
    plan = {}
    for n in range(30):
        t, spans = 0.0, []
        while t < 100:
            start = t + rng.expovariate(0.2)
            end = start + rng.expovariate(0.3)
            spans.append([start, end])
            t = end + (0.0 if rng.random() < 0.2 else rng.expovariate(0.5))  # some back to back
        plan[f"d{n}"] = spans
    clock = OfflineClock(plan)
    for now in sorted({0.0, *(x for spans in plan.values() for s in spans for x in s), *range(0, 120, 3)}):
        assert clock.at(now) == offline_at(plan, now), now
