"""A process that ends with its parent: the kernel's parent-death signal (prctl(2)), sent when
the thread that forked the process exits. The kernel clears it when the process's ids change,
so identity.become sets it again."""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Optional

PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """`sig` to this process when its parent ends (0: none)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0)


def parent_death_signal() -> int:
    """The signal this process gets when its parent ends; 0: none."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    return sig.value


class ParentWatch:
    """Whether this process's parent has ended, asked of the host's procfs through a descriptor
    opened now: getppid() says 0 in a PID namespace the parent is not in, and a /proc of the
    node's own, mounted later, does not name the parent at all. Closed before the node's code runs."""

    def __init__(self, parent: int):
        self.parent = parent  # the host's pid of the process that forked this one
        self._fd: Optional[int] = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)

    def gone(self) -> bool:
        """True once the parent ended (this process was handed to a reaper)."""
        if self._fd is None:
            raise ValueError("the watch is closed")
        for line in os.pread(self._fd, 8192, 0).decode().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1]) != self.parent
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
