"""Each LAN's permanent ARP entries, planned before anything runs (Mininet's `--arp`, staticArp()).

Why: an ARP request is a broadcast, and a LAN's bridge (or tree of bridges) copies it to every
port. At 1,000 devices a trainer's first packet to the PS puts 1,000 copies into the CPU's input
backlog (`net.core.netdev_max_backlog`, 1,000 by default), which then drops packets (the kernel's
kfree_skb reason CPU_BACKLOG), and every lost ARP exchange holds a trainer's connection a second
(ARP's and TCP's first retry), so a round waits seconds for its slowest start (BENCHMARKS.md,
"Where a fleet's round goes"). With each
interface's MAC made from its address, every entry is known before the nodes exist.

Which pairs: every node and the LAN's hubs (the nodes that are not workers: PS, evaluator,
broker; a site's router; the relay's gateway), both ways; every pair of a LAN of up to MESH_UP_TO
addresses. Workers of a larger LAN that talk to each other (decentralized strategies, data
injection) still ask by ARP.
"""

from __future__ import annotations

import ipaddress
from typing import Optional

from testbed.plan.cluster import ClusterSpec

MESH_UP_TO = 64  # addresses on a LAN: every pair gets entries (at most 4,032); beyond, pairs with a hub


def mac_of(address: str) -> str:
    """The MAC of the interface that holds IPv4 `address`: locally administered, unicast, the
    address's four bytes after 02:eb."""
    return "02:eb:" + ":".join(f"{b:02x}" for b in ipaddress.IPv4Address(address).packed)


def lans(spec: ClusterSpec) -> dict[Optional[str], tuple[list[str], list[str]]]:
    """Each LAN (its site, None for a scenario without sites) -> (its hubs' addresses, every
    address on it, the hubs included)."""
    out: dict[Optional[str], tuple[list[str], list[str]]] = {}
    for node in spec.nodes:
        hubs, every = out.setdefault(node.site, ([], []))
        every.append(node.address)
        if node.role != "worker":
            hubs.append(node.address)
    gateways: dict[Optional[str], str] = {s.name: s.router for s in spec.topology.sites} if spec.topology else {}
    if spec.topology is None and spec.relay_gateway:
        gateways[None] = spec.gateway
    for site, address in gateways.items():
        hubs, every = out.setdefault(site, ([], []))
        hubs.append(address)
        every.append(address)
    return out


def static_neighbours(spec: ClusterSpec) -> dict[str, list[str]]:
    """Address on a LAN -> the addresses it gets permanent entries for (never itself)."""
    table: dict[str, list[str]] = {}
    for hubs, every in lans(spec).values():
        hub_set = set(hubs)
        for address in every:
            if len(every) <= MESH_UP_TO or address in hub_set:
                table[address] = [a for a in every if a != address]
            else:
                table[address] = [a for a in hubs if a != address]
    return table
