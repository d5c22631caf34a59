"""Sites and WAN links on runtime swarm.

Each site's LAN is an overlay network of the run with the site's planned subnet; its router is
a one-task service of its own (node.own_router) on the host where most of the site's nodes are
(or where `placement:` puts the site), joined to each neighbouring router by an overlay network
of the WAN link; each router shapes its direction of each WAN link on that interface's egress,
by the same plans as the fabric's routers (runtimes.fabric). The swarm gives the addresses, so
the routes are made from the tasks' addresses: a node routes the other sites' subnets through
its site's router, a router through the next router on the fewest-hops path (plan.topology).

    site a:  node eth0 == overlay eb-<run>-a == rt-a == overlay eb-<run>-wan-a-b == rt-b == overlay eb-<run>-b
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Optional, Protocol

from testbed.kernel.shaping import DirectionPlan, KernelCaps, plan_direction
from testbed.node import control
from testbed.plan.cluster import ClusterSpec
from testbed.runtimes.control.hub import parsed_answer
from testbed.runtimes.fabric import WanLinks

ROUTER_PREFIX = "rt-"  # a router's name on the control channel: rt-<site>


def router_name(site: str) -> str:
    return f"{ROUTER_PREFIX}{site}"


class SiteServices(Protocol):
    """What the sites need of the swarm runtime (runtimes.swarm.runtime.SwarmRuntime, which imports this
    module): the run's overlays and one-task services, and a word with a router."""
    run_id: str

    def overlay(self, name: str, subnet: Optional[str]) -> Any: ...

    def service(self, name: str, host: Any, networks: list, resources: Optional[dict] = None,
                sysctls: Optional[dict] = None, directions: tuple = (), env: Optional[dict] = None,
                role: str = "router") -> Any: ...

    def wait_running(self, services: dict[str, Any]) -> dict[str, dict]: ...

    def address_on(self, task: dict, network: Any) -> str: ...

    def ask(self, name: str, req: dict) -> str: ...

    def ask_all(self, names: list[str], req: dict) -> dict[str, Optional[str]]: ...

    def ask_kernel(self, name: str) -> KernelCaps: ...

    def clock_offset(self, name: str) -> tuple[float, float]: ...


class SwarmSites(WanLinks):
    def __init__(self, rt: SiteServices, spec: ClusterSpec, caps: KernelCaps, router_hosts: dict[str, Any]):
        """`router_hosts`: site -> the swarm host (runtimes.swarm.hosts.SwarmHost) its router runs on."""
        super().__init__(caps)
        self.rt, self.spec, self.topo = rt, spec, spec.topology
        self.lans: dict[str, object] = {}  # site -> its overlay network
        self.wans: dict[frozenset, object] = {}  # {a, b} -> the WAN link's overlay network
        self.services: dict[str, object] = {}  # site -> its router's service
        self.router_hosts = router_hosts
        self.hosts = {site: host.hostname for site, host in router_hosts.items()}  # site -> its router's host
        self.lan_address: dict[str, str] = {}  # site -> its router's address on the site's LAN
        self.wan_address: dict[tuple[str, str], str] = {}  # (site, peer) -> site's router's address on their link
        self.router_caps: dict[str, KernelCaps] = {}  # site -> its router's host's kernel
        self.router_clock: dict[str, float] = {}  # site -> its router's clock offset (its counters' times)

    def make_lans(self) -> None:
        for site in self.topo.sites:
            self.lans[site.name] = self.rt.overlay(f"eb-{self.rt.run_id}-{site.name}", site.subnet)

    def make_routers(self) -> None:
        """The WAN links' networks (their subnets the swarm's) and each site's router on its host."""
        for e in self.topo.edges:
            self.wans[frozenset((e.a, e.b))] = self.rt.overlay(f"eb-{self.rt.run_id}-wan-{e.a}-{e.b}", None)
        for site in self.topo.sites:
            host = self.router_hosts[site.name]
            networks = [(self.lans[site.name], router_name(site.name))]
            networks += [(net, router_name(site.name)) for pair, net in self.wans.items() if site.name in pair]
            self.services[site.name] = self.rt.service(
                router_name(site.name), host, networks,
                sysctls={"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "0"},
                directions=tuple(self.topo.edge(site.name, peer).direction_from(site.name)
                                 for peer in self.topo.neighbours(site.name)))

    def route(self) -> None:
        """Once the routers run: their addresses taken from their tasks, each told its WAN links'
        plans and its routes."""
        for site, task in self.rt.wait_running({router_name(s): svc for s, svc in self.services.items()}).items():
            site = site[len(ROUTER_PREFIX):]
            self.lan_address[site] = self.rt.address_on(task, self.lans[site])
            for pair, net in self.wans.items():
                if site in pair:
                    (peer,) = pair - {site}
                    self.wan_address[(site, peer)] = self.rt.address_on(task, net)
        self._take_addresses()
        for site in self.topo.sites:
            self.router_caps[site.name] = self.rt.ask_kernel(router_name(site.name))
            self.router_clock[site.name] = self.rt.clock_offset(router_name(site.name))[0]
            wan = []
            for peer in self.topo.neighbours(site.name):
                e = self.topo.edge(site.name, peer)
                plan = plan_direction(e.direction_from(site.name), self.caps_at(site.name))
                self.wan_plans[(site.name, peer)] = plan
                self.wan_directions[(site.name, peer)] = e.direction_from(site.name)
                wan.append({"peer": peer, "address": self.wan_address[(site.name, peer)], "plan": asdict(plan)})
            routes = {self.topo.site(other).subnet: self.wan_address[(next_hop, site.name)]
                      for other, next_hop in self._next_hops(site.name).items()}
            self.rt.ask(router_name(site.name), control.Route(self.lan_address[site.name], wan, routes).to_wire())

    def _take_addresses(self) -> None:
        """The swarm's addresses into the plan (meta.json's topology): routers and WAN link ends."""
        for site in self.topo.sites:
            site.router = self.lan_address[site.name]
        for e in self.topo.edges:
            e.a_address, e.b_address = self.wan_address[(e.a, e.b)], self.wan_address[(e.b, e.a)]

    def _next_hops(self, site: str) -> dict[str, str]:
        """Every other reachable site -> the neighbour on the way to it."""
        out = {}
        for other in self.topo.sites:
            path = self.topo.path(site, other.name)
            if len(path) >= 2:
                out[other.name] = path[1]
        return out

    def node_routes(self, site: Optional[str]) -> dict[str, str]:
        """A node's routes: every other site's subnet through its site's router."""
        return {s.subnet: self.lan_address[site] for s in self.topo.sites if s.name != site}

    def caps_at(self, site: str) -> KernelCaps:
        return self.router_caps.get(site, self.caps)

    def _reshape_wan(self, src: str, dst: str, old: DirectionPlan, new: DirectionPlan) -> None:
        self.rt.ask(router_name(src), control.ReshapeWan(dst, asdict(old), asdict(new)).to_wire())

    def wan_counters(self) -> dict[tuple[str, str], dict[str, int]]:
        out = {}
        answers = self.rt.ask_all([router_name(s) for s in self.services], control.WanCounters().to_wire())
        for name, answer in answers.items():
            per_peer = parsed_answer(answer)
            if not isinstance(per_peer, dict):
                continue
            site = name[len(ROUTER_PREFIX):]
            for peer, c in per_peer.items():
                if isinstance(c.get("time"), float):  # read then, on the runner's clock
                    c["time"] -= self.router_clock.get(site, 0.0)
                out[(site, peer)] = c
        return out

    def topology_meta(self) -> dict:
        return {"wan": self.wan_meta(),
                "routers": {s: {"service": svc.name, "host": self.hosts[s], "lan_address": self.lan_address.get(s)}
                            for s, svc in self.services.items()}}

    def close(self) -> None:
        pass  # the routers and networks are the run's services and networks: teardown removes them
