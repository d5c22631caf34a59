"""The run's stop flag survives the processes that poll it being SIGKILLed (node.stop_flag)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from testbed.node.stop_flag import StopFlag
from testbed.runtimes.base import StopEvent


def _returns_within(fn, seconds: float) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive()


def _hold_the_lock(event) -> None:
    event._cond.acquire()  # what is_set() does for an instant: here, until killed
    time.sleep(60)


def test_an_event_is_left_locked_by_a_process_killed_while_it_polls():
    """Why StopFlag exists: the stdlib Event blocks its other users for good."""
    ctx = mp.get_context("fork")
    event = ctx.Event()
    p = ctx.Process(target=_hold_the_lock, args=(event,))
    p.start()
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert not _returns_within(event.is_set, 1.0)


def _poll(flag, seen) -> None:
    while not flag.is_set():
        pass
    seen.value = 1


def _set(flag) -> None:
    flag.set()


@pytest.mark.parametrize("method", ["fork", "forkserver"])  # the supervisor's, the netns runtime's
def test_the_flag_crosses_processes_both_ways_and_outlives_killed_pollers(method):
    ctx = mp.get_context(method)
    flag = StopFlag(ctx)
    assert isinstance(flag, StopEvent)
    for _ in range(5):  # pollers killed mid-poll leave nothing held
        p = ctx.Process(target=_poll, args=(flag, ctx.RawValue("b", 0)))
        p.start()
        time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        assert _returns_within(flag.is_set, 1.0) and not flag.is_set()
    seen = ctx.RawValue("b", 0)
    poller = ctx.Process(target=_poll, args=(flag, seen))
    poller.start()
    setter = ctx.Process(target=_set, args=(flag,))  # a child's set reaches the parent and its siblings
    setter.start()
    setter.join(10)
    poller.join(10)
    assert flag.is_set() and seen.value == 1 and poller.exitcode == 0
