"""User code without the node's powers: what a role, a command workload's program, a plugin or a
measuring job runs with, set in the process right after it is forked and before it runs anything
of the user's.

The node's supervisor (node/supervisor.py) and the runner keep the capabilities they shape and probe
with; the processes they start call `drop_privileges()` first. After it the process has no
capability in any set (effective, permitted, inheritable, ambient, bounding) and no way to gain
one back: no_new_privs is set, so neither a set-uid program nor a file's capabilities grant
anything at exec, and with an empty bounding set even root's exec gets nothing. So
`tc qdisc del` and `ip addr add` (netlink changes, CAP_NET_ADMIN) fail with EPERM. Given an
identity (kernel.identity: netns nodes), the process also becomes that unprivileged uid and gid;
without one the uid stays as it was (0 in a container): see SECURITY.md for what each can reach.

Capabilities are per thread: the process must have one thread when it drops (checked), so no
thread keeps what the others gave up. Plain ctypes on libc (prctl, capset): no maintained
package does this much and no more.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

from testbed.errors import HostCannot
from testbed.kernel.identity import NodeIdentity, become

PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAP_SETPCAP = 8
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# root is no longer special at exec, ambient capabilities cannot be raised; both locked
SECBIT_NOROOT, SECBIT_NOROOT_LOCKED = 1 << 0, 1 << 1
SECBIT_NO_CAP_AMBIENT_RAISE, SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED = 1 << 6, 1 << 7
SECUREBITS = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
CAP_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class PrivilegeError(HostCannot):
    pass


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def last_cap() -> int:
    """The highest capability number this kernel knows."""
    return int(Path("/proc/sys/kernel/cap_last_cap").read_text())


def process_status() -> dict[str, int]:
    """This thread's capability sets (as integers), NoNewPrivs and Threads, from /proc/self/status."""
    out = {}
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in CAP_SETS:
            out[key] = int(value.strip(), 16)
        elif key in ("NoNewPrivs", "Threads"):
            out[key] = int(value.strip())
    return out


def _prctl(libc, option: int, arg: int, what: str) -> None:
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise PrivilegeError(f"{what} failed: {os.strerror(err)}")


def _drop_bounding_set(libc, can_drop: bool) -> None:
    """Every capability out of the bounding set (needs CAP_SETPCAP: a process without it has no
    capability to lose there that no_new_privs and an empty permitted set leave it any use of)."""
    if not can_drop:
        return
    libc.prctl(PR_SET_SECUREBITS, ctypes.c_ulong(SECUREBITS), 0, 0, 0)  # best effort: the sets below are what count
    for cap in range(last_cap() + 1):
        _prctl(libc, PR_CAPBSET_DROP, cap, f"dropping capability {cap} from the bounding set")


def _clear_sets(libc) -> None:
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()  # all zero: effective, permitted and inheritable emptied
    if libc.capset(ctypes.byref(header), data) != 0:
        raise PrivilegeError(f"capset failed: {os.strerror(ctypes.get_errno())}")


def _thread_names() -> list[str]:
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue
    return names


def drop_privileges(identity: Optional[NodeIdentity] = None) -> dict[str, int]:
    """Give up every capability for good (this process and all it starts), and with `identity`
    the uid and gid too; what /proc/thread-self/status says afterwards. Raises PrivilegeError if
    any capability is left."""
    before = process_status()
    if before.get("Threads", 1) != 1:
        raise PrivilegeError(f"drop_privileges needs a process with one thread (it has {before['Threads']}: "
                             f"{', '.join(_thread_names())}): capabilities are per thread")
    libc = _libc()
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
    had_setpcap = bool(before["CapEff"] >> CAP_SETPCAP & 1)
    _drop_bounding_set(libc, had_setpcap)
    if identity is not None:
        become(identity)  # while CAP_SETUID is still effective; the change clears the other sets
    _prctl(libc, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "clearing the ambient set")
    _clear_sets(libc)
    after = process_status()
    left = [k for k in CAP_SETS if after[k] and (k != "CapBnd" or had_setpcap)]
    if left or after["NoNewPrivs"] != 1:
        raise PrivilegeError(f"capabilities left after dropping them: {after}")
    return after
