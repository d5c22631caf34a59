"""Each child of a forkserver starts as PID 1 of a PID namespace of its own, at the cost of no
extra fork: the forkserver asks the kernel for a new namespace right before each fork
(unshare(CLONE_NEWPID) moves only the caller's next children) and goes back to its own right
after (setns): while its children's namespace is not its own, a process can start no thread,
and a namespace whose first process ended takes no more.

The node's code sees its namespace's processes alone (with a /proc mounted after the fork:
kernel.mounts) and cannot name the runner's, its forkserver's or a neighbour's; the runner
still knows, kills and waits for the child by its pid on the host. Being its namespace's
init, the node's process differs from a host process in what the kernel does for an init:
- a signal it sends itself is dropped where its action is the default (abort() ends by
  SIGSEGV); a signal from the runner's namespace (its SIGKILL) always arrives;
- what its programs leave running is its child, and ends when it ends.

A fork that needs no new namespace (the kernel refuses one: a sandbox's seccomp, no
CONFIG_PID_NS) goes on as a plain fork: the child shares the forkserver's namespace.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

CLONE_NEWPID = 0x20000000

_libc = ctypes.CDLL(None, use_errno=True)
_own: Optional[int] = None  # the forkserver's own namespace, to go back to after each fork
_forkserver: Optional[int] = None  # the pid that installed the hooks; its children never act
forked_by: Optional[int] = None  # in a child: the forkserver's pid (getppid() says 0 across namespaces)


def fork_children_apart(new_namespaces: bool = True) -> None:
    """In this process (a forkserver, uid 0 with CAP_SYS_ADMIN, one thread while it forks): each
    later child starts a PID namespace of its own (`new_namespaces`) and learns who forked it."""
    global _own, _forkserver
    if _forkserver is not None:
        return
    _forkserver = os.getpid()
    if new_namespaces:
        _own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    os.register_at_fork(before=_before_fork, after_in_parent=_after_in_parent, after_in_child=_after_in_child)


def _before_fork() -> None:
    if os.getpid() == _forkserver and _own is not None:
        _libc.unshare(CLONE_NEWPID)  # refused (-1): this child shares the forkserver's namespace


def _after_in_parent() -> None:
    if os.getpid() == _forkserver and _own is not None:
        _libc.setns(_own, CLONE_NEWPID)  # back to its own: threads, and a next namespace, allowed again


def _after_in_child() -> None:
    global _own, _forkserver, forked_by
    if _own is not None:
        os.close(_own)  # the host's namespace: nothing of the node's to hold
    forked_by = _forkserver
    _own, _forkserver = None, None  # a node's own forks are plain ones
