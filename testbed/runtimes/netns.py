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
from ..netlink import create_netns, disable_offloads, enter_netns, ns_iproute
from ..shaping import DirectionPlan, KernelCaps, apply_direction, plan_direction, probe_kernel
from ..state import RunState, cleanup_run, temp_link_name

PR_SET_PDEATHSIG = 1
BRIDGE = "br0"
GATEWAY_INDEX = 0xFFF  # the host's veth to the switch keeps its temporary name: `down` finds it by that


def netns_name(run_id: str, node: str) -> str:
    return f"eb-{run_id}-{node}"


def switch_netns(run_id: str) -> str:
    return f"eb-{run_id}-sw"


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
        self._sw_ns = None
        self.host_gateway_ifname: Optional[str] = None

    # -- bring-up --------------------------------------------------------------------
    def create(self, spec: ClusterSpec) -> None:
        from pyroute2 import IPRoute

        sw = switch_netns(self.run_id)
        self.state.netns.append(sw)
        self.state.save()
        create_netns(sw)
        self._sw_ns = ns_iproute(sw)
        s = self._sw_ns
        s.link("add", ifname=BRIDGE, kind="bridge")
        br = s.link_lookup(ifname=BRIDGE)[0]
        s.link("set", index=br, state="up")
        with IPRoute() as ipr:
            for i, node in enumerate(spec.nodes):
                if node.image is not None:
                    raise RuntimeError(f"node {node.name} runs the image {node.image}: that needs the docker runtime")
                self.handles[node.name] = self._create_node(ipr, s, br, i, node, spec.prefixlen)
            if spec.host_gateway:
                self._create_host_gateway(ipr, s, br, spec)

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

    def _create_node(self, ipr, s, br: int, i: int, node: Node, prefixlen: int) -> NodeHandle:
        name = netns_name(self.run_id, node.name)
        self.state.netns.append(name)
        self.state.save()
        create_netns(name)
        cg = cgroups.NodeCgroup(self.run_id, node.name)
        compute = cg.create(node.profile.cpus, node.profile.memory, node.profile.cpuset)
        a, b = temp_link_name(self.run_id, i, "x"), temp_link_name(self.run_id, i, "y")
        ipr.link("add", ifname=a, kind="veth", peer={"ifname": b})
        ipr.link("set", index=ipr.link_lookup(ifname=a)[0], net_ns_fd=name)
        ipr.link("set", index=ipr.link_lookup(ifname=b)[0], net_ns_fd=switch_netns(self.run_id))
        up = plan_direction(node.link.uplink, self.caps)
        down = plan_direction(node.link.downlink, self.caps)
        with ns_iproute(name) as ns:
            idx = ns.link_lookup(ifname=a)[0]
            ns.link("set", index=idx, ifname="eth0")
            ns.addr("add", index=idx, address=node.address, prefixlen=prefixlen)
            ns.link("set", index=idx, state="up")
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            apply_direction(ns, idx, up)
        pidx = s.link_lookup(ifname=b)[0]
        s.link("set", index=pidx, ifname=node.name)
        s.link("set", index=pidx, master=br, state="up")
        apply_direction(s, pidx, down)
        disable_offloads(name, ["eth0"])
        disable_offloads(switch_netns(self.run_id), [node.name])
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
        if self._sw_ns is None:
            return out
        for link in self._sw_ns.get_links():
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
        if self._sw_ns is not None:
            try:
                self._sw_ns.close()
            except Exception:
                pass
            self._sw_ns = None
        return cleanup_run(self.run_id, self.state, stop_runner=False)
