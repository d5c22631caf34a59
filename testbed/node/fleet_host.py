"""A lab host's devices in one container (runtime swarm's fleets, issue 34):
`python -m testbed.node.fleet_host HOST UP DOWN`.

A device on swarm used to be a container of its own: about 40 MiB while idle (its supervisor
and shim) and a trainer that imported torch at the device's quota (40-46 s at 0.05 of a core),
so a thousand did not fit the lab (BENCHMARKS.md). Here one container a host holds all of that
host's devices the way the netns runtime holds them on one machine: each device a network
namespace with its own veth on the host's LAN (`fleet0`, the host its gateway), its own cgroup
inside the container's (CPU quota, memory limit), and its own supervisor (node.launch's, with
its own channel keys: the hub knows each device by its key, as any node), forked by the
Spawner after torch and the run's dataset were loaded once, so a trainer starts from warm pages.
A device costs its namespace and its supervisor's pages written after the fork (13.7 MiB
private at 1,000 devices, measured: BENCHMARKS.md). The first process (HostKeeper) holds the
keys and hands each device its own (SECURITY.md).

Traffic: a device's default route is the host, which forwards onto the run's overlay; the other
nodes route the host's LAN through its overlay address (runtimes.swarm_fleet gives them the
route). The runner's hub is not on the overlay: the host relays its two ports from the LAN's
gateway address (node.fleet_relay), and each device's supervisor reads the runner's address in
its requests as the gateway's. Each device shapes its own link, inside its namespace (node.own_link).

Needs CAP_NET_ADMIN and CAP_SYS_ADMIN (namespaces, the cgroup hierarchy mounted for the
devices' cgroups) and net.ipv4.ip_forward=1 in the container. Ends when every device's supervisor
has ended, or at SIGTERM (the service removed): the devices' processes and cgroups go with it.
"""

from __future__ import annotations

import ctypes
import gc
import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.node.channel_keys import KEY_FILE
from testbed.node.fleet_plan import PLAN_FILE, DevicePlan, FleetPlan
from testbed.node.fleet_relay import start_relay_process
from testbed.node.launch import RoleSupervisor
from testbed.plan.neighbours import mac_of

BRIDGE = "fleet0"
CGROUP_MOUNTS = Path("/run/edgebed/cgroup")  # the container's own cgroups, writable (the engine's are read-only)
CLONE_NEWNET = 0x40000000
V1_CONTROLLERS = {"cpu", "cpuacct", "memory", "cpuset", "freezer"}
STOP_GRACE = 5.0  # s the devices' supervisors have to end before their cgroups are killed


def say(line: str) -> None:
    print(f"fleet host: {line}", flush=True)  # the service's log (RUN/logs/)


# -- the devices' cgroups ------------------------------------------------------------------
def _mount(*args: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"mount {' '.join(args)}: {r.stderr.strip()}")


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


# -- a device ------------------------------------------------------------------------------
class DeviceSupervisor(RoleSupervisor):
    """A device's supervisor: node.launch's, but its usage is its own cgroup's, and the runner's
    address in what it is sent is the gateway's (the host relays the hub's ports there)."""

    def __init__(self, device: DevicePlan, run: str, urls: tuple[str, str], runner: str, gateway: str):
        self._prefixes = (f"tcp://{runner}:".encode(), f"tcp://{gateway}:".encode())
        super().__init__(device.node, *(u.encode().replace(*self._prefixes).decode() for u in urls))
        self.run_id = run

    def own_cgroup(self):
        from testbed.kernel.cgroups import NodeCgroup

        return NodeCgroup(self.run_id, self.node)

    def joins(self) -> tuple:
        """The device's cgroup holds what it runs, not its supervisor: the emulator's own work
        (requests, reports) is not the device's to pay from its quota."""
        return tuple(str(d / "cgroup.procs") for d in self.own_cgroup().dirs())

    def _request(self, payload: bytes):
        return super()._request(bytes(payload).replace(*self._prefixes))


def _read_key(fd: int, node: str):
    """The device's own channel keys, handed over a pipe by the host's keeper (HostKeeper)."""
    from testbed.node.channel_keys import ChannelKeys

    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    keys = ChannelKeys.from_text(b"".join(chunks).decode())
    if keys.node != node:
        raise ValueError(f"{node} was handed {keys.node}'s keys")
    return keys


def _device_main(device: DevicePlan, plan: FleetPlan, urls: tuple[str, str], runner: str, released: int,
                 key: int) -> int:
    """A device's process, already in its own network namespace: wait for its veth, address it,
    take its keys, then supervise the device until the run ends."""
    from testbed.kernel.rtnl import Rtnl
    from testbed.node import channel_keys

    os.read(released, 1)  # the spawner moved our veth in and made our cgroup
    os.close(released)
    prefix = ipaddress.IPv4Network(plan.lan).prefixlen
    with Rtnl() as rt:
        rt.set_link(rt.index("lo"), up=True)
        eth = rt.index("eth0")
        rt.set_link(eth, mac=mac_of(device.address))
        rt.add_address(eth, device.address, prefix)
        rt.add_neighbour(eth, plan.gateway, mac_of(plan.gateway))  # permanent: see _plug
        rt.set_link(eth, up=True)
        rt.add_default_route(plan.gateway)
    channel_keys.use(_read_key(key, device.node))
    sup = DeviceSupervisor(device, plan.run, urls, runner, plan.gateway)
    signal.signal(signal.SIGTERM, lambda *_: setattr(sup, "terminated", True))
    return sup.run()


def _spawn(device: DevicePlan, plan: FleetPlan, urls: tuple[str, str], runner: str,
           key: int, others: list[int]) -> tuple[int, int]:
    """Fork a device: the child leaves for a network namespace of its own and waits; returns its
    pid and the pipe end that releases it. `key`: the read end of its keys' pipe; `others`: the
    pipes of the devices after it, which it closes."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd in (ready_r, go_w, *others):
                os.close(fd)
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
            os.write(ready_w, b"1")
            os.close(ready_w)
            code = _device_main(device, plan, urls, runner, go_r, key)
        except BaseException as e:  # a device's failure is its own: said, and its process ends
            print(f"fleet host: {device.node}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    for fd in (ready_w, go_r, key):
        os.close(fd)
    if os.read(ready_r, 1) != b"1":
        raise RuntimeError(f"{device.node}: its process did not reach its namespace")
    os.close(ready_r)
    return pid, go_w


def _plug(device: DevicePlan, run: str, index: int, pid: int, bridge: int, gateway: int, rt) -> None:
    """The device's veth (its end `eth0` in its namespace) on the bridge, the host's ARP entry
    for it, and its cgroup (which its supervisor's children join: DeviceSupervisor.joins). The
    ARP entries both ways are permanent: the kernel's neighbour table is one for all namespaces,
    and a thousand devices' learnt entries overflowed it (gc_thresh3, 1,024: "neighbor table
    overflow", packets to the devices dropped, measured)."""
    from testbed.kernel.cgroups import NodeCgroup

    rt.add_veth(f"fd{index}", pid, "eth0", master=bridge, up=True)
    rt.add_neighbour(gateway, device.address, mac_of(device.address))
    NodeCgroup(run, device.node).create(device.cpus, device.memory, None, device.cpu_period)


# -- the host ------------------------------------------------------------------------------
def warm(spec: dict) -> None:
    """torch, the roles and edgebed's own dataset loaded once: every device's trainer forks with them."""
    import torch  # noqa: F401

    import testbed.node.roles.worker  # noqa: F401
    from testbed.data.datasets import edgebeds_own, shared_dataset

    if spec.get("dataset") and edgebeds_own(spec["dataset"]):
        try:
            shared_dataset(spec["dataset"], seed=spec.get("seed", 0), test_size=spec.get("test_size"))
        except Exception as e:  # the trainer loads it itself, and says what is wrong
            say(f"dataset {spec['dataset']} not preloaded: {type(e).__name__}: {e}")


class Spawner:
    """The process that forks the devices and reaps them: it never holds a key (each device
    reads its own from a pipe the keeper fills), so no device's trainer finds another's in the
    memory it was forked with."""

    def __init__(self, plan: FleetPlan, urls: tuple[str, str], key_pipes: list[int]):
        self.plan, self.urls, self.key_pipes = plan, urls, key_pipes
        self.runner = _address_of(urls[0])
        self.devices: dict[int, str] = {}  # pid -> device
        self.stopping = False

    def run(self, gateway: int, bridges: list[int]) -> int:
        from testbed.kernel.rtnl import Rtnl

        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        t0 = time.monotonic()
        warm(self.plan.warm)
        gc.freeze()  # what is loaded stays shared: a collection in a device would write to every object's header
        say(f"warm in {time.monotonic() - t0:.1f} s")
        t0 = time.monotonic()
        with Rtnl() as rt:
            for i, device in enumerate(self.plan.devices):
                if self.stopping:  # the service was removed while its devices came up
                    break
                pid, release = _spawn(device, self.plan, self.urls, self.runner, self.key_pipes[i],
                                      self.key_pipes[i + 1:])
                self.devices[pid] = device.node
                _plug(device, self.plan.run, i, pid, bridges[i], gateway, rt)
                os.write(release, b"1")
                os.close(release)
        say(f"{len(self.devices)} devices up in {time.monotonic() - t0:.1f} s")
        while self.devices and not self.stopping:
            self._reap()
            time.sleep(0.2)
        self.stop()
        return 0

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            node = self.devices.pop(pid, None)
            if node is not None:
                say(f"{node} ended ({os.waitstatus_to_exitcode(status)})")

    def stop(self) -> None:
        from testbed.kernel.cgroups import TOP, kill_and_remove

        for pid in self.devices:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while self.devices and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.1)
        for pid in self.devices:  # the supervisors are in the host's cgroup, not their devices'
            _signal(pid, signal.SIGKILL)
        self._reap()
        problems = kill_and_remove(f"{TOP}/{self.plan.run}")
        say("stopped" + (f"; left: {'; '.join(problems)}" if problems else ""))


class HostKeeper:
    """The container's first process: the LAN, the cgroups and the relay, then the spawner
    (forked before any key is read); then it reads the devices' keys, unmounts their file (no
    device's trainer can read it), hands each device its own over a pipe, and waits. Its memory
    holds every key: a trainer, with no capability, cannot read another process's."""

    def __init__(self, plan: FleetPlan, up: str, down: str):
        self.plan, self.urls = plan, (up, down)
        self.relay_args = (plan.gateway, [(_address_of(u), _port_of(u)) for u in self.urls])
        self.relay = self.spawner = 0
        self.stopping = False

    def run(self) -> int:
        _open_files_to_the_hard_limit()  # the relay holds two a connection, a device two or three connections
        use_cgroup_root(mount_own_cgroups())
        gateway, bridges = make_lan(self.plan)
        self.relay = start_relay_process(*self.relay_args)  # on the gateway's address, made just now
        pipes = [os.pipe() for _ in self.plan.devices]
        self.spawner = os.fork()
        if self.spawner == 0:
            code = 1
            try:
                for _, w in pipes:
                    os.close(w)
                code = Spawner(self.plan, self.urls, [r for r, _ in pipes]).run(gateway, bridges)
            finally:
                os._exit(code)
        for r, _ in pipes:
            os.close(r)
        self._hand_out_keys([w for _, w in pipes])
        return self._wait()

    def _hand_out_keys(self, writers: list[int]) -> None:
        from testbed.node.fleet_plan import keys_from_text

        keys = keys_from_text(Path(KEY_FILE).read_text(), self.plan)
        subprocess.run(["umount", KEY_FILE], check=False)  # the file is the secret's mount
        for device, w in zip(self.plan.devices, writers):
            os.write(w, keys[device.node].to_text().encode())  # a few hundred bytes: a pipe holds 64 KiB
            os.close(w)

    def _wait(self) -> int:
        while True:
            pid, status = os.wait()
            if pid == self.spawner:
                _signal(self.relay, signal.SIGKILL)
                return os.waitstatus_to_exitcode(status)
            if pid == self.relay and not self.stopping:  # the devices' way to the hub: again at once
                say(f"the hub's relay ended ({os.waitstatus_to_exitcode(status)}); started again")
                self.relay = start_relay_process(*self.relay_args)

    def stop(self) -> None:
        """SIGTERM: the spawner stops the devices (and this process ends once it has)."""
        self.stopping = True
        if self.spawner:
            _signal(self.spawner, signal.SIGTERM)


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
    keeper = HostKeeper(plan, argv[1], argv[2])
    signal.signal(signal.SIGTERM, lambda *_: keeper.stop())
    try:
        return keeper.run()
    finally:
        keeper.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
