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

from .scenario import Direction, Profile, Scenario

Role = Literal["ps", "worker", "evaluator", "broker", "kafka", "producer"]
"""broker: the embedded Tansu broker and the producers; kafka: Apache Kafka from its image;
producer: the producers alone (beside a kafka or an external broker)."""


@dataclass
class Link:
    node: str
    uplink: Direction  # node -> network
    downlink: Direction  # network -> node


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
    image: Optional[str] = None  # a foreign image with its own entrypoint (kafka); None: edgebed's node image

    @property
    def threads(self) -> int:
        return max(1, math.ceil(self.profile.cpus)) if self.profile.cpus else 1


@dataclass
class ClusterSpec:
    run_id: str
    subnet: str
    prefixlen: int
    gateway: str = ""
    nodes: list[Node] = field(default_factory=list)
    host_gateway: bool = False  # give the host the gateway address on the run's network (external broker)

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


def build_cluster(sc: Scenario, run_id: str) -> ClusterSpec:
    net = ipaddress.IPv4Network(sc.network.subnet)
    hosts = net.hosts()
    spec_gateway = str(next(hosts))  # reserved: Docker puts its bridge here; netns leaves it unused
    spec = ClusterSpec(run_id=run_id, subnet=str(net), prefixlen=net.prefixlen, gateway=spec_gateway)

    def add(name: str, role: Role, rank: int, ref, group=None, image=None) -> None:
        prof = sc.profile_of(ref)
        link = Link(name, prof.resolved_direction("uplink"), prof.resolved_direction("downlink"))
        spec.nodes.append(Node(name, role, rank, str(next(hosts)), _profile_label(ref), prof, link, group, image))

    add("ps", "ps", -1, sc.ps.profile)
    for rank, (name, gi) in enumerate(sc.worker_names()):
        add(name, "worker", rank, sc.workers[gi].profile, gi)
    add("eval", "evaluator", -1, sc.evaluator.profile)
    broker = sc.streaming.broker if sc.streaming is not None else None
    if broker is not None and broker.kind == "tansu":
        add("broker", "broker", -1, broker.profile)
    elif broker is not None:
        if broker.kind == "kafka":
            add("broker", "kafka", -1, broker.profile, image=broker.image)
        else:
            spec.host_gateway = True
        add("producer", "producer", -1, broker.producer_profile)
    return spec
