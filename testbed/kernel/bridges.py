"""A switch past one bridge: a Linux bridge holds at most 1,023 ports (the kernel numbers them 1
to BR_MAX_PORTS - 1: the 1,024th fails with "Exchange full", on Docker's default bridge too), so
a switch with more ports becomes a tree inside its namespace: the switch's own bridge at the
root, leaf bridges of at most LEAF_PORTS ports each, each leaf joined to the root by a veth pair.

    <root>-<k>   leaf k (k = 1, 2, ...): ports j with j // LEAF_PORTS = k - 1
    <root>-<k>u  its end of the veth to the root, on the leaf
    <root>-<k>d  the root's end, on the root

The names carry a '-', which a node's name never does, so they cannot meet a port named after a
node. A switch that fits on one bridge (ports plus `extra`, e.g. a site's router) stays one
bridge. With `isolated` (the control switch: a node reaches the runner, never another
node) the root's ends are isolated too, so two leaves cannot reach each other through the root,
while the runner, the root bridge's own address, is still reached from every leaf.
"""

from __future__ import annotations

import os
from typing import Any

BRIDGE_PORTS = 1023  # a Linux bridge's most ports: the kernel's BR_MAX_PORTS (1,024) less port 0
LEAF_PORTS = 1000  # ports on one leaf; the root then holds the leaves' ends and a router or two


def limits() -> tuple[int, int]:
    """(ports one bridge holds, ports on a leaf). EDGEBED_TEST_BRIDGE_PORTS=N (tests only) makes a
    tree of a handful of nodes, leaves of N - 2, so a short real run crosses leaves."""
    test = os.environ.get("EDGEBED_TEST_BRIDGE_PORTS", "")
    if test.isdigit() and 4 <= int(test) < BRIDGE_PORTS:
        return int(test), int(test) - 2
    return BRIDGE_PORTS, LEAF_PORTS


def leaf_count(ports: int, extra: int = 0) -> int:
    """Leaf bridges a switch of `ports` ports (and `extra` on its root) needs: 0 when one bridge holds them."""
    most, leaf = limits()
    if ports + extra <= most:
        return 0
    return -(-ports // leaf)


class BridgeTree:
    """The bridges of one switch: `bridge_for(j)` is where its j-th port goes (a leaf made on first use)."""

    def __init__(self, ipr: Any, root: int, root_name: str, ports: int, extra: int = 0, isolated: bool = False):
        self.ipr, self.root, self.root_name, self.isolated = ipr, root, root_name, isolated
        self.tree = leaf_count(ports, extra) > 0
        self.leaves: dict[int, int] = {}  # k -> the leaf bridge's ifindex
        self.links: list[str] = []  # the veth ends joining leaves to the root

    def bridge_for(self, j: int) -> int:
        """The ifindex of the bridge the switch's j-th port is plugged into."""
        if not self.tree:
            return self.root
        k = 1 + j // limits()[1]
        if k not in self.leaves:
            self.leaves[k] = self._make_leaf(k)
        return self.leaves[k]

    def _make_leaf(self, k: int) -> int:
        ipr, name = self.ipr, f"{self.root_name}-{k}"
        ipr.link("add", ifname=name, kind="bridge")
        leaf = ipr.link_lookup(ifname=name)[0]
        ipr.link("set", index=leaf, state="up")
        up, down = f"{name}u", f"{name}d"
        ipr.link("add", ifname=up, kind="veth", peer={"ifname": down})
        ipr.link("set", index=ipr.link_lookup(ifname=up)[0], master=leaf, state="up")
        didx = ipr.link_lookup(ifname=down)[0]
        ipr.link("set", index=didx, master=self.root, state="up")
        if self.isolated:
            ipr.brport("set", index=didx, isolated=1)
        self.links += [up, down]
        return leaf


def one_bridge_problems(sc: Any, runtime: str) -> list[str]:
    """A runtime whose nodes share one bridge it does not make (a Docker network): at most
    BRIDGE_PORTS - 1 nodes beside the runner's port."""
    nodes = len(sc.node_names())  # the broker and producer nodes too
    if nodes + 1 <= BRIDGE_PORTS:
        return []
    return [f"workers: {nodes} nodes and the runner on one network of runtime {runtime}; a Linux bridge holds at "
            f"most {BRIDGE_PORTS} ports, so runtime {runtime} takes at most {BRIDGE_PORTS - 1} nodes (ps, eval, "
            "broker and producer included); runtime netns makes a tree of bridges past that"]
