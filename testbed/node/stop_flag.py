"""The run's stop, shared by a parent and the processes it forks, some of which it SIGKILLs.

multiprocessing.Event takes a lock in shared memory on every is_set(); a role or stress
process killed (a `kill` event, `edgebed kill`) while it holds that lock leaves it held, and
the next is_set() or set() of every other process -- the node's supervisor, the netns
runner -- blocks forever. A byte of shared memory with no lock cannot be left held: the
flag only ever goes from False to True, so a torn read cannot happen and none is needed.
"""

from __future__ import annotations

import ctypes


class StopFlag:
    """set() / is_set() (runtimes.base.StopEvent) across forked processes, lock-free."""

    def __init__(self, ctx) -> None:
        self._flag = ctx.RawValue(ctypes.c_bool, False)  # handed to children when they start

    def set(self) -> None:
        self._flag.value = True

    def is_set(self) -> bool:
        return bool(self._flag.value)
