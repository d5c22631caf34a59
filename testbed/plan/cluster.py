"""The emulated cluster as data: nodes and their access links, made from a scenario.

In Mininet's terms a `Node` is a host (its own network namespace or container, its own
cgroup) and a `Link` is its access link to the site's switch, shaped per direction.
A runtime (runtimes/) makes them real.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from typing import Literal, Optional

from testbed.plan.topology import Topology, node_site, plan_topology
from testbed.scenario.dilation import factor
from testbed.scenario.latency_traces import with_delay_start
from testbed.scenario.links import Direction, inherit
from testbed.scenario.schema import Profile, Scenario
from testbed.scenario.traces import with_trace_start

Role = Literal["ps", "worker", "evaluator", "broker", "kafka", "producer"]
"""broker: the embedded Tansu broker and the producers; kafka: Apache Kafka from its image;
producer: the producers alone (beside a kafka or an external broker)."""


@dataclass
class PeerShape:
    """Traffic of one access-link direction to or from one peer, shaped apart from the rest."""

    peer: str
    address: str
    match: Literal["dst", "src"]  # uplink classes match the destination, downlink ones the source
    direction: Direction


@dataclass
class Link:
    node: str
    uplink: Direction  # node -> network
    downlink: Direction  # network -> node
    uplink_peers: list[PeerShape] = field(default_factory=list)  # per-destination overrides (`links:`)
    downlink_peers: list[PeerShape] = field(default_factory=list)


@dataclass
class Node:
    name: str
    role: Role
    rank: int  # index among workers; -1 for ps/evaluator
    address: str
    profile_name: str
    profile: Profile
    link: Link
    group: Optional[int] = None
    site: Optional[str] = None  # its LAN (None: the one LAN of a scenario without sites)
    image: Optional[str] = None  # a foreign image with its own entrypoint (kafka); None: edgebed's node image
    host: str = ""  # the machine it runs on (placement.py; set when the plan is made)
    device_cpus: Optional[float] = None  # a device profile's quota, once its host is calibrated (run/devices.py)
    device_threads: int = 0  # and its training threads (0: from the quota)
    # a paced device (profile pace_steps): its step time for a batch of device_step_batch samples
    device_step_s: float = 0.0
    device_step_batch: int = 0
    device_step_shape: dict = field(default_factory=dict)  # its StepTime for other batches (empty: proportional)

    @property
    def threads(self) -> int:
        if self.device_threads:
            return self.device_threads
        cpus = self.profile.cpus or self.device_cpus
        return max(1, math.ceil(cpus)) if cpus else 1


@dataclass
class ClusterSpec:
    run_id: str
    subnet: str
    prefixlen: int
    gateway: str = ""
    nodes: list[Node] = field(default_factory=list)
    # the gateway address on the run's switch, where the relay to an external broker listens
    relay_gateway: bool = False
    topology: Optional[Topology] = None  # sites and WAN links; None: one LAN
    encrypt: bool = False  # the run's networks encrypted between hosts (runtime swarm's overlays)
    subnet_fixed: bool = True  # False: the scenario left network.subnet to edgebed, and a runtime may move it
    trainers_per_round: bool = False  # a worker's process starts for each round it is drawn in (fedavg)
    dilation: float = 1.0  # virtual time: the plan is the wall's, k times slower than the scenario's world

    def take_address(self, node: Node, new: str) -> None:
        """An address the runtime's engine gave `node` (a swarm task's) into the plan: the node's, and
        the peers' that shape traffic to or from it."""
        for n in self.nodes:
            for p in n.link.uplink_peers + n.link.downlink_peers:
                if p.peer == node.name:
                    p.address = new
        node.address = new

    def move_to(self, subnet: str) -> None:
        """The same plan on another subnet of the same size, every address at its old offset: a
        runtime whose engine already holds the default subnet moves the run (runtimes/docker/network.py)."""
        old, new = ipaddress.IPv4Network(self.subnet), ipaddress.IPv4Network(subnet)
        if self.subnet_fixed or self.topology is not None or new.prefixlen != old.prefixlen:
            raise ValueError(f"the plan's subnet {self.subnet} cannot move to {subnet}")

        def moved(address: str) -> str:
            return str(new.network_address + (int(ipaddress.IPv4Address(address)) - int(old.network_address)))

        self.subnet, self.gateway = str(new), moved(self.gateway)
        for n in self.nodes:
            n.address = moved(n.address)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def ps(self) -> Node:
        return next(n for n in self.nodes if n.role == "ps")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def evaluator(self) -> Node:
        return next(n for n in self.nodes if n.role == "evaluator")

    @property
    def broker(self) -> "Node | None":
        """The node that runs the broker (tansu or kafka); None for an external one."""
        return next((n for n in self.nodes if n.role in ("broker", "kafka")), None)

    @property
    def stream_source(self) -> "Node | None":
        """The node whose producers publish the streams: the tansu broker node or the producer node."""
        return next((n for n in self.nodes if n.role in ("broker", "producer")), None)


def _profile_label(ref) -> str:
    if ref is None:
        return "(default)"
    return ref if isinstance(ref, str) else "(inline)"


def _subnet_fixed(sc: Scenario, topo: Optional[Topology]) -> bool:
    """Whether the run must keep network.subnet: the scenario names it, an external broker's
    bootstrap is an address in it, or sites' subnets are cut from it."""
    external = sc.streaming is not None and sc.streaming.broker.kind == "external"
    return "subnet" in sc.network.model_fields_set or external or topo is not None


def build_cluster(sc: Scenario, run_id: str) -> ClusterSpec:
    net = ipaddress.IPv4Network(sc.network.subnet)
    topo = plan_topology(sc)
    hosts = net.hosts()
    spec_gateway = str(next(hosts))  # reserved: Docker puts its bridge here; netns leaves it unused
    spec = ClusterSpec(run_id=run_id, subnet=str(net), prefixlen=net.prefixlen, gateway=spec_gateway, topology=topo,
                       encrypt=sc.network.encrypt, subnet_fixed=_subnet_fixed(sc, topo),
                       trainers_per_round=sc.algorithm.params.get("trainers") == "per_round",
                       dilation=factor(sc))
    site_hosts = {s.name: s.hosts() for s in topo.sites} if topo else {}

    def add(name: str, role: Role, rank: int, ref, group=None, image=None, site_ref=None) -> None:
        prof = sc.profile_of(ref)
        site = node_site(sc, site_ref)
        up, down = prof.resolved_direction("uplink"), prof.resolved_direction("downlink")
        if site is not None:
            lan = sc.profile_of(sc.sites[site].lan)
            up, down = inherit(up, lan.resolved_direction("uplink")), inherit(down, lan.resolved_direction("downlink"))
        up, down = (with_delay_start(with_trace_start(d, w, sc.seed, name, spec.dilation), w, sc.seed, name,
                                     spec.dilation)
                    for d, w in ((up, "up"), (down, "down")))
        address = str(next(site_hosts[site] if site is not None else hosts))
        spec.nodes.append(Node(name, role, rank, address, _profile_label(ref), prof, Link(name, up, down), group,
                               site, image))

    add("ps", "ps", -1, sc.ps.profile, site_ref=sc.ps.site)
    for rank, (name, gi) in enumerate(sc.worker_names()):
        add(name, "worker", rank, sc.workers[gi].profile, gi, site_ref=sc.workers[gi].site)
    add("eval", "evaluator", -1, sc.evaluator.profile, site_ref=sc.evaluator.site)
    broker = sc.streaming.broker if sc.streaming is not None else None
    if broker is not None and broker.kind == "tansu":
        add("broker", "broker", -1, broker.profile, site_ref=broker.site)
    elif broker is not None:
        if broker.kind == "kafka":
            add("broker", "kafka", -1, broker.profile, image=broker.image, site_ref=broker.site)
        else:
            spec.relay_gateway = True
        add("producer", "producer", -1, broker.producer_profile, site_ref=broker.site)
    for link in sc.links:
        a, b = spec.node(link.between[0]), spec.node(link.between[1])
        for src, dst, which in ((a, b, "forward"), (b, a, "reverse")):
            d = link.resolved(which)  # type: ignore[arg-type]
            # shaped where the flow leaves the sender and where it enters the receiver
            src.link.uplink_peers.append(PeerShape(dst.name, dst.address, "dst", d))
            dst.link.downlink_peers.append(PeerShape(src.name, src.address, "src", d))
    return spec


def path_rate(spec: ClusterSpec, src: Node, dst: Node) -> Optional[float]:
    """Bottleneck rate (bit/s) of the flow src -> dst, None when nothing on it is shaped: the two
    access links (or a `links:` pair's own class, which replaces them for that flow) and every
    WAN hop between their sites."""
    pair = next((p for p in src.link.uplink_peers if p.peer == dst.name), None)
    rates = [pair.direction.rate] if pair else [src.link.uplink.rate, dst.link.downlink.rate]
    if spec.topology is not None and src.site != dst.site:
        hops = spec.topology.path(src.site, dst.site)
        rates += [spec.topology.edge(u, v).direction_from(u).rate for u, v in zip(hops, hops[1:])]
    known = [float(r) for r in rates if r is not None]
    return min(known) if known else None


def peer_table(spec: ClusterSpec, node: Node) -> dict[str, dict]:
    """For a worker: every other worker's address, the path's bottleneck rate, and whether it
    is on the same site (decentralized strategies choose per link)."""
    if node.role != "worker":
        return {}
    return {w.name: {"address": w.address, "rate_bps": path_rate(spec, node, w), "same_site": w.site == node.site}
            for w in spec.workers if w.name != node.name}
