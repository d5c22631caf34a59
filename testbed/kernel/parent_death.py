"""A process that ends with its parent: the kernel's parent-death signal (prctl(2)), sent when
the thread that forked the process exits. The kernel clears it when the process's ids change,
so identity.become sets it again."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """`sig` to this process when its parent ends (0: none)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(int(sig)), 0, 0, 0)


def parent_death_signal() -> int:
    """The signal this process gets when its parent ends; 0: none."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    return sig.value
