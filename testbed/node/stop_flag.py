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


F_SEAL_FUTURE_WRITE = 0x0010  # linux/fcntl.h (5.1): no new writable mapping, no write(); Python lacks the name


class SealedStopFlag:
    """The runner's stop for processes that are not its own (netns nodes, each its own uid): set()
    by its maker only. It is a byte in a memfd sealed against future writes once the maker has
    mapped it: a node maps it read-only and the kernel refuses any writable mapping or write
    (a flag in a shared arena every node maps writable would let any node stop the run)."""

    def __init__(self) -> None:
        import fcntl
        import mmap
        import os

        self._fd = os.memfd_create("edgebed-stop", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self._fd, mmap.PAGESIZE)
        self._map = mmap.mmap(self._fd, mmap.PAGESIZE)
        fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE |
                    fcntl.F_SEAL_SEAL)

    def set(self) -> None:
        self._map[0] = 1

    def is_set(self) -> bool:
        return self._map[0] == 1

    def __reduce__(self):  # only while multiprocessing starts a process: the descriptor goes along
        from multiprocessing import reduction

        return (ReadOnlyStop, (reduction.DupFd(self._fd),))


class ReadOnlyStop:
    """A SealedStopFlag as a node sees it: is_set() only."""

    def __init__(self, dupfd) -> None:
        import mmap
        import os

        fd = dupfd.detach()
        try:
            self._map = mmap.mmap(fd, mmap.PAGESIZE, prot=mmap.PROT_READ)
        finally:
            os.close(fd)

    def set(self) -> None:
        raise PermissionError("the run's stop is the runner's to set")

    def is_set(self) -> bool:
        return self._map[0] == 1
