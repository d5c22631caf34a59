"""The roles' message handling, without sockets: a worker never loses a 'stop' that arrived with a
reply, and the PS's feed to a slow evaluator keeps the final model's evaluation within its limit."""

from __future__ import annotations

import threading
from collections import deque

from testbed.node.roles.common import EvalFeed
from testbed.node.roles.worker import Worker
from testbed.node.wire import Message


class FakeEndpoint:
    """recv() hands out the given batches in order, then nothing; send() keeps what was sent."""

    def __init__(self, batches=()):
        self.batches = deque(batches)
        self.sent: list[tuple[Message, object]] = []

    def recv(self, timeout: float):
        return [(None, m, 0) for m in self.batches.popleft()] if self.batches else []

    def send(self, msg: Message, to=None) -> int:
        self.sent.append((msg, to))
        return 0


def _worker(batches) -> Worker:
    w = Worker.__new__(Worker)  # only what wait_reply uses
    w.ep, w.stop_event, w.inbox = FakeEndpoint(batches), threading.Event(), deque()
    return w


def test_a_stop_that_arrives_with_a_reply_is_kept_for_the_next_wait():
    # The PS answers a push and stops right after: both can arrive in one receive. The worker
    # once took the reply and dropped the stop, then waited for a PS that had stopped.
    w = _worker([[Message("model", meta={"version": 3}), Message("stop")]])
    assert w.wait_reply().kind == "model"
    assert w.wait_reply().kind == "stop"


def test_messages_of_other_kinds_are_passed_over_in_order():
    w = _worker([[Message("model"), Message("decision", meta={"sync": True})], [Message("model")]])
    assert w.wait_reply(("decision",)).kind == "decision"  # the stale model before it is dropped
    assert w.wait_reply().kind == "model"


def test_the_runners_stop_ends_a_wait_with_nothing_queued():
    w = _worker([])
    w.stop_event.set()
    assert w.wait_reply() is None


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _feed(pace: float, snapshots) -> EvalFeed:
    """A feed that has seen evaluations take `pace` seconds, with `snapshots` (version, repeat) queued."""
    feed = EvalFeed(FakeEndpoint(), Clock())
    feed.full_seconds.extend([pace] * 3)
    for i, (version, repeat) in enumerate(snapshots):
        feed.add({} if repeat else {"w": version}, {"version": version, "time": float(i), "repeat": repeat})
    feed.ready = True
    return feed


def test_fit_keeps_the_earliest_and_the_final_within_the_limit():
    feed = _feed(2.0, [(v, False) for v in range(10)])
    feed.fit(9.0)  # 4 evaluations of 2 s: the first 3 and the final
    assert [m["version"] for _, m in feed.queue] == [0, 1, 2, 9]
    assert feed.skipped == 6
    assert feed.stats() == {"evaluator_lag_seconds": 0.0, "evaluations_skipped": 6}


def test_fit_leaves_a_queue_that_fits_alone():
    feed = _feed(2.0, [(v, False) for v in range(4)])
    feed.fit(9.0)
    assert [m["version"] for _, m in feed.queue] == [0, 1, 2, 3] and feed.skipped == 0


def test_repeats_cost_nothing_and_a_final_repeat_of_a_skipped_model_carries_it():
    # versions 0, 1, 1(repeat), 2, 2(repeat, final): three full evaluations fit, the final one included
    feed = _feed(2.0, [(0, False), (1, False), (1, True), (2, False), (2, True)])
    feed.fit(7.0)
    kept = list(feed.queue)
    assert [m["version"] for _, m in kept] == [0, 1, 1, 2]
    assert kept[-1][1]["repeat"] is False and kept[-1][0] == {"w": 2}  # the evaluator gets the model


def test_the_backlog_is_measured_when_a_snapshot_is_sent():
    feed = _feed(1.0, [(0, False), (1, False)])
    feed.now.t = 12.5  # the first snapshot was taken at 0 s
    feed.pump()
    assert feed.lag == 12.5 and feed.ep.sent[0][0].kind == "evaluate" and not feed.ready
    feed.on_ready()
    feed.now.t = 13.0
    feed.pump()
    assert feed.lag == 12.5  # the longest wait, not the last one
