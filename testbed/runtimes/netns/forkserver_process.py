"""A forkserver process whose exit status two threads may ask for at once.

CPython's forkserver Popen.poll reads the child's exit status from its sentinel, once: the
forkserver writes it there and closes its end. Two threads that poll together (the monitor's
is_alive, and multiprocessing's own _cleanup that every Process.start runs over all children:
per-round trainers start from the runner's trainer thread) can both see the sentinel readable;
the first reads the status, the second reads end-of-file and sets the return code to 255, "the
forkserver itself got killed". A node that ended with 0 then reads as one that failed, and the
run fails with it (threads that poll an ended process together hit this often). Here the read
is made under a lock, once."""

from __future__ import annotations

import os
import threading
from multiprocessing import context, forkserver, popen_forkserver
from multiprocessing.connection import wait


class _Popen(popen_forkserver.Popen):
    def __init__(self, process_obj):
        self._status_lock = threading.Lock()
        super().__init__(process_obj)

    def poll(self, flag=os.WNOHANG):
        if self.returncode is None and flag != os.WNOHANG:
            wait([self.sentinel])  # until it ends: not under the lock, which the others only hold briefly
        with self._status_lock:  # the look at the pipe too: one thread's read leaves it empty a moment
            if self.returncode is None and wait([self.sentinel], 0):
                try:
                    self.returncode = forkserver.read_signed(self.sentinel)
                except (OSError, EOFError):  # the forkserver died before it could say
                    self.returncode = 255
            return self.returncode


class ForkserverProcess(context.ForkServerProcess):
    """multiprocessing's forkserver Process, its exit status read once whatever the threads."""

    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)
