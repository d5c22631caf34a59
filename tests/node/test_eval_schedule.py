"""Tests for testbed.node.roles.eval_schedule (when the PS feeds the evaluator) and the evaluator's repeats."""

from __future__ import annotations

import pytest
import torch

from testbed.node.roles.eval_schedule import EvalSchedule
from testbed.node.roles.evaluator import _evaluate_message, evaluate
from testbed.node.roles.replicas import REPLICA_REFRESH, replica_schedule
from testbed.node.wire import Message
from testbed.plan import parse_scenario


def test_by_versions_ignores_time():
    s = EvalSchedule(10)
    assert not s.timed
    assert [v for v in range(1, 31) if s.due(v, now=1e9)] == [10, 20, 30]


def test_by_versions_feeds_once_for_a_jump():
    s = EvalSchedule(10)
    assert s.due(35, now=0)  # 10, 20 and 30 passed at once: one feed
    assert not s.due(39, now=0)
    assert s.due(40, now=0)


def test_by_versions_is_step_modulo_interval():
    s = EvalSchedule(7)
    assert [step for step in range(1, 50) if s.due(step, 0)] == [step for step in range(1, 50) if step % 7 == 0]


def test_by_time_ignores_versions():
    s = EvalSchedule(10, seconds=2.0)
    assert s.timed
    assert not s.due(1000, now=1.99)
    assert s.due(0, now=2.0)  # no new version: still due
    assert not s.due(5000, now=2.5)
    assert s.due(0, now=4.01)


def test_by_time_drops_missed_ticks():
    s = EvalSchedule(10, seconds=1.0)
    assert s.due(0, now=5.3)  # ticks 1..5 were missed: one feed now
    assert not s.due(0, now=5.9)
    assert s.due(0, now=6.0)


def test_by_time_feeds_once_per_tick_on_a_fine_grid():
    s = EvalSchedule(1, seconds=0.1)
    times = [i * 0.01 for i in range(1, 101)]
    fed = [t for t in times if s.due(0, t)]
    assert len(fed) == 10
    assert all(b - a == pytest.approx(0.1, abs=0.011) for a, b in zip(fed, fed[1:]))


def test_wait_never_passes_the_next_timed_feed():
    assert EvalSchedule(10).wait(now=3.0, poll=0.05) == 0.05
    s = EvalSchedule(10, seconds=1.0)
    assert s.wait(now=0.5, poll=0.05) == 0.05
    assert s.wait(now=0.98, poll=0.05) == pytest.approx(0.02)
    assert s.wait(now=1.3, poll=0.05) == 0.0  # overdue: do not block


def test_replica_schedule_follows_the_evaluation_mode():
    by_versions = replica_schedule(parse_scenario({"workload": {"eval_interval": 5}}))
    assert (by_versions.interval, by_versions.seconds) == (5, None)
    timed = replica_schedule(parse_scenario({"workload": {"eval_seconds": 8}}))
    assert timed.seconds == pytest.approx(8 / REPLICA_REFRESH)


def test_a_repeat_reuses_the_last_result():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    first = _evaluate_message(model, x, y, Message("evaluate", params, {"version": 7}), None)
    assert first == (7, *evaluate(model, x, y))
    with torch.no_grad():
        model.weight.zero_()  # a repeat must not evaluate the model it holds
    again = _evaluate_message(model, x, y, Message("evaluate", {}, {"version": 7, "repeat": True}), first)
    assert again == first
    # a repeat of a version this evaluator did not see (it restarted): no result, no row
    assert _evaluate_message(model, x, y, Message("evaluate", {}, {"version": 9, "repeat": True}), first) is None
    assert _evaluate_message(model, x, y, Message("evaluate", {}, {"version": 7, "repeat": True}), None) is None
