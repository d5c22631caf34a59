"""Imported first by the netns runtime's forkserver (its preload): the forkserver dies when the
runner dies, even by `kill -9`, and every node process forked from it dies with it (each sets
PR_SET_PDEATHSIG as it starts, runtimes/netns.py). Without this the forkserver could outlive a
killed runner and the cluster went on training until `edgebed down`.

It acts only in a direct child of the runner that named itself in EDGEBED_RUNNER_PID: imported
anywhere else (a test, a tool), it does nothing."""

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
RUNNER_ENV = "EDGEBED_RUNNER_PID"


def _guard() -> None:
    if os.environ.get(RUNNER_ENV) != str(os.getppid()):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.environ.get(RUNNER_ENV) != str(os.getppid()):  # the runner died before prctl took hold
        os._exit(1)


_guard()
