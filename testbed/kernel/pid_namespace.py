"""A process's own PID namespace, for a netns node's process: its code sees only its namespace's
processes, numbered from 1, and cannot name (signal, ptrace, read /proc of) any process outside.

unshare(CLONE_NEWPID) moves only the caller's later children, so `enter_own` forks twice, and
three processes share the work:

    outside (the pid the runner knows)   waits for init, then ends as the node's code ended
      init (PID 1 of the namespace)       reaps orphans; ends when the node's code ends,
                                          and the kernel then kills the namespace's rest
        the node's code (PID 2)           returns from enter_own and goes on

The node's code is not PID 1 itself: the kernel drops a signal to a namespace's init whose
action is the default (SIGTERM, abort()'s SIGABRT, even SIGKILL sent from inside), which would
change how a role ends and what exit code the runner reads. Init stays uid 0 without
capabilities: a node's uid can neither signal it nor, with hidepid, see it in /proc.

What the runner relies on holds: its SIGKILL to the outside process (a kill, the run's end)
reaches init as its parent-death signal, and the namespace goes with it; the outside process
ends with the node's code's exit code, or by the same signal; all three are in the cgroup the
outside process joined first. The node's code mounts its own /proc (kernel.mounts) after this,
so that /proc lists its namespace alone.

Each process a node is started with (its role, each stress process, a measuring job) takes a
namespace of its own rather than joining a sibling's: they start and end apart (a stress
change, a per-round trainer's end), and the end of a namespace's first process would take the
others with it.
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
import sys

from testbed.kernel.parent_death import die_with_parent
from testbed.kernel.privileges import drop_privileges

CLONE_NEWPID = 0x20000000
STATUS_BYTES = 4


def _unshare_pid() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(CLONE_NEWPID) == 0


def enter_own() -> bool:
    """Fork this process's code into a PID namespace of its own (needs CAP_SYS_ADMIN, one thread).
    True: this is the node's code, PID 2 of the new namespace; the calling process and the
    namespace's init never return (see the module's text). False: the kernel refused the
    namespace (a sandbox's seccomp, no CONFIG_PID_NS): nothing changed, the caller goes on as is."""
    if not _unshare_pid():
        return False
    alive_r, alive_w = os.pipe()  # init's way to see the outside process gone before its death signal held
    status_r, status_w = os.pipe()  # the node's code's wait status, from init to the outside process
    sys.stdout.flush()
    sys.stderr.flush()
    init = os.fork()
    if init == 0:
        os.close(alive_w)
        os.close(status_r)
        if _init(alive_r, status_w):
            return True  # the node's code: init forked it
    os.close(alive_r)
    os.close(status_w)
    _outside(init, status_r)  # never returns
    return False  # not reached


def _gone(alive_r: int) -> bool:
    poll = select.poll()  # not select(): this process may hold descriptors numbered past 1023
    poll.register(alive_r, select.POLLIN)
    return bool(poll.poll(0))  # end of file: the write end's one holder exited


def _init(alive_r: int, status_w: int) -> bool:
    """PID 1: True in the node's code it forked; never returns in itself."""
    try:
        die_with_parent(signal.SIGKILL)  # from the outside process: an ancestor namespace's, so it is not dropped
        if _gone(alive_r):
            os._exit(1)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # queued for sigwait, never dropped
        child = os.fork()
    except BaseException:
        os._exit(1)
    if child == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(alive_r)
        os.close(status_w)
        return True
    try:
        drop_privileges()  # uid 0 (hidden from the node's uid by hidepid), no capability
        _reap(child, status_w)
    finally:
        os._exit(1)  # init never returns: the outside process then ends as init did


def _reap(child: int, status_w: int) -> None:
    """Every process that ends in the namespace, until `child` does: its wait status to `status_w`."""
    while True:
        signal.sigwait({signal.SIGCHLD})
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:  # its end is the node process's; init's end then takes the namespace's rest
                os.write(status_w, status.to_bytes(STATUS_BYTES, "little"))
                os._exit(0)


def _outside(init: int, status_r: int) -> None:
    """The process the runner started: ends as the node's code ended (never returns)."""
    try:
        _, own = os.waitpid(init, 0)
        data = b""
        while len(data) < STATUS_BYTES:
            more = os.read(status_r, STATUS_BYTES - len(data))
            if not more:
                break
            data += more
        status = int.from_bytes(data, "little") if len(data) == STATUS_BYTES else own  # init killed: its end
        _end_as(status)
    finally:
        os._exit(1)


def _end_as(status: int) -> None:
    """This process's end, as the wait status `status` says: the same exit code or signal."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the node's crash dumped its core already, if any
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two whose action cannot be set
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is not to end a process
