"""The run's Docker network on a subnet the engine does not already hold.

Two runs of scenarios that leave `network.subnet` at its default would both ask the engine for
10.77.0.0/16, and the second would fail with Docker's "Pool overlaps". Like Compose, which picks a
free address pool for each project, a run whose subnet edgebed chose moves to the next free block
of the same size (every address at its old offset: ClusterSpec.move_to). A subnet the scenario
names is the user's: a clash with it is refused in one line naming the field. The engine decides
overlaps itself (its network create is atomic), so two runs starting at once cannot both win.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable, Iterator

from testbed.errors import HostCannot
from testbed.plan.cluster import ClusterSpec

MAX_MOVES = 64  # blocks of the subnet's size tried after it before giving up


def engine_subnets(client) -> dict[str, str]:
    """subnet -> the name of the engine's network that holds it."""
    out = {}
    for net in client.networks.list():
        for pool in (net.attrs.get("IPAM") or {}).get("Config") or []:
            if pool.get("Subnet"):
                out[pool["Subnet"]] = net.name
    return out


def _holder(subnet: ipaddress.IPv4Network, held: dict[str, str]) -> str | None:
    for other, name in held.items():
        try:
            if subnet.overlaps(ipaddress.ip_network(other)):
                return name
        except ValueError:  # an IPv6 pool, or one Docker wrote oddly: not ours to judge
            continue
    return None


def candidates(subnet: str) -> Iterator[ipaddress.IPv4Network]:
    """`subnet`, then the next blocks of its size, private ones only."""
    net = ipaddress.IPv4Network(subnet)
    for k in range(MAX_MOVES + 1):
        start = int(net.network_address) + k * net.num_addresses
        if start + net.num_addresses > 2 ** 32:
            return
        block = ipaddress.IPv4Network((start, net.prefixlen))
        if block.is_private:
            yield block


def create_run_network(client, spec: ClusterSpec, create: Callable[[str, str], Any],
                       say: Callable[[str], None]) -> Any:
    """`create(subnet, gateway)` on the plan's subnet, or on the first free block after it when the
    plan may move (spec.subnet_fixed False); the plan is moved to where the network was made."""
    import docker

    wanted, held = spec.subnet, engine_subnets(client)
    for block in candidates(wanted) if not spec.subnet_fixed else [ipaddress.IPv4Network(wanted)]:
        holder = _holder(block, held)
        if holder is None:
            if str(block) != spec.subnet:
                spec.move_to(str(block))
            try:
                network = create(spec.subnet, spec.gateway)
            except docker.errors.APIError as e:
                if "overlaps" not in str(e):
                    raise
                holder = "one made at the same moment"  # another run won the block: try the next
                held = engine_subnets(client)  # and see what else was made meanwhile
            else:
                if spec.subnet != wanted:
                    say(f"network.subnet: {wanted} is in use on this Docker engine; this run uses {spec.subnet} "
                        "(name a subnet in the scenario to choose it)")
                return network
        if spec.subnet_fixed:
            raise HostCannot(f"network.subnet: {wanted} overlaps the Docker engine's network {holder}; name a "
                               "free subnet, or leave network.subnet out and edgebed picks one")
    raise HostCannot(f"network.subnet: no free /{spec.prefixlen} among the {MAX_MOVES} after {wanted} on this "
                       "Docker engine; name a free subnet")
