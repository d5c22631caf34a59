"""What a fleet host is told (runtime swarm's fleets): its devices, their addresses on
its own LAN and their limits (PLAN_FILE), and apart from that their channel keys (KEY_FILE, a
mapping node -> keys, each with its supervisor's under "supervisor"), each a Docker secret of
the run that only the host's service references (runtimes.swarm.fleet). The fleet host
(node.fleet.host) reads both back and checks every field's shape before a name becomes a cgroup
or an address a route: a secret is the runner's, but a file is still only a file. Apart, because
the process that forks the devices must never hold their keys (each device is handed its own:
node.fleet.host)."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from typing import Optional

from testbed.kernel import names
from testbed.node.channel_keys import ChannelKeys

MAX_DEVICES = 16_000  # a host's devices: a /18 of addresses, a secret under Docker's 500 KB
PLAN_FILE = "/run/edgebed/fleet.json"


@dataclass(frozen=True)
class DevicePlan:
    node: str
    address: str  # on the host's LAN
    cpus: Optional[float] = None  # a CFS quota in cores
    cpu_period: Optional[float] = None  # s
    memory: Optional[int] = None  # bytes


@dataclass(frozen=True)
class FleetPlan:
    run: str
    lan: str  # the host's devices' subnet, its gateway the host
    gateway: str
    devices: list[DevicePlan]
    warm: dict = field(default_factory=dict)  # dataset, seed, test_size: loaded once, shared by every trainer

    def to_text(self) -> str:
        return json.dumps({"run": self.run, "lan": self.lan, "gateway": self.gateway, "warm": self.warm,
                           "devices": [asdict(d) for d in self.devices]})

    @classmethod
    def from_text(cls, text: str) -> "FleetPlan":
        """The plan in `text`, every field checked (ValueError naming the first that is wrong)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a fleet plan is a mapping")
        run = names.shaped("run id", data.get("run"))
        if run is None:
            raise ValueError("run: not a run id")
        lan = ipaddress.IPv4Network(str(data.get("lan")), strict=True)
        gateway = ipaddress.IPv4Address(str(data.get("gateway")))
        if gateway not in lan:
            raise ValueError(f"gateway: {gateway} is not in {lan}")
        raw = data.get("devices")
        if not isinstance(raw, list) or len(raw) > MAX_DEVICES:
            raise ValueError(f"devices: a list of at most {MAX_DEVICES}")
        devices = [_device(d, lan, gateway) for d in raw]
        seen_names, seen_addresses = {d.node for d in devices}, {d.address for d in devices}
        if len(seen_names) != len(devices) or len(seen_addresses) != len(devices):
            raise ValueError("devices: a name or an address given twice")
        warm = data.get("warm") or {}
        if not isinstance(warm, dict):
            raise ValueError("warm: a mapping")
        return cls(run.group("run"), str(lan), str(gateway), devices, warm)


def _device(d: object, lan: ipaddress.IPv4Network, gateway: ipaddress.IPv4Address) -> DevicePlan:
    if not isinstance(d, dict):
        raise ValueError("devices: each a mapping")
    node = d.get("node")
    if names.shaped("node", node) is None:
        raise ValueError(f"devices: {ascii(node)[:40]} is not a node's name")
    address = ipaddress.IPv4Address(str(d.get("address")))
    if address not in lan or address in (gateway, lan.network_address, lan.broadcast_address):
        raise ValueError(f"devices.{node}.address: {address} is not a device's address in {lan}")
    cpus, period, memory = d.get("cpus"), d.get("cpu_period"), d.get("memory")
    for name, value, kind in (("cpus", cpus, (int, float)), ("cpu_period", period, (int, float)),
                              ("memory", memory, int)):
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"devices.{node}.{name}: {value!r} is not a positive number")
    return DevicePlan(str(node), str(address), cpus, period, memory)


def keys_to_text(keys: list[tuple[ChannelKeys, ChannelKeys]]) -> str:
    """(a device's keys, its supervisor's) for each device, as KEY_FILE holds them."""
    return json.dumps({k.node: {**json.loads(k.to_text()), "supervisor": json.loads(s.to_text())} for k, s in keys})


def keys_from_text(text: str, plan: FleetPlan) -> dict[str, tuple[ChannelKeys, ChannelKeys]]:
    """Each device's keys and its supervisor's (ValueError: a device without them, keys of no
    device, or keys of another node than they are filed under)."""
    data = json.loads(text)
    if not isinstance(data, dict) or set(data) != {d.node for d in plan.devices} or \
            not all(isinstance(k, dict) and isinstance(k.get("supervisor"), dict) for k in data.values()):
        raise ValueError("keys: not exactly the plan's devices, each with its supervisor's")
    keys = {node: (ChannelKeys.from_text(json.dumps(k)), ChannelKeys.from_text(json.dumps(k["supervisor"])))
            for node, k in data.items()}
    wrong = [node for node, pair in keys.items() if {k.node for k in pair} != {node}]
    if wrong:
        raise ValueError(f"keys.{wrong[0]}: another node's keys")
    return keys
