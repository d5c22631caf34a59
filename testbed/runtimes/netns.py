"""The LXC-style runtime: each node is a network namespace plus a cgroup, Mininet's host model.

    node netns eb-<run>-<node>         switch netns eb-<run>-sw
    eth0 (addr, uplink HTB) <== veth ==> <node> (downlink HTB) -- br0

The bridge lives in a namespace of its own, so the host's iptables (Docker sets the
FORWARD policy to DROP and sends bridged traffic through it) never see the cluster's
traffic, and nothing of the cluster has a route out of the machine.

Node processes are forked from a forkserver that has already imported torch (one
import for the whole cluster, pages shared), then each joins its cgroup and
namespace before it runs its role.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import cgroups
from ..cluster import ClusterSpec, Node
from ..netlink import create_netns, disable_offloads, enter_netns, ns_iproute, set_sysctl
from ..shaping import DirectionPlan, KernelCaps, apply_direction, plan_direction, probe_kernel
from ..state import RunState, cleanup_run, temp_link_name

PR_SET_PDEATHSIG = 1
BRIDGE = "br0"
ROUTER_INDEX = 0xD00  # temporary veth names: nodes count from 0, site routers and WAN links from here
WAN_INDEX = 0xE00
GATEWAY_INDEX = 0xFFF  # the host's veth to the switch keeps its temporary name: `down` finds it by that


def netns_name(run_id: str, node: str) -> str:
    return f"eb-{run_id}-{node}"


def switch_netns(run_id: str, site: Optional[str] = None) -> str:
    return f"eb-{run_id}-sw" if site is None else f"eb-{run_id}-sw-{site}"


def router_netns(run_id: str, site: str) -> str:
    return f"eb-{run_id}-rt-{site}"


def _bootstrap(netns: str, run_id: str, node: str, target: Callable, kwargs: dict) -> None:
    """First thing in every node process: die with the runner, join cgroup and namespace."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # parent already gone
        os._exit(1)
    cgroups.NodeCgroup(run_id, node).attach(os.getpid())
    enter_netns(netns)
    target(**kwargs)


@dataclass
class NodeHandle:
    node: Node
    netns: str
    peer_ifname: str  # the veth end in the switch namespace
    uplink: DirectionPlan
    downlink: DirectionPlan
    cgroup: cgroups.NodeCgroup
    compute: dict
    processes: list = field(default_factory=list)


class NetnsRuntime:
    name = "netns"

    def __init__(self, state: RunState, caps: Optional[KernelCaps] = None):
        self.state = state
        self.run_id = state.run_id
        self.caps = caps or probe_kernel()
        self.handles: dict[str, NodeHandle] = {}
        self._ctx = mp.get_context("forkserver")
        self._switches: dict[str, Any] = {}  # switch netns name -> its IPRoute
        self._routers: dict[str, Any] = {}  # site -> its router's IPRoute
        self.wan_plans: dict[tuple[str, str], DirectionPlan] = {}  # (from site, to site) -> plan
        self.host_gateway_ifname: Optional[str] = None

    # -- bring-up --------------------------------------------------------------------
    def _make_ns(self, name: str) -> None:
        self.state.netns.append(name)  # recorded first: `down` finds it even if we crash next
        self.state.save()
        create_netns(name)

    def _make_switch(self, name: str):
        self._make_ns(name)
        s = ns_iproute(name)
        self._switches[name] = s
        s.link("add", ifname=BRIDGE, kind="bridge")
        br = s.link_lookup(ifname=BRIDGE)[0]
        s.link("set", index=br, state="up")
        return s, br

    def create(self, spec: ClusterSpec) -> None:
        from pyroute2 import IPRoute

        for node in spec.nodes:
            if node.image is not None:
                raise RuntimeError(f"node {node.name} runs the image {node.image}: that needs the docker runtime")
        with IPRoute() as ipr:
            if spec.topology is None:
                sw = switch_netns(self.run_id)
                s, br = self._make_switch(sw)
                for i, node in enumerate(spec.nodes):
                    self.handles[node.name] = self._create_node(ipr, sw, s, br, i, node, spec.prefixlen)
                if spec.host_gateway:
                    self._create_host_gateway(ipr, s, br, spec)
                return
            self._create_sites(ipr, spec)

    def _create_sites(self, ipr, spec: ClusterSpec) -> None:
        """One switch and one router per site, WAN links between routers, routes along shortest paths."""
        topo = spec.topology
        switches = {}
        for site in topo.sites:
            sw = switch_netns(self.run_id, site.name)
            s, br = self._make_switch(sw)
            switches[site.name] = (sw, s, br)
            self._create_router(ipr, site, sw, s, br)
        for i, node in enumerate(spec.nodes):
            sw, s, br = switches[node.site]
            self.handles[node.name] = self._create_node(ipr, sw, s, br, i, node, topo.site(node.site).prefixlen,
                                                        gateway=topo.site(node.site).router)
        for j, edge in enumerate(topo.edges):
            self._create_wan_link(ipr, j, edge)
        for site in topo.sites:
            r = self._routers[site.name]
            for subnet, (via, _ifname) in topo.routes(site.name).items():
                r.route("add", dst=subnet, gateway=via)

    def _create_router(self, ipr, site, sw: str, s, br: int) -> None:
        name = router_netns(self.run_id, site.name)
        self._make_ns(name)
        r = ns_iproute(name)
        self._routers[site.name] = r
        set_sysctl(name, "net/ipv4/ip_forward", "1")
        a, b = temp_link_name(self.run_id, ROUTER_INDEX + site.index, "x"), temp_link_name(self.run_id, ROUTER_INDEX + site.index, "y")
        ipr.link("add", ifname=a, kind="veth", peer={"ifname": b})
        ipr.link("set", index=ipr.link_lookup(ifname=a)[0], net_ns_fd=name)
        ipr.link("set", index=ipr.link_lookup(ifname=b)[0], net_ns_fd=sw)
        idx = r.link_lookup(ifname=a)[0]
        r.link("set", index=idx, ifname="lan")
        r.addr("add", index=idx, address=site.router, prefixlen=site.prefixlen)
        r.link("set", index=idx, state="up")
        r.link("set", index=r.link_lookup(ifname="lo")[0], state="up")
        pidx = s.link_lookup(ifname=b)[0]
        s.link("set", index=pidx, ifname="router")
        s.link("set", index=pidx, master=br, state="up")

    def _create_wan_link(self, ipr, j: int, edge) -> None:
        """A point-to-point veth between two routers; each end shapes its own direction on egress."""
        a, b = temp_link_name(self.run_id, WAN_INDEX + j, "x"), temp_link_name(self.run_id, WAN_INDEX + j, "y")
        ipr.link("add", ifname=a, kind="veth", peer={"ifname": b})
        for tmp, site in ((a, edge.a), (b, edge.b)):
            ns = router_netns(self.run_id, site)
            ipr.link("set", index=ipr.link_lookup(ifname=tmp)[0], net_ns_fd=ns)
            r = self._routers[site]
            idx = r.link_lookup(ifname=tmp)[0]
            ifname = edge.ifname(site)
            r.link("set", index=idx, ifname=ifname)
            r.addr("add", index=idx, address=edge.address_of(site), prefixlen=edge.prefixlen)
            r.link("set", index=idx, state="up")
            plan = plan_direction(edge.direction_from(site), self.caps)
            apply_direction(r, idx, plan)
            self.wan_plans[(site, edge.b if site == edge.a else edge.a)] = plan
            disable_offloads(ns, [ifname])

    def _create_host_gateway(self, ipr, s, br: int, spec: ClusterSpec) -> None:
        """Give this host the run's gateway address on the switch (as Docker's bridge has it), so
        nodes reach a service on the host, e.g. an external Kafka. No route out is added: the
        host does not forward for the nodes unless its owner makes it."""
        a, b = temp_link_name(self.run_id, GATEWAY_INDEX, "x"), temp_link_name(self.run_id, GATEWAY_INDEX, "y")
        ipr.link("add", ifname=a, kind="veth", peer={"ifname": b})
        ipr.link("set", index=ipr.link_lookup(ifname=b)[0], net_ns_fd=switch_netns(self.run_id))
        pidx = s.link_lookup(ifname=b)[0]
        s.link("set", index=pidx, ifname="gw")
        s.link("set", index=pidx, master=br, state="up")
        idx = ipr.link_lookup(ifname=a)[0]
        ipr.addr("add", index=idx, address=spec.gateway, prefixlen=spec.prefixlen)
        ipr.link("set", index=idx, state="up")
        self.host_gateway_ifname = a

    def _create_node(self, ipr, sw: str, s, br: int, i: int, node: Node, prefixlen: int,
                     gateway: Optional[str] = None) -> NodeHandle:
        name = netns_name(self.run_id, node.name)
        self.state.netns.append(name)
        self.state.save()
        create_netns(name)
        cg = cgroups.NodeCgroup(self.run_id, node.name)
        compute = cg.create(node.profile.cpus, node.profile.memory, node.profile.cpuset)
        a, b = temp_link_name(self.run_id, i, "x"), temp_link_name(self.run_id, i, "y")
        ipr.link("add", ifname=a, kind="veth", peer={"ifname": b})
        ipr.link("set", index=ipr.link_lookup(ifname=a)[0], net_ns_fd=name)
        ipr.link("set", index=ipr.link_lookup(ifname=b)[0], net_ns_fd=sw)
        up = plan_direction(node.link.uplink, self.caps, node.link.uplink_peers)
        down = plan_direction(node.link.downlink, self.caps, node.link.downlink_peers)
        with ns_iproute(name) as ns:
            idx = ns.link_lookup(ifname=a)[0]
            ns.link("set", index=idx, ifname="eth0")
            ns.addr("add", index=idx, address=node.address, prefixlen=prefixlen)
            ns.link("set", index=idx, state="up")
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            if gateway is not None:  # other sites are reached through the site's router
                ns.route("add", dst="default", gateway=gateway)
            apply_direction(ns, idx, up)
        pidx = s.link_lookup(ifname=b)[0]
        s.link("set", index=pidx, ifname=node.name)
        s.link("set", index=pidx, master=br, state="up")
        apply_direction(s, pidx, down)
        disable_offloads(name, ["eth0"])
        disable_offloads(sw, [node.name])
        return NodeHandle(node, name, node.name, up, down, cg, compute)

    # -- processes ---------------------------------------------------------------------
    def set_preload(self, modules: list[str]) -> None:
        self._ctx.set_forkserver_preload(modules)

    def make_stop_event(self):
        return self._ctx.Event()

    def start_node(self, node: Node, cfg, stop_event):
        """Start the node's role (and its background stress); returns the role's process."""
        from ..roles import ROLE_TARGETS, run_stress

        proc = self.start(node.name, ROLE_TARGETS[node.role], {"cfg": cfg, "stop_event": stop_event})
        stress = node.profile.stress
        if stress is not None:
            for k in range(stress.processes):
                self.start(node.name, run_stress, {"load": stress.cpu / stress.processes, "stop_event": stop_event},
                           label=f"stress{k}")
        return proc

    def start(self, node: str, target: Callable, kwargs: dict[str, Any], label: str = "") -> Any:
        h = self.handles[node]
        p = self._ctx.Process(
            target=_bootstrap,
            args=(h.netns, self.run_id, node, target, kwargs),
            name=f"edgebed-{node}{'-' + label if label else ''}",
            daemon=False,
        )
        p.start()
        h.processes.append(p)
        return p

    # -- observation -------------------------------------------------------------------
    def counters(self) -> dict[str, dict[str, int]]:
        """Per node: bytes/packets up (node -> net) and down, from the switch-side veth end."""
        out: dict[str, dict[str, int]] = {}
        for s in self._switches.values():
            for link in s.get_links():
                ifname = link.get_attr("IFLA_IFNAME")
                if ifname not in self.handles:
                    continue
                st = link.get_attr("IFLA_STATS64")
                # The switch end *receives* what the node sends (uplink) and *transmits* downlink.
                out[ifname] = {
                    "up_bytes": st["rx_bytes"], "up_packets": st["rx_packets"],
                    "down_bytes": st["tx_bytes"], "down_packets": st["tx_packets"],
                }
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
        return {"wan": {f"{a}->{b}": plan.to_meta() for (a, b), plan in self.wan_plans.items()},
                "routers": {site: router_netns(self.run_id, site) for site in self._routers}}

    def node_meta(self) -> dict:
        return {
            name: {
                "netns": h.netns,
                "compute": h.compute,
                "uplink": h.uplink.to_meta(),
                "downlink": h.downlink.to_meta(),
            }
            for name, h in self.handles.items()
        }

    # -- teardown ------------------------------------------------------------------------
    def stop_processes(self, grace: float) -> None:
        procs = [p for h in self.handles.values() for p in h.processes]
        deadline = time.monotonic() + grace
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=2)

    def teardown(self) -> list[str]:
        for ipr in list(self._switches.values()) + list(self._routers.values()):
            try:
                ipr.close()
            except Exception:
                pass
        self._switches.clear()
        self._routers.clear()
        return cleanup_run(self.run_id, self.state, stop_runner=False)
