"""A lab host's devices in one container (runtime swarm's fleets):
`python -m testbed.node.fleet HOST UP DOWN`.

A container a device would cost about 40 MiB while idle (its supervisor and shim) and a
trainer that imports torch at the device's quota (most of a minute at 0.05 of a core), so a
thousand would not fit the lab (BENCHMARKS.md). Here one container a host holds all of that
host's devices the way the netns runtime holds them on one machine: each device a network
namespace with its own veth on the host's LAN (`fleet0`, the host its gateway) and its own
cgroup inside the container's (CPU quota, memory limit), and no process while it is idle. The
container's first process (HostAgent) serves every device's requests, each device with its
own channel keys (the hub knows each device by its key, as any node: node.fleet.device); a
forkserver loaded with torch and the run's dataset forks each device's trainer into its
namespace and cgroup, with that device's keys alone (node.fleet.spawner). A supervisor process
a device, even forked warm, would cost 11-14 MiB of private pages (BENCHMARKS.md), which would
hold the lab to 1,000 devices.

Traffic: a device's default route is the host, which forwards onto the run's overlay; the other
nodes route the host's LAN through its overlay address (runtimes.swarm.fleet gives them the
route). The runner's hub is not on the overlay: the host relays its two ports from the LAN's
gateway address (node.fleet.relay), and each device's requests carry the runner's address as
the gateway's (what its trainer reaches); the host's process reaches the hub itself. A
device's link is shaped and read by the host's process inside the device's namespace
(node.own_link).

Needs CAP_NET_ADMIN and CAP_SYS_ADMIN (namespaces, the cgroup hierarchy mounted for the
devices' cgroups) and net.ipv4.ip_forward=1 in the container. Ends at the run's stop (the
runner's word, or its silence) or at SIGTERM (the service removed): the devices' processes and
cgroups go with it, their namespaces with the container.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.errors import HostCannot
from testbed.node.channel_keys import KEY_FILE, ChannelKeys
from testbed.node.fleet.plan import PLAN_FILE, DevicePlan, FleetPlan
from testbed.node.fleet.relay import start_relay_process
from testbed.plan.neighbours import mac_of

BRIDGE = "fleet0"
CGROUP_MOUNTS = Path("/run/edgebed/cgroup")  # the container's own cgroups, writable (the engine's are read-only)
V1_CONTROLLERS = {"cpu", "cpuacct", "memory", "cpuset", "freezer"}
STOP_GRACE = 5.0  # s the devices' processes have to end at the run's stop before they are killed


def say(line: str) -> None:
    print(f"fleet host: {line}", flush=True)  # the service's log (RUN/logs/)


# -- the devices' cgroups ------------------------------------------------------------------
def _mount(*args: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise HostCannot(f"mount {' '.join(args)}: {r.stderr.strip()}")


def mount_own_cgroups(proc_cgroup: str = "/proc/self/cgroup") -> Path:
    """The container's own cgroups, writable, at CGROUP_MOUNTS: on cgroup v1 each controller's
    hierarchy mounted and the container's folder of it bound there (so a device's cgroup is inside
    the container's, counted and removed with it); on v2 the namespace's root (the container's),
    this process moved into a leaf of its own first (v2 lets no process sit beside child groups)."""
    lines = [ln.split(":", 2) for ln in Path(proc_cgroup).read_text().splitlines() if ln.count(":") >= 2]
    v1 = [(ctrls, path) for _, ctrls, path in lines if set(ctrls.split(",")) & V1_CONTROLLERS]
    if not v1:
        CGROUP_MOUNTS.mkdir(parents=True, exist_ok=True)
        _mount("-t", "cgroup2", "cgroup2", str(CGROUP_MOUNTS))
        (CGROUP_MOUNTS / "fleet-host").mkdir(exist_ok=True)
        (CGROUP_MOUNTS / "fleet-host" / "cgroup.procs").write_text(str(os.getpid()))
        return CGROUP_MOUNTS
    for ctrls, path in v1:
        whole, own = Path("/run/edgebed/cgroup-hierarchy") / ctrls, CGROUP_MOUNTS / ctrls
        whole.mkdir(parents=True, exist_ok=True)
        own.mkdir(parents=True, exist_ok=True)
        _mount("-t", "cgroup", "-o", ctrls, "cgroup", str(whole))
        _mount("--bind", str(whole / path.lstrip("/")), str(own))
        subprocess.run(["umount", "-l", str(whole)], check=False)  # the whole hierarchy is not the devices' to see
    return CGROUP_MOUNTS


def use_cgroup_root(root: Path) -> None:
    """kernel.cgroups' node cgroups made under `root` from now on (this process and its forks)."""
    from testbed.kernel import cgroups

    cgroups.ROOT = root


# -- the LAN -------------------------------------------------------------------------------
def make_lan(plan: FleetPlan) -> tuple[int, list[int]]:
    """The bridge the devices' veths join (a tree of bridges past one bridge's ports:
    kernel.bridges), the host's gateway address on it; its ifindex and each device's bridge's."""
    from pyroute2 import IPRoute

    from testbed.kernel.bridges import BridgeTree

    prefix = ipaddress.IPv4Network(plan.lan).prefixlen
    with IPRoute() as ipr:
        ipr.link("add", ifname=BRIDGE, kind="bridge")
        index = ipr.link_lookup(ifname=BRIDGE)[0]
        ipr.link("set", index=index, address=mac_of(plan.gateway))
        ipr.addr("add", index=index, address=plan.gateway, prefixlen=prefix)
        ipr.link("set", index=index, state="up")
        tree = BridgeTree(ipr, index, BRIDGE, len(plan.devices))
        return index, [tree.bridge_for(i) for i in range(len(plan.devices))]


# -- the devices ---------------------------------------------------------------------------
def plug(device: DevicePlan, plan: FleetPlan, index: int, bridge: int, gateway: int, rt) -> None:
    """A device: its network namespace (bound at /run/netns/NODE, no process in it), its veth
    (`eth0` inside, on the LAN's bridge), addressed with the gateway as its default route, the
    ARP entries both ways, and its cgroup. The ARP entries are permanent: the kernel's neighbour
    table is one for all namespaces, and a thousand devices' learnt entries overflowed it
    (gc_thresh3, 1,024: "neighbor table overflow", packets to the devices dropped, measured)."""
    from testbed.kernel.cgroups import NodeCgroup
    from testbed.kernel.netlink import LOOPBACK_INDEX, create_netns
    from testbed.kernel.rtnl import Rtnl

    create_netns(device.node)
    rt.add_veth(f"fd{index}", device.node, "eth0", master=bridge, up=True)
    rt.add_neighbour(gateway, device.address, mac_of(device.address))
    with Rtnl(device.node) as inside:
        inside.set_link(LOOPBACK_INDEX, up=True)
        eth = inside.index("eth0")
        inside.set_link(eth, mac=mac_of(device.address))
        inside.add_address(eth, device.address, ipaddress.IPv4Network(plan.lan).prefixlen)
        inside.add_neighbour(eth, plan.gateway, mac_of(plan.gateway))
        inside.set_link(eth, up=True)
        inside.add_default_route(plan.gateway)
    NodeCgroup(plan.run, device.node).create(device.cpus, device.memory, None, device.cpu_period)


def make_devices(plan: FleetPlan, gateway: int, bridges: list[int]) -> None:
    from testbed.kernel.rtnl import Rtnl

    t0 = time.monotonic()
    with Rtnl() as rt:
        for i, device in enumerate(plan.devices):
            plug(device, plan, i, bridges[i], gateway, rt)
    say(f"{len(plan.devices)} devices made in {time.monotonic() - t0:.1f} s")


# -- the host ------------------------------------------------------------------------------
def warm(spec: dict) -> None:
    """torch, the roles and edgebed's own dataset loaded once: every device's trainer forks with them."""
    import torch  # noqa: F401

    import testbed.node.roles.worker  # noqa: F401
    from testbed.data.datasets import edgebeds_own, shared_dataset

    t0 = time.monotonic()
    if spec.get("dataset") and edgebeds_own(spec["dataset"]):
        try:
            shared_dataset(spec["dataset"], seed=spec.get("seed", 0), test_size=spec.get("test_size"))
        except Exception as e:  # the trainer loads it itself, and says what is wrong
            say(f"dataset {spec['dataset']} not preloaded: {type(e).__name__}: {e}")
    say(f"forkserver warm in {time.monotonic() - t0:.1f} s")


class HostAgent:
    """The container's first process, and the one that speaks for every device: the LAN, the
    cgroups, the relay and the forkserver (forked before any key is read), the devices'
    namespaces and links; then it reads the devices' keys, unmounts their file (no trainer can
    read it), and serves each device's requests (node.fleet.device) until the run's end. Its
    memory holds every key: a trainer, with no capability, cannot read another process's."""

    def __init__(self, plan: FleetPlan, up: str, down: str):
        self.plan, self.urls = plan, (up, down)
        self.relay_args = (plan.gateway, [(_address_of(u), _port_of(u)) for u in self.urls])
        self.relay = self.forkserver = 0
        self.terminated = False
        self.devices: list = []

    def run(self) -> int:
        import multiprocessing as mp

        from testbed.node.stop_flag import StopFlag

        _open_files_to_the_hard_limit()  # the relay holds two a connection; this process two sockets a device
        use_cgroup_root(mount_own_cgroups())
        gateway, bridges = make_lan(self.plan)
        self.relay = start_relay_process(*self.relay_args)  # on the gateway's address, made just now
        stop = StopFlag(mp.get_context("fork"))  # the forkserver's children see it set
        forks = self._start_forkserver(stop)
        make_devices(self.plan, gateway, bridges)
        keys = self._read_keys()
        self._serve(forks, stop, keys)
        return 0

    def _start_forkserver(self, stop):
        import socket

        from testbed.node.fleet.spawner import Forks, Forkserver

        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.forkserver = os.fork()
        if self.forkserver == 0:
            code = 1
            try:
                mine.close()
                code = Forkserver(theirs, stop, lambda: warm(self.plan.warm), hidden=(str(CGROUP_MOUNTS),)).run()
            finally:
                os._exit(code)
        theirs.close()
        return Forks(mine)

    def _read_keys(self) -> dict[str, tuple[ChannelKeys, ChannelKeys]]:
        from testbed.node.fleet.plan import keys_from_text

        keys = keys_from_text(Path(KEY_FILE).read_text(), self.plan)
        subprocess.run(["umount", KEY_FILE], check=False)  # the file is the secret's mount
        return keys

    def _serve(self, forks, stop, keys: dict[str, tuple[ChannelKeys, ChannelKeys]]) -> None:
        import zmq

        from testbed.node import channel
        from testbed.node.fleet.device import FleetDevice, HostShare
        from testbed.node.supervisor import HEARTBEAT_TIMEOUT

        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, 2 * len(self.plan.devices) + 64)
        share = HostShare(ctx, forks, stop, channel.Heartbeat(HEARTBEAT_TIMEOUT), self.urls, self.plan.run,
                          _address_of(self.urls[0]), self.plan.gateway)
        # each with its keys and its supervisor's, and a uid of its own from its place
        self.devices = [FleetDevice(d, *keys[d.node], share, hears_beats=i == 0, index=i)
                        for i, d in enumerate(self.plan.devices)]
        keys.clear()
        say(f"serving {len(self.devices)} devices")
        try:
            self._loop(forks, stop, share.active)
        finally:
            self._end(stop, ctx)

    def _loop(self, forks, stop, active: set) -> None:
        import zmq

        from testbed.node.supervisor import IDLE_POLL, RoleSupervisor

        poller = zmq.Poller()
        by_socket = {}
        for device in self.devices:
            poller.register(device.listener.socket, zmq.POLLIN)
            by_socket[device.listener.socket] = device
        poller.register(forks.fileno(), zmq.POLLIN)
        ending_since, tend_all_at = None, 0.0
        while True:
            ready = poller.poll(int((RoleSupervisor.POLL if active else IDLE_POLL) * 1000))
            forks.pump()
            for sock, _ in ready:
                if sock in by_socket:
                    by_socket[sock]._listen(0)
            if self.terminated or (self.devices and self.devices[0].beat.stopped()):
                stop.set()  # SIGTERM, or the runner said stop or went silent
            # the devices something runs in at every look, the idle ones (their reports) twice a second
            now = time.monotonic()
            tend_all = now >= tend_all_at
            for device in (self.devices if tend_all else list(active)):
                device.terminated = self.terminated
                device.tend()
                if not device._busy():
                    active.discard(device)
            tend_all_at = now + IDLE_POLL if tend_all else tend_all_at
            self._keep_relay()
            if stop.is_set():
                ending_since = ending_since or now
                if not active or now - ending_since > STOP_GRACE:
                    return  # (the forkserver kills what is left)

    def _keep_relay(self) -> None:
        try:
            pid, status = os.waitpid(self.relay, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.relay, 0
        if pid == self.relay and not self.terminated:  # the devices' way to the hub: again at once
            say(f"the hub's relay ended ({os.waitstatus_to_exitcode(status)}); started again")
            self.relay = start_relay_process(*self.relay_args)

    def _end(self, stop, ctx) -> None:
        """The devices' processes stopped (the forkserver gives them STOP_GRACE), their cgroups
        removed; the last reports leave, then the relay goes."""
        from testbed.kernel.cgroups import TOP, kill_and_remove

        stop.set()
        for device in self.devices:
            device._kill(device.stress + list(device.jobs.values()))
            device.close()
        _signal(self.forkserver, signal.SIGTERM)
        try:
            os.waitpid(self.forkserver, 0)
        except ChildProcessError:
            pass
        problems = kill_and_remove(f"{TOP}/{self.plan.run}")
        ctx.term()  # (the senders' last messages leave first, up to their linger)
        _signal(self.relay, signal.SIGKILL)
        say("stopped" + (f"; left: {'; '.join(problems)}" if problems else ""))

    def stop(self) -> None:
        """SIGTERM (the service removed): the devices stop, then this process."""
        self.terminated = True


def _open_files_to_the_hard_limit() -> None:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _signal(pid: int, sig: int) -> None:
    if pid <= 0:
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _address_of(url: str) -> str:
    return url.split("://", 1)[1].rsplit(":", 1)[0]


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def main(argv: list[str]) -> int:
    """argv: HOST UP DOWN (the hub's URLs, as the runner reaches them)."""
    try:
        plan = FleetPlan.from_text(Path(PLAN_FILE).read_text())
    except (OSError, ValueError) as e:
        print(f"fleet host {argv[0]}: no usable plan at {PLAN_FILE}: {e}", file=sys.stderr)
        return 2
    agent = HostAgent(plan, argv[1], argv[2])
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    return agent.run()
