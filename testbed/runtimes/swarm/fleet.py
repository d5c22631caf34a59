"""Runtime swarm's fleets: a per-round fleet's devices packed into one container a host.

A device as a service of its own costs about 40 MiB idle and imports torch at its own quota
(BENCHMARKS.md, "A fleet on the two-host lab"), and swarm books every device's CPU: a thousand do
not fit. When the scenario's trainers start per round (`trainers: per_round`), the workers are
devices apart from processes, and each host that holds some runs one "fleet host" service
(node.fleet.host): the devices as namespaces and cgroups inside its container, on a LAN of its
own whose gateway it is, each device with its own channel keys, served by the container's one
process (no process a device while it is idle). The host's LAN is routed: every other node gets
a route to it through the host's overlay address.

Placement books no CPU for a packed device (its quota is a cgroup inside the host's container,
and only the selected devices' trainers run: the netns runtime books none either) and deals
devices out to the hosts a placement allows, fewest first.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Optional

from testbed.errors import HostCannot
from testbed.node.fleet.plan import PLAN_FILE, DevicePlan, FleetPlan, keys_to_text
from testbed.plan.cluster import ClusterSpec, Node

FLEET_POOL = "10.205.0.0/16"  # the hosts' device LANs: clear of the lab's pools (10.201, 10.203, 10.204)
FLEET_CAPS = ["NET_ADMIN", "SYS_ADMIN"]  # namespaces, veths, the cgroup hierarchy mounted


def packs_workers(sc) -> bool:
    """Whether runtime swarm packs the scenario's workers into fleet hosts: their trainers start per round."""
    algorithm = getattr(sc, "algorithm", None)  # a scenario's stand-in may have none (tests, plugins' checks)
    return algorithm is not None and algorithm.params.get("trainers") == "per_round"


def fleet_problems(sc) -> list[str]:
    """What a packed fleet cannot have (validation's part)."""
    if not packs_workers(sc):
        return []
    out = []
    if sc.sites:
        out.append("sites: runtime swarm packs a per-round fleet's devices into one container a host, on the "
                   "run's one overlay; sites are not supported with them yet (use runtime netns)")
    if any(sc.profile_of(g.profile).has_gpus() for g in sc.workers):
        out.append("workers: runtime swarm packs a per-round fleet's devices into one container a host, which gives "
                   "them no GPU")
    return out


def device_lans(counts: dict[str, int], pool: str = FLEET_POOL) -> dict[str, ipaddress.IPv4Network]:
    """Each host's LAN (host -> subnet) from `pool`: the smallest block that holds its devices,
    the gateway, the network and broadcast addresses, one after another."""
    net = ipaddress.IPv4Network(pool)
    cursor, out = int(net.network_address), {}
    for host in sorted(counts):
        size = 1 << max(2, (counts[host] + 2).bit_length())  # devices + gateway + network + broadcast
        cursor = -(-cursor // size) * size  # aligned
        if cursor + size > int(net.broadcast_address) + 1:
            raise HostCannot(f"runtime swarm: {sum(counts.values())} devices do not fit the fleet pool {pool}")
        out[host] = ipaddress.IPv4Network((cursor, 32 - size.bit_length() + 1))
        cursor += size
    return out


@dataclass
class FleetHostService:
    host: Any  # hosts.SwarmHost
    name: str  # fh-<k>: a '-', which no node's name has
    lan: ipaddress.IPv4Network
    devices: list[Node] = field(default_factory=list)
    service: Any = None
    address: str = ""  # on the run's overlay: the next hop to its LAN


class SwarmFleet:
    """The fleet hosts of one run (made by runtime swarm's create, after the overlay)."""

    def __init__(self, rt, spec: ClusterSpec, devices: list[Node]):
        self.rt, self.spec = rt, spec
        by_host: dict[str, list[Node]] = {}
        for node in devices:
            by_host.setdefault(node.host, []).append(node)
        lans = device_lans({h: len(ns) for h, ns in by_host.items()})
        overlay = ipaddress.IPv4Network(spec.subnet)
        clash = [str(lan) for lan in lans.values() if lan.overlaps(overlay)]
        if clash:
            raise HostCannot(f"network.subnet: {spec.subnet} overlaps the fleet hosts' LANs ({', '.join(clash)}); "
                               f"choose a subnet outside {FLEET_POOL}")
        hosts = {h.hostname: h for h in rt.hosts}
        self.hosts = [FleetHostService(hosts[h], f"fh-{k}", lans[h], ns)
                      for k, (h, ns) in enumerate(sorted(by_host.items()))]
        self.of: dict[str, FleetHostService] = {n.name: fh for fh in self.hosts for n in fh.devices}

    def plan(self, fh: FleetHostService, warm: dict) -> FleetPlan:
        """The host's devices at their addresses (given into the run's plan) with their limits."""
        addresses = fh.lan.hosts()
        gateway = str(next(addresses))
        devices = []
        for node, address in zip(fh.devices, addresses):
            self.spec.take_address(node, str(address))
            p = node.profile
            devices.append(DevicePlan(node.name, str(address), p.cpus, p.cpu_period, p.memory))
        return FleetPlan(self.rt.run_id, str(fh.lan), gateway, devices, warm)

    def create(self, network, warm: dict) -> None:
        """Each host's service, with its plan and, apart, its devices' channel keys (node.fleet.plan)."""
        for fh in self.hosts:
            plan = self.rt.secret(f"{fh.name}-plan", self.plan(fh, warm).to_text(), PLAN_FILE)
            keys = self.rt.secret(fh.name, keys_to_text([(self.rt.keys.admit(n.name, n.role),
                                                          self.rt.keys.supervisor(n.name)) for n in fh.devices]))
            fh.service = self.rt.service(fh.name, fh.host, [(network, fh.name)], secret=[plan, keys], caps=FLEET_CAPS,
                                         sysctls={"net.ipv4.ip_forward": "1"},
                                         command=["python", "-m", "testbed.node.fleet"],
                                         args=[fh.name, *self.rt.channel_urls()])

    def services(self) -> dict[str, Any]:
        return {fh.name: fh.service for fh in self.hosts}

    def take_addresses(self, tasks: dict[str, dict], network) -> None:
        for fh in self.hosts:
            fh.address = self.rt.address_on(tasks[fh.name], network)

    def routes(self) -> dict[str, str]:
        """Every fleet host's LAN through its overlay address (the routes of every other node)."""
        return {str(fh.lan): fh.address for fh in self.hosts}

    def first_devices(self) -> set[str]:
        """Each host's first device: the kernel and the clock it finds are its host's, which every
        device of the host shares (asked once a host, not a thousand times)."""
        return {fh.devices[0].name for fh in self.hosts}

    def first_of(self, node: str) -> Optional[str]:
        fh = self.of.get(node)
        return fh.devices[0].name if fh is not None else None

    def host_service(self, node: str) -> Optional[Any]:
        fh = self.of.get(node)
        return fh.service if fh is not None else None
