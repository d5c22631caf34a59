"""Sites (LANs) joined by WAN links: addresses, the WAN graph, routes and path delays.

A scenario without `sites` is one LAN: every node on one switch. With sites,
each site gets its own subnet (a /24 of `network.subnet` where it fits), its own switch and
a router (the site's first address) that the site's nodes use as their default gateway.
Routers are joined pairwise by point-to-point WAN links (a /30 each, from the subnet's last
block), each direction shaped on the egress of its router end. Traffic between two nodes of
one site stays on its switch; traffic between sites always crosses the WAN link(s) on the
shortest path (fewest hops) between them.
"""

from __future__ import annotations

import ipaddress
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from testbed.errors import BadInput
from testbed.scenario.links import Direction
from testbed.scenario.schema import Scenario


@dataclass
class SitePlan:
    name: str
    index: int
    subnet: str
    prefixlen: int
    router: str  # the router's address on the site's LAN (the nodes' default gateway)

    def hosts(self):
        """Addresses for the site's nodes, after the router's."""
        it = ipaddress.IPv4Network(self.subnet).hosts()
        next(it)
        return it


@dataclass
class WanEdge:
    a: str
    b: str
    forward: Direction  # a -> b
    reverse: Direction  # b -> a
    a_address: str  # a's end of the point-to-point link
    b_address: str
    prefixlen: int = 30

    def ifname(self, site: str) -> str:
        """Name of the edge's interface in `site`'s router: wan-<other site>."""
        return f"wan-{self.b if site == self.a else self.a}"

    def direction_from(self, site: str) -> Direction:
        return self.forward if site == self.a else self.reverse

    def peer_address(self, site: str) -> str:
        return self.b_address if site == self.a else self.a_address

    def address_of(self, site: str) -> str:
        return self.a_address if site == self.a else self.b_address


@dataclass
class Topology:
    sites: list[SitePlan]
    edges: list[WanEdge] = field(default_factory=list)

    def site(self, name: str) -> SitePlan:
        return next(s for s in self.sites if s.name == name)

    def edge(self, a: str, b: str) -> Optional[WanEdge]:
        return next((e for e in self.edges if {e.a, e.b} == {a, b}), None)

    def neighbours(self, site: str) -> list[str]:
        return sorted(e.b if e.a == site else e.a for e in self.edges if site in (e.a, e.b))

    def path(self, src: str, dst: str) -> list[str]:
        """Sites from src to dst on a fewest-hops path (ties: alphabetical), [] if unreachable."""
        prev: dict[str, Optional[str]] = {src: None}
        queue = deque([src])
        while queue:
            u = queue.popleft()
            if u == dst:
                break
            for v in self.neighbours(u):
                if v not in prev:
                    prev[v] = u
                    queue.append(v)
        if dst not in prev:
            return []
        out = [dst]
        while prev[out[-1]] is not None:
            out.append(prev[out[-1]])  # type: ignore[arg-type]
        return out[::-1]

    def routes(self, site: str) -> dict[str, tuple[str, str]]:
        """For `site`'s router: destination subnet -> (next-hop address, interface)."""
        out = {}
        for other in self.sites:
            if other.name == site:
                continue
            p = self.path(site, other.name)
            if len(p) < 2:
                continue
            e = self.edge(p[0], p[1])
            out[other.subnet] = (e.peer_address(site), e.ifname(site))
        return out

    def path_delay(self, src: str, dst: str) -> tuple[float, float]:
        """One-way WAN (latency, jitter) from site src to site dst: latencies add, jitters add in
        quadrature (independent hops)."""
        p = self.path(src, dst)
        delay = var = 0.0
        for u, v in zip(p, p[1:]):
            d = self.edge(u, v).direction_from(u)
            delay += d.latency or 0.0
            var += (d.jitter or 0.0) ** 2
        return delay, math.sqrt(var)

    def connected(self) -> bool:
        if not self.sites:
            return True
        first = self.sites[0].name
        return all(self.path(first, s.name) for s in self.sites)


class TopologyError(BadInput):
    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def topology_problems(sc: Scenario) -> list[str]:
    """Everything wrong with the scenario's sites and WAN, one line each naming the field."""
    lines: list[str] = []
    names = list(sc.sites)
    if not names:
        if sc.wan.links:
            lines.append("wan.links: WAN links need sites (none are defined)")
        lines += [f"{w}: unknown site '{s}' (no sites are defined)" for w, s in _site_refs(sc) if s is not None]
        return lines
    for w, s in _site_refs(sc):
        if s is not None and s not in sc.sites:
            lines.append(f"{w}: unknown site '{s}' (defined: {', '.join(names)})")
    seen: set[frozenset] = set()
    for i, link in enumerate(sc.wan.links):
        a, b = link.between
        for s in (a, b):
            if s not in sc.sites:
                lines.append(f"wan.links[{i}].between: unknown site '{s}' (defined: {', '.join(names)})")
        if a == b:
            lines.append(f"wan.links[{i}].between: a link from site '{a}' to itself")
        pair = frozenset((a, b))
        if pair in seen:
            lines.append(f"wan.links[{i}].between: a second link between '{a}' and '{b}'")
        seen.add(pair)
    if lines:
        return lines
    try:
        topo = plan_topology(sc)
    except TopologyError as e:
        return e.lines
    counts: dict[str, int] = {}
    for _, site in _node_sites(sc):
        counts[site] = counts.get(site, 0) + 1
    for site, count in counts.items():
        room = ipaddress.IPv4Network(topo.site(site).subnet).num_addresses - 3  # network, router, broadcast
        if count > room:
            lines.append(f"sites.{site}: {count} nodes do not fit its subnet {topo.site(site).subnet}")
    if topo is not None and not topo.connected():
        cut = [s.name for s in topo.sites if not topo.path(topo.sites[0].name, s.name)]
        lines.append(f"wan: the topology is disconnected: no WAN path from '{topo.sites[0].name}' to "
                     f"{', '.join(repr(c) for c in cut)} (add wan.links, or mesh: true)")
    return lines


def _site_refs(sc: Scenario) -> list[tuple[str, Optional[str]]]:
    where = [("ps.site", sc.ps.site), ("evaluator.site", sc.evaluator.site)]
    where += [(f"workers[{i}].site", g.site) for i, g in enumerate(sc.workers)]
    if sc.streaming is not None:
        where.append(("streaming.broker.site", sc.streaming.broker.site))
    return where


def plan_topology(sc: Scenario) -> Optional[Topology]:
    """Subnets, routers and WAN links of a scenario with sites; None without sites."""
    if not sc.sites:
        return None
    net = ipaddress.IPv4Network(sc.network.subnet)
    n = len(sc.sites)
    k = math.ceil(math.log2(n + 1))  # n site blocks + one block for the WAN links
    new_prefix = max(net.prefixlen + k, 24) if net.prefixlen + k <= 24 else net.prefixlen + k
    if new_prefix > 29:
        raise TopologyError([f"network.subnet: {sc.network.subnet} is too small for {n} sites"])
    blocks = list(net.subnets(new_prefix=new_prefix))
    sites = []
    for i, name in enumerate(sc.sites):
        b = blocks[i]
        sites.append(SitePlan(name, i, str(b), b.prefixlen, str(next(b.hosts()))))
    pairs: list[tuple[str, str, object]] = []
    overrides = {frozenset(link.between): link for link in sc.wan.links}
    names = list(sc.sites)
    if sc.wan.mesh:
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                link = overrides.get(frozenset((a, b)))
                if link is not None and link.between[0] != a:
                    a_, b_ = link.between
                    pairs.append((a_, b_, link))
                else:
                    pairs.append((a, b, link))
    else:
        pairs = [(link.between[0], link.between[1], link) for link in sc.wan.links]
    p2p = list(blocks[-1].subnets(new_prefix=30))
    if len(pairs) > len(p2p):
        raise TopologyError([f"network.subnet: {sc.network.subnet} has no room for {len(pairs)} WAN links"])
    edges = []
    for (a, b, link), block in zip(pairs, p2p):
        fwd = link.resolved("forward", sc.wan.default) if link is not None else sc.wan.default.resolved("forward")
        rev = link.resolved("reverse", sc.wan.default) if link is not None else sc.wan.default.resolved("reverse")
        ha, hb = list(block.hosts())[:2]
        edges.append(WanEdge(a, b, fwd, rev, str(ha), str(hb)))
    return Topology(sites, edges)


def _node_sites(sc: Scenario) -> list[tuple[str, str]]:
    """(node, site) of every node the scenario makes (sites defined)."""
    out = [("ps", node_site(sc, sc.ps.site)), ("eval", node_site(sc, sc.evaluator.site))]
    out += [(name, node_site(sc, sc.workers[gi].site)) for name, gi in sc.worker_names()]
    if sc.streaming is not None:
        out.append(("broker", node_site(sc, sc.streaming.broker.site)))
    return out  # type: ignore[return-value]


def node_site(sc: Scenario, site: Optional[str]) -> Optional[str]:
    """The site a node is in: its own, else the first site; None without sites."""
    if not sc.sites:
        return None
    return site if site is not None else next(iter(sc.sites))
