"""The delays a node's transport makes where the kernel makes none: its access link's (what the
link plan left to the transport) and, without netem, the WAN paths and `links:` pairs' latency
each sender's messages cross on their way to it. Pure data: the runner hands it to the node."""

from __future__ import annotations

from typing import Optional

from testbed.plan.cluster import ClusterSpec, Node


def wan_paths(node: Node, spec: ClusterSpec) -> dict[str, list[float]]:
    """Latency the kernel cannot make: the receiver holds what crossed the WAN path, and what came
    over a `links:` pair with a latency of its own (sender -> [delay, jitter]: delays sum, jitters
    add in quadrature)."""
    paths: dict[str, list[float]] = {}

    def add(sender: str, d: float, j: float) -> None:
        if d or j:
            old = paths.get(sender, [0.0, 0.0])
            paths[sender] = [old[0] + d, (old[1] ** 2 + j ** 2) ** 0.5]

    if spec.topology is not None:
        for other in spec.nodes:
            if other.site != node.site:
                add(other.name, *spec.topology.path_delay(other.site, node.site))
    for peer in node.link.downlink_peers:
        add(peer.peer, peer.direction.latency or 0.0, peer.direction.jitter or 0.0)
    return paths


def transport_delays(node: Node, plans: dict, spec: Optional[ClusterSpec] = None,
                     wan_by_transport: bool = False) -> dict:
    """The node's delays as the transport's DelaySpec takes them (up, up_jitter, down, down_jitter,
    paths). `plans`: each node's link plans as the runtime made them (node_meta: uplink/downlink
    with transport_delay_s/transport_jitter_s); `wan_by_transport`: the kernel has no netem."""
    up, down = plans[node.name]["uplink"], plans[node.name]["downlink"]
    paths = wan_paths(node, spec) if spec is not None and wan_by_transport else {}
    return {"up": up["transport_delay_s"], "up_jitter": up["transport_jitter_s"], "down": down["transport_delay_s"],
            "down_jitter": down["transport_jitter_s"], "paths": paths}
