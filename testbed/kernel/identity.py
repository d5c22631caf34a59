"""A node's own host identity: an unprivileged uid and gid that no user and no other node has.

A netns node's processes share the host's file system and PID namespace. As uid 0 without
capabilities they could still write what root owns (the run dir, /run/netns, the runner's
forkserver socket under its 0700 folder), read a neighbour's /proc/PID/environ and memory,
signal the runner and open sysfs knobs for writing. As a uid of their own, the kernel's own
checks close all of those (rootless containers' rule: the emulated machine's root is an
unprivileged user of the host), and each node is a stranger to every other.

The uids lie in a block of their own per run, far above any distribution's users and the
subordinate ranges of /etc/subuid (which start at 100000 and grow by 65536 a user).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from testbed.errors import HostCannot
from testbed.kernel.parent_death import die_with_parent, parent_death_signal

BASE = 1 << 31  # above every account and subordinate range a distribution hands out
BLOCK = 1 << 16  # uids a run: one a node
BLOCKS = 1 << 14  # runs' blocks: BASE + BLOCKS * BLOCK stays under 2**32 - 1 (the invalid uid)


class IdentityError(HostCannot):
    pass


@dataclass(frozen=True)
class NodeIdentity:
    uid: int
    gid: int


def node_identity(run_id: str, index: int) -> NodeIdentity:
    """The identity of node `index` (its place in the plan) of run `run_id` (hex, kernel.names)."""
    if not 0 <= index < BLOCK:
        raise IdentityError(f"node index {index} outside 0..{BLOCK - 1}")
    uid = run_block(run_id)[index]
    return NodeIdentity(uid, uid)


def run_block(run_id: str) -> range:
    """Every uid run `run_id`'s nodes may have."""
    start = BASE + (int(run_id, 16) % BLOCKS) * BLOCK
    return range(start, start + BLOCK)


def become(identity: NodeIdentity) -> None:
    """This process as `identity`, no supplementary group, for good (real, effective and saved
    ids all set; needs CAP_SETUID and CAP_SETGID, which the change itself then clears). Its
    parent-death signal, which the kernel clears on a change of ids, is set again."""
    death = parent_death_signal()
    os.setgroups([])
    os.setresgid(identity.gid, identity.gid, identity.gid)
    os.setresuid(identity.uid, identity.uid, identity.uid)
    if death:
        die_with_parent(death)
    if os.getresuid() != (identity.uid,) * 3 or os.getresgid() != (identity.gid,) * 3 or os.getgroups():
        raise IdentityError(f"could not become uid {identity.uid}: ids {os.getresuid()}, {os.getresgid()}")


# In a container, what a node runs takes a uid below 65,536: a user-namespaced engine (rootless
# Docker, userns-remap) maps only that many. A fleet host's device i takes CONTAINER_BASE + 1 + i.
CONTAINER_BASE = 40000
CONTAINER_SLOTS = 16384  # a fleet host's devices at most: the last uid stays under nobody's 65534


def container_identity(slot: int = 0) -> NodeIdentity:
    """The identity of what a container node runs (slot 0), or of a fleet host's device (1 + its index)."""
    if not 0 <= slot < CONTAINER_SLOTS:
        raise IdentityError(f"container slot {slot} outside 0..{CONTAINER_SLOTS - 1}")
    return NodeIdentity(CONTAINER_BASE + slot, CONTAINER_BASE + slot)
