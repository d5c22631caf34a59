"""A fleet host's device as its host's one process serves it (runtime swarm's fleets).

A device on a fleet host is a network namespace, a veth on the host's LAN and a cgroup; no
process of its own while it is idle. Its supervisor is an object in the host's process
(node.fleet.host's HostAgent): node.supervisor's RoleSupervisor, the same requests and answers, with
its own channel keys on its own two sockets (the hub knows each device by its key, and takes
its acks, states and counters only with its supervisor's), in one ZeroMQ context for the whole
host. What it runs (its trainer, its stress, a measuring job) is forked by the host's warm
forkserver (node.fleet.spawner) into its namespace and cgroup, with the device's keys alone. Its
link is shaped and read from the host's process, in its namespace.

A supervisor process a device would cost 11-14 MiB of private pages (its Python and ZeroMQ pages
written after the fork: BENCHMARKS.md), which would hold the lab to 1,000 devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from testbed.kernel.netlink import NETNS_DIR
from testbed.node import channel, control
from testbed.node.channel_keys import ChannelKeys
from testbed.node.fleet.plan import DevicePlan
from testbed.node.fleet.spawner import Forks
from testbed.node.supervisor import MAX_REQUEST, RoleSupervisor, job_main, role_main, stress_main

IDLE_STATS_EVERY = 10.0  # s between an idle device's reports (the runner takes one silent 30 s for gone)


@dataclass
class HostShare:
    """What a host's devices share: its ZeroMQ context, the forkserver, the run's stop and the
    runner's beats (heard on one device's socket, not on a thousand), the hub's URLs and the
    gateway that stands for the runner on the devices' LAN."""

    ctx: zmq.Context
    forks: Forks
    stop: Any  # node.stop_flag.StopFlag, shared with every process the forkserver forks
    beat: channel.Heartbeat
    urls: tuple[str, str]
    run: str
    runner: str
    gateway: str
    active: set = field(default_factory=set)  # the devices something runs in: tended every look


class FleetDevice(RoleSupervisor):
    """One device's supervisor in its host's process."""

    def __init__(self, device: DevicePlan, keys: ChannelKeys, supervisors: ChannelKeys, share: HostShare,
                 hears_beats: bool = False, index: int = 0):
        """`keys`: the device's (what it runs is handed them); `supervisors`: this supervisor's own;
        `index`: its place on its host (what it runs takes a uid of its own from it)."""
        self.device, self.keys, self.share, self.hears_beats = device, keys, share, hears_beats
        self.index = index
        self.netns = device.node  # (a name of node shape: node.fleet.plan checked it)
        self.cpuset: str | None = None
        self._prefixes = (f"tcp://{share.runner}:".encode(), f"tcp://{share.gateway}:".encode())
        super().__init__(device.node, *share.urls)
        self.beat = share.beat
        self.run_id = share.run
        self.sender = channel.Sender(share.urls[0], supervisors, share.ctx)

    def _listener(self, down: str) -> channel.Listener:
        topics = [channel.topic("node", self.node)] + ([channel.topic("beat")] if self.hears_beats else [])
        return channel.Listener(down, topics, max_message=MAX_REQUEST, keys=self.keys, ctx=self.share.ctx)

    def _stop_flag(self):
        return self.share.stop

    def _send_json(self, kind: str, data: dict) -> None:
        self.sender.send_json(kind, data)

    def _put(self, slot: str, text: str) -> None:
        from testbed.node.mailbox import slot_parts

        self._send_json("put", {"key": slot_parts(slot)[2], "data": text})  # (its up is the hub's: this sender's)

    def _fork(self, target: Callable, args: tuple, name: str = ""):
        """The forkserver's child for this device (not this process's: it holds every device's keys)."""
        if target is role_main:
            kind, payload = "role", {"cfg": args[0], "cpuset": self.cpuset}
        elif target is stress_main:
            kind, payload = "stress", {"load": args[0], "cpuset": self.cpuset}
        elif target is job_main:
            kind, payload = "job", {"target": args[0], "kwargs": args[1]}
        else:
            raise ValueError(f"a fleet device runs no {target.__name__}")
        process = self.share.forks.fork(kind, self.node, f"{NETNS_DIR}/{self.netns}", payload, self.keys.to_text(),
                                        self.joins(), self.index)
        self.share.active.add(self)
        return process

    def _set_affinity(self, cpuset: str) -> None:
        self.cpuset = cpuset  # the device's processes', not this one's (node.fleet.spawner sets it)

    def _join_killed(self) -> None:
        self._reap = [p for p in self._reap if p.is_alive()]  # never wait here: a thousand devices wait on this loop

    def _rewarm(self) -> None:
        pass  # the forkserver is warm

    def _next_stats_in(self) -> float:
        return super()._next_stats_in() if self._busy() else IDLE_STATS_EVERY

    def own_cgroup(self):
        from testbed.kernel.cgroups import NodeCgroup

        return NodeCgroup(self.run_id, self.node)

    def joins(self) -> tuple:
        """The device's cgroup holds what it runs: its trainer joins it before it starts anything."""
        return tuple(str(d / "cgroup.procs") for d in self.own_cgroup().dirs())

    def _request(self, payload: bytes):
        """The runner's address in a request is the gateway's (the host relays the hub's ports
        there: what the device's processes reach)."""
        return super()._request(bytes(payload).replace(*self._prefixes))

    def _on_shape(self, req: control.Shape) -> str:
        from testbed.node.own_link import OwnLink

        self.link = OwnLink(self.netns)
        return self.link.shape(req.address, req.uplink, req.downlink, req.routes)

    def _runners_path(self) -> list[str]:
        return [self.share.gateway]  # the device's processes reach the hub through its host's relay

    def _on_kernel(self, req: control.Kernel) -> str:
        import json
        from dataclasses import asdict

        from testbed.kernel.netlink import ns_iproute
        from testbed.kernel.shaping import probe_links

        with ns_iproute(self.netns) as ipr:
            return json.dumps(asdict(probe_links(ipr)))

    def close(self) -> None:
        self.listener.close()
        self.sender.close()
