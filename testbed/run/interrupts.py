"""A stop from outside turned into an exception, so whatever brought a cluster up tears it down:
`edgebed up` (run/runner.py) and every benchmark that brings one up (bench/harness.py) use these.

SIGTERM (`timeout`, a CI job cancelled, `kill`) and SIGHUP (the terminal closed) raise
`Interrupted` in the main thread, as Ctrl-C raises KeyboardInterrupt: the `finally` blocks and
context managers on the way out then remove what was made. A forked copy of the process (a
library's helper) must never run that teardown: it exits instead. During the teardown itself
Ctrl-C is ignored, since a half teardown is the worst outcome.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A BaseException, as KeyboardInterrupt is: a library's `except Exception` must not swallow
    it (pyroute2 decodes an attribute lazily under one and returns None when the signal lands
    there: the stop became a TypeError and the command exited 1, not 130)."""


def _raiser(owner_pid: int):
    def raise_interrupted(signum, frame) -> None:
        if os.getpid() != owner_pid:  # a fork of the owner: only the owner tears down
            os._exit(128 + signum)
        raise Interrupted(signal.Signals(signum).name)

    return raise_interrupted


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def interrupting_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted in this process until the block ends (then the
    handlers before it again). Outside the main thread, where no handler can be set: nothing."""
    if not _main_thread():
        yield
        return
    handler = _raiser(os.getpid())
    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def shielded_teardown() -> Iterator[None]:
    """Ctrl-C ignored until the block (a teardown) ends."""
    if not _main_thread():
        yield
        return
    prev = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)
