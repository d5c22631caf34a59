"""The cluster's network, built in namespaces of edgebed's own: switches, site routers, WAN links.

Both runtimes plug their nodes in here: the netns runtime its node namespaces, the docker
runtime (for multi-site topologies) its containers' namespaces, attached by PID. Nothing of
it sits in the host's root namespace, so the host's iptables (Docker's FORWARD DROP and its
isolation rules for internal networks) never see the cluster's traffic.

    one LAN:   node eth0 <== veth ==> <node> -- br0 in eb-<run>-sw (past 1,023 ports a tree of
               bridges: br0-1, br0-2, ... each joined to br0; kernel/bridges.py)
    sites:     node eth0 <== veth ==> <node> -- br0 in eb-<run>-sw-<site> -- router (eb-<run>-rt-<site>)
               routers joined pairwise by WAN veths wan-<peer>, each direction shaped on its egress
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Optional

from testbed.kernel.bridges import BridgeTree
from testbed.kernel.netlink import (
    LOOPBACK_INDEX,
    NetnsSockets,
    add_veth,
    create_netns,
    disable_offloads,
    link_counters,
    ns_iproute,
    set_sysctl,
)
from testbed.kernel.rtnl import Rtnl
from testbed.kernel.shaping import DirectionPlan, KernelCaps, apply_direction, plan_direction, rate_alone, reshape
from testbed.plan.cluster import ClusterSpec, Node
from testbed.plan.neighbours import mac_of, static_neighbours
from testbed.runtimes.state import RunState
from testbed.runtimes.ticks import Tick, no_ticks
from testbed.scenario.links import Direction, inherit

BRIDGE = "br0"


def switch_netns(run_id: str, site: Optional[str] = None) -> str:
    return f"eb-{run_id}-sw" if site is None else f"eb-{run_id}-sw-{site}"


def router_netns(run_id: str, site: str) -> str:
    return f"eb-{run_id}-rt-{site}"


class WanLinks:
    """The WAN links between sites as plans, each direction shaped on its sending router's egress;
    where the routers are is the subclass's (`_reshape_wan`)."""

    def __init__(self, caps: KernelCaps):
        self.caps = caps
        self.wan_plans: dict[tuple[str, str], DirectionPlan] = {}  # (from site, to site) -> plan
        self.wan_directions: dict[tuple[str, str], Any] = {}  # (from site, to site) -> its Direction now
        self.gateway_netns: Optional[str] = None  # where the run's gateway address is (external broker)

    def set_wan(self, a: str, b: str, direction: str, fields: dict) -> str:
        """Change the WAN link between sites a and b during the run: `up` is a -> b, `down` b -> a.
        Each direction is shaped on its sending router's egress, changed in place (shaping.reshape)."""
        if (a, b) not in self.wan_plans:
            raise ValueError(f"no WAN link between sites {a} and {b}")
        pairs = ((a, b), (b, a)) if direction == "both" else ((a, b),) if direction == "up" else ((b, a),)
        if (fields.get("latency") or fields.get("jitter")) and not all(self.caps_at(src).netem for src, _ in pairs):
            raise ValueError("latency on a WAN link during a run needs netem (this kernel has none; set the "
                             "WAN latency in the scenario: the transport makes it from the start)")
        done = []
        for src, dst in pairs:
            key = (src, dst)
            new_dir = inherit(Direction(**fields), self.wan_directions[key])  # an event over what is
            new_plan = plan_direction(new_dir, self.caps_at(src))
            self._reshape_wan(src, dst, self.wan_plans[key], new_plan)
            self.wan_plans[key], self.wan_directions[key] = new_plan, new_dir
            done.append(f"{src}->{dst}")
        return f"{'+'.join(done)}: " + ", ".join(f"{k}={v}" for k, v in fields.items())

    def caps_at(self, site: str) -> KernelCaps:
        """The kernel of the host that shapes what leaves `site`'s router."""
        return self.caps

    def _reshape_wan(self, src: str, dst: str, old: DirectionPlan, new: DirectionPlan) -> None:  # pragma: no cover
        raise NotImplementedError

    def wan_meta(self) -> dict:
        return {f"{a}->{b}": plan.to_meta() for (a, b), plan in self.wan_plans.items()}

    # what the runtime base (runtimes.base.Runtime.fabric) asks of any sites' implementation
    def wan_counters(self) -> dict[tuple[str, str], dict[str, int]]:  # pragma: no cover
        raise NotImplementedError

    def topology_meta(self) -> Optional[dict]:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError


class Fabric(WanLinks):
    def __init__(self, state: RunState, caps: KernelCaps):
        super().__init__(caps)
        self.state = state
        self.run_id = state.run_id
        self._switches: dict[str, Any] = {}  # switch netns name -> its IPRoute
        self._switch_rtnl: dict[str, Rtnl] = {}  # switch netns name -> its socket for bring-up's requests
        self._routers: dict[str, Any] = {}  # site -> its router's IPRoute
        self.wan_ifnames: dict[tuple[str, str], str] = {}  # (from site, to site) -> egress ifname in `from`
        self.plugged: set[str] = set()  # nodes whose switch-side veth is named after them
        self.node_switch: dict[str, str] = {}  # node -> the switch netns its veth is plugged into
        self.port_index: dict[str, int] = {}  # node -> its switch-side veth's ifindex
        self.node_end: dict[str, tuple[str, int]] = {}  # node -> (its netns, its eth0's ifindex)
        self.sockets = NetnsSockets()  # read and reshape each second or 10 times a second: kept open
        self.neighbours: dict[str, list[str]] = {}  # address -> the addresses it has permanent ARP entries for

    def _make_ns(self, name: str) -> None:
        self.state.netns.append(name)  # recorded first: `down` finds it even if we crash next
        self.state.save()
        create_netns(name, ipv6=False)  # IPv4 networks: see create_netns

    def _make_switch(self, name: str):
        self._make_ns(name)
        s = ns_iproute(name)
        self._switches[name] = s
        self._switch_rtnl[name] = Rtnl(name)
        s.link("add", ifname=BRIDGE, kind="bridge")
        br = s.link_lookup(ifname=BRIDGE)[0]
        s.link("set", index=br, state="up")
        return s, br

    def build(self, spec: ClusterSpec, node_netns: dict[str, str],
              progress: Tick = no_ticks) -> dict[str, tuple[DirectionPlan, DirectionPlan]]:
        """Switch(es), routers and WAN links; every node's netns plugged in. Returns node -> (up, down) plans."""
        plans = {}
        self.neighbours = static_neighbours(spec)
        if spec.topology is None:
            sw = switch_netns(self.run_id)
            s, br = self._make_switch(sw)
            tree = BridgeTree(s, br, BRIDGE, len(spec.nodes))
            for i, node in enumerate(spec.nodes):
                plans[node.name] = self._plug(sw, s, tree.bridge_for(i), node, node_netns[node.name], spec.prefixlen)
                progress("links", i + 1, len(spec.nodes))
            disable_offloads(sw, tree.links)
            if spec.relay_gateway:  # on the switch, not on the host: nodes reach one relayed port only
                self._address_lan_end(self._switch_rtnl[sw], br, spec.gateway, spec.prefixlen)
                self.gateway_netns = sw
            return plans
        topo = spec.topology
        switches = {}
        for site in topo.sites:
            sw = switch_netns(self.run_id, site.name)
            s, br = self._make_switch(sw)
            on_site = sum(1 for n in spec.nodes if n.site == site.name)
            switches[site.name] = (sw, s, BridgeTree(s, br, BRIDGE, on_site, extra=1))  # the router's port
            self._create_router(site, s, br)
        plugged_on: dict[str, int] = {}
        for i, node in enumerate(spec.nodes):
            sw, s, tree = switches[node.site]
            site = topo.site(node.site)
            j = plugged_on[node.site] = plugged_on.get(node.site, -1) + 1
            plans[node.name] = self._plug(sw, s, tree.bridge_for(j), node, node_netns[node.name], site.prefixlen,
                                          gateway=site.router)
            progress("links", i + 1, len(spec.nodes))
        for sw, _, tree in switches.values():
            disable_offloads(sw, tree.links)
        for edge in topo.edges:
            self._create_wan_link(edge)
        for site in topo.sites:
            r = self._routers[site.name]
            for subnet, (via, _ifname) in topo.routes(site.name).items():
                r.route("add", dst=subnet, gateway=via)
        return plans

    def _create_router(self, site, s, br: int) -> None:
        name = router_netns(self.run_id, site.name)
        self._make_ns(name)
        r = ns_iproute(name)
        self._routers[site.name] = r
        set_sysctl(name, "net/ipv4/ip_forward", "1")
        add_veth(s, "router", name, "lan", master=br, state="up")
        with Rtnl(name) as rt:
            self._address_lan_end(rt, rt.index("lan"), site.router, site.prefixlen)
        r.link("set", index=LOOPBACK_INDEX, state="up")

    def _create_wan_link(self, edge) -> None:
        """A point-to-point veth between two routers; each end shapes its own direction on egress."""
        add_veth(self._routers[edge.a], edge.ifname(edge.a), router_netns(self.run_id, edge.b), edge.ifname(edge.b))
        for site in (edge.a, edge.b):
            ns = router_netns(self.run_id, site)
            r = self._routers[site]
            ifname = edge.ifname(site)
            idx = r.link_lookup(ifname=ifname)[0]
            r.addr("add", index=idx, address=edge.address_of(site), prefixlen=edge.prefixlen)
            r.link("set", index=idx, state="up")
            plan = plan_direction(edge.direction_from(site), self.caps)
            apply_direction(r, idx, plan)
            key = (site, edge.b if site == edge.a else edge.a)
            self.wan_plans[key], self.wan_directions[key], self.wan_ifnames[key] = \
                plan, edge.direction_from(site), ifname
            disable_offloads(ns, [ifname])

    def _reshape_wan(self, src: str, dst: str, old: DirectionPlan, new: DirectionPlan) -> None:
        with ns_iproute(router_netns(self.run_id, src)) as r:  # its own socket: the monitor uses the router's
            reshape(r, r.link_lookup(ifname=self.wan_ifnames[(src, dst)])[0], old, new)

    def _plug(self, sw: str, s, br: int, node: Node, netns: str, prefixlen: int,
              gateway: Optional[str] = None) -> tuple[DirectionPlan, DirectionPlan]:
        """A veth from the node's netns (eth0, its address, uplink shaping) to the switch (downlink
        shaping). Links, addresses, neighbours and an HTB rate by kernel.rtnl (pyroute2's cost a
        request adds up over a fleet's bring-up); routes, netem, loss filters and peer classes by
        pyroute2."""
        pidx = self._switch_rtnl[sw].add_veth(node.name, netns, "eth0", master=br, up=True)
        up = plan_direction(node.link.uplink, self.caps, node.link.uplink_peers)
        down = plan_direction(node.link.downlink, self.caps, node.link.downlink_peers)
        with Rtnl(netns) as n:
            idx = n.index("eth0")
            self._address_lan_end(n, idx, node.address, prefixlen)
            n.set_link(LOOPBACK_INDEX, up=True)
            if gateway is None and rate_alone(up):
                apply_direction(None, idx, up, rt=n)
            else:
                with ns_iproute(netns) as ns:
                    if gateway is not None:  # other sites are reached through the site's router
                        ns.route("add", dst="default", gateway=gateway)
                    apply_direction(ns, idx, up, rt=n)
        apply_direction(s, pidx, down, rt=self._switch_rtnl[sw])
        disable_offloads(netns, ["eth0"])
        disable_offloads(sw, [node.name])
        self.plugged.add(node.name)
        self.node_switch[node.name] = sw
        self.port_index[node.name] = pidx
        self.node_end[node.name] = (netns, idx)
        return up, down

    def _address_lan_end(self, rt: Rtnl, index: int, address: str, prefixlen: int) -> None:
        """An interface on a LAN: its address, the MAC made from it, the permanent ARP entries of
        the addresses it talks to (plan/neighbours.py), up."""
        rt.set_link(index, mac=mac_of(address))
        rt.add_address(index, address, prefixlen)
        for a in self.neighbours.get(address, []):
            rt.add_neighbour(index, a, mac_of(a))
        rt.set_link(index, up=True)

    @contextmanager
    def uplink_iface(self, node: str):
        """(an IPRoute in the node's namespace, its eth0's ifindex): where its uplink is shaped;
        the calling thread's own socket, kept open."""
        netns, index = self.node_end[node]
        with self.sockets.using(netns) as ipr:
            yield ipr, index

    @contextmanager
    def downlink_iface(self, node: str):
        """(an IPRoute in the node's switch, ifindex of its switch-side veth): where its downlink
        is shaped. The calling thread's own socket (the monitor's, a trace replay's), kept open."""
        sw = self.node_switch[node]
        with self.sockets.using(sw) as ipr:
            yield ipr, self.port_index[node]

    # -- observation -------------------------------------------------------------------
    def counters(self) -> dict[str, dict[str, int]]:
        """Per plugged node: bytes/packets up (node -> net) and down, from the switch-side veth end."""
        out: dict[str, dict[str, int]] = {}
        by_switch: dict[str, list[str]] = {}
        for node, sw in self.node_switch.items():
            by_switch.setdefault(sw, []).append(node)
        for sw, nodes in by_switch.items():
            stats = link_counters(sw)
            for node in nodes:
                st = stats.get(self.port_index[node])
                if st is None:  # its veth is gone (a node removed)
                    continue
                rx_b, rx_p, tx_b, tx_p = st
                # The switch end *receives* what the node sends (uplink) and *transmits* downlink.
                out[node] = {"up_bytes": rx_b, "up_packets": rx_p, "down_bytes": tx_b, "down_packets": tx_p}
        return out

    def wan_counters(self) -> dict[tuple[str, str], dict[str, int]]:
        """Per WAN link end (site, peer site): bytes/packets sent towards the peer ("up") and received."""
        out = {}
        for site, r in self._routers.items():
            for link in r.get_links():
                ifname = link.get_attr("IFLA_IFNAME") or ""
                if not ifname.startswith("wan-"):
                    continue
                st = link.get_attr("IFLA_STATS64")
                out[(site, ifname[4:])] = {"up_bytes": st["tx_bytes"], "up_packets": st["tx_packets"],
                                           "down_bytes": st["rx_bytes"], "down_packets": st["rx_packets"]}
        return out

    def topology_meta(self) -> Optional[dict]:
        if not self.wan_plans:
            return None
        return {"wan": self.wan_meta(), "routers": {site: router_netns(self.run_id, site) for site in self._routers}}

    def close(self) -> None:
        self.sockets.close()
        for rt in self._switch_rtnl.values():
            rt.close()
        self._switch_rtnl.clear()
        for ipr in list(self._switches.values()) + list(self._routers.values()):
            try:
                ipr.close()
            except Exception:
                pass
        self._switches.clear()
        self._routers.clear()
