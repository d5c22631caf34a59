"""The LXC-style runtime: each node is a network namespace plus a cgroup, Mininet's host model.

    node netns eb-<run>-<node>         switch netns eb-<run>-sw
    eth0 (addr, uplink HTB) <== veth ==> <node> (downlink HTB) -- br0

The network (switches, and for multi-site topologies routers and WAN links) is built by
fabric.Fabric in namespaces of its own, so the host's iptables (Docker sets the FORWARD
policy to DROP and sends bridged traffic through it) never see the cluster's traffic, and
nothing of the cluster has a route out of the machine.

Node processes are forked from a forkserver that has already imported torch (one
import for the whole cluster, pages shared), each as PID 1 of a PID namespace of its own
(kernel.pid_namespace; per-round trainers and an MPS daemon's clients keep the host's: see
create), then each joins its cgroup and network namespace, lets go of the
forkserver's handles and becomes its node's own unprivileged uid (kernel.identity) before it
runs its role.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import multiprocessing.forkserver
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from testbed.errors import HostCannot
from testbed.kernel import cgroups, pid_namespace
from testbed.kernel.files import open_nofollow
from testbed.kernel.gpus import host_gpus
from testbed.kernel.identity import NodeIdentity, node_identity
from testbed.kernel.mounts import Bridge, bridges, make_bridges, read_only_host_controls
from testbed.kernel.netlink import create_netns, enter_netns
from testbed.kernel.parent_death import ParentWatch, die_with_parent
from testbed.kernel.privileges import drop_privileges
from testbed.kernel.shaping import DirectionPlan, KernelCaps
from testbed.node import channel_keys
from testbed.node.stop_flag import SealedStopFlag
from testbed.plan.cluster import ClusterSpec, Node
from testbed.runtimes.base import Features, NodeProcess, Runtime, StopEvent, Unavailable, needs_root
from testbed.runtimes.fabric import Fabric
from testbed.runtimes.gpu_share import GpuGrant, MpsDaemon, grant, wants_mps
from testbed.runtimes.local_nodes import LocalNodeOps, netns_name, unencrypted_problems
from testbed.runtimes.netns.deferred import Deferred
from testbed.runtimes.netns.forkserver_guard import PID_NAMESPACES_ENV, RUNNER_ENV, request_main
from testbed.runtimes.netns.forkserver_process import ForkserverProcess
from testbed.runtimes.state import RunState, cleanup_run
from testbed.scenario.units import stress_loads

# what a node runs is handed over as `module:function` data: no runtime imports the roles
STRESS_TARGET = "testbed.node.roles.stress:run_stress"


def _bootstrap(netns: str, run_id: str, node: str, target: Callable | str, kwargs,
               env: Optional[dict] = None, keys: Optional[channel_keys.ChannelKeys] = None,
               identity: Optional[NodeIdentity] = None, reach: tuple[Bridge, ...] = ()) -> None:
    """First thing in every node process: die with the runner, join cgroup and namespace, take the
    node's environment (its GPUs: read when CUDA starts, later), let go of the forkserver, see
    the host's cgroup files and sysctls read-only and the runner's interpreter and code through
    `reach`'s bridges, give up every capability and become the node's own uid, then
    run `target` (a function, or `module:function`: a role, imported here and not by the runner)
    with `kwargs` (a Deferred, opened only now: deferred.py)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle
    os.environ.update(env or {})
    channel_keys.use(keys)  # its node's channel keys: in this process's memory only
    die_with_parent(signal.SIGKILL)
    parent = ParentWatch(pid_namespace.forked_by or os.getppid())
    if parent.gone():  # it went before the death signal held
        os._exit(1)
    cgroups.NodeCgroup(run_id, node).attach(os.getpid())
    enter_netns(netns)
    _leave_forkserver()
    read_only_host_controls(hide_others=True)  # a mount namespace and a /proc of its own (its PID namespace's)
    make_bridges(list(reach))
    drop_privileges(identity)  # the role, a command's program, a job: none of the runner's powers (SECURITY.md)
    if parent.gone():  # it went while the death signal was being set again (kernel.identity)
        os._exit(1)
    parent.close()
    if isinstance(target, str):
        module, _, func = target.partition(":")
        target = getattr(importlib.import_module(module), func)
    try:
        target(**kwargs.open())
    finally:
        channel = sys.modules.get("testbed.node.channel")
        if channel is not None:  # the role's last records leave before the process exits
            channel.flush()


def _leave_forkserver() -> None:
    """Forget the runner's forkserver and resource tracker, whose handles a forked child inherits:
    a node that starts processes of its own starts its own forkserver and tracker, as its uid."""
    from multiprocessing import forkserver, resource_tracker

    server, tracker = forkserver._forkserver, resource_tracker._resource_tracker
    for fd in (server._forkserver_alive_fd, tracker._fd):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    tracker._fd = tracker._pid = None


def reached_paths() -> list[str]:
    """What a node's processes read of the runner's host: the interpreter and its library, every
    import path and the folder each loaded package came from, the runner's working folder."""
    found = [sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, os.getcwd(), *sys.path]
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if "." not in name and isinstance(where, str):
            found.append(os.path.dirname(os.path.dirname(where) if where.endswith("__init__.py") else where))
    return sorted({os.path.realpath(p) for p in found if p and os.path.exists(p)})


def _own_file(path: Path, identity: NodeIdentity) -> None:
    """`path` made (never followed, if a link) and given to `identity`, mode 0600."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fchown(fd, identity.uid, identity.gid)
    finally:
        os.close(fd)


def stop_forkserver() -> None:
    """Stop this process's forkserver, if one runs (the next node starts a new one)."""
    server = mp.forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None and hasattr(server, "_stop"):
        server._stop()  # private, but there since 3.8 and what CPython's own tests use


@dataclass
class NetnsNode:
    """A node of the netns runtime: its namespace, cgroup, link plans and processes (base.NodeHandle)."""
    node: Node
    netns: str
    peer_ifname: str  # the veth end in the switch namespace
    uplink: DirectionPlan
    downlink: DirectionPlan
    cgroup: cgroups.NodeCgroup
    compute: dict
    identity: NodeIdentity
    processes: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # what the node's processes start with (gpu_share.grant)


class NetnsRuntime(LocalNodeOps, Runtime):
    name = "netns"
    features = Features(shared_data=True, concurrent_flows=True, same_host=True)
    auto_rank = 1  # after docker: needs nothing but root

    @classmethod
    def available(cls) -> Optional[Unavailable]:
        return needs_root(cls.name)

    @classmethod
    def scenario_problems(cls, sc) -> list[str]:
        from testbed.scenario.schema import KAFKA_NEEDS, uses_kafka_image

        lines = unencrypted_problems(sc)
        if uses_kafka_image(sc):  # whether an engine answers is the docker runtime's preflight
            lines.append(f"streaming.broker.kind: {KAFKA_NEEDS} and needs the docker runtime (runtime: docker or auto)")
        return lines

    @classmethod
    def problems(cls, sc) -> list[str]:
        """This machine's GPUs, where the scenario asks for some; its memory and open files for the nodes."""
        from testbed.runtimes.preflight import capacity_problems, host_gpu_problems
        from testbed.scenario.schema import gpu_fields

        return (host_gpu_problems(sc) if gpu_fields(sc) else []) + capacity_problems(sc)

    def __init__(self, state: RunState, caps: Optional[KernelCaps] = None):
        super().__init__(state, caps)
        self._stop_event = None
        self._ctx = mp.get_context("forkserver")
        self.fabric = Fabric(state, self.caps)
        self.mps: Optional[MpsDaemon] = None
        self.reach: tuple[Bridge, ...] = ()

    # -- bring-up --------------------------------------------------------------------
    def create(self, spec: ClusterSpec) -> None:
        for node in spec.nodes:
            if node.image is not None:
                raise HostCannot(f"node {node.name} runs the image {node.image}: that needs the docker runtime")
        grants = self._grant_gpus(spec)
        # read by the forkserver as it starts (the first node's start): an MPS daemon's clients stay
        # in its PID namespace, untried apart; so do per-round trainers, whose namespaces would make
        # a large fleet's rounds slower than the seal may cost (BENCHMARKS.md, "A sealed node")
        apart = self.mps is None and not spec.trainers_per_round
        os.environ[PID_NAMESPACES_ENV] = "1" if apart else "0"
        computes = {}
        # recorded first, all at once (a save a node grew as the square of the fleet): `down` finds
        # them even if we crash next, and passes over those not made yet
        self.state.netns += [netns_name(self.run_id, node.name) for node in spec.nodes]
        self.state.save()
        for i, node in enumerate(spec.nodes):
            create_netns(netns_name(self.run_id, node.name), ipv6=False)  # IPv4 networks: see create_netns
            self.keys.admit(node.name, node.role)
            cg = cgroups.NodeCgroup(self.run_id, node.name)
            computes[node.name] = (cg, cg.create(node.profile.cpus, node.profile.memory, node.profile.cpuset,
                                                           node.profile.cpu_period))
            self.progress("namespaces", i + 1, len(spec.nodes))
        plans = self.fabric.build(spec, {n.name: netns_name(self.run_id, n.name) for n in spec.nodes}, self.progress)
        for i, node in enumerate(spec.nodes):
            cg, compute = computes[node.name]
            up, down = plans[node.name]
            self.handles[node.name] = NetnsNode(node, netns_name(self.run_id, node.name), node.name, up, down,
                                                 cg, {**compute, **grants[node.name].meta},
                                                 node_identity(self.run_id, i), env=grants[node.name].env)
        # and the run dir's logs (a command's output file: the node's own, in a folder of root's)
        imports = frozenset(os.path.realpath(p) for p in sys.path if p)  # read whole where closed
        self.reach = tuple(bridges(reached_paths() + [os.path.join(os.path.realpath(self.state.run_dir), "logs")],
                                   imports))
        self._build_control()

    def _grant_gpus(self, spec: ClusterSpec) -> dict[str, GpuGrant]:
        """Each node's GPUs (none: it sees none), with an MPS daemon for the caps where one runs."""
        profiles = [n.profile for n in spec.nodes]
        host = host_gpus() if any(p.has_gpus() for p in profiles) else []
        pipe = None
        if wants_mps(profiles):
            self.mps = MpsDaemon(Path(tempfile.mkdtemp(prefix=f"edgebed-mps-{self.run_id}-")))
            os.chmod(self.mps.pipe.parent, 0o755)  # its clients are the nodes' uids
            used = sorted({i for n in spec.nodes for i in grant(n.profile, host).devices})
            if self.mps.start(used):
                pipe = str(self.mps.pipe)
            else:
                self.warnings.append(f"no MPS daemon ({self.mps.problem}): gpu_memory caps only PyTorch's allocator, "
                                     "and a command workload's gpu_share is not applied")
        return {n.name: grant(n.profile, host, pipe) for n in spec.nodes}

    # -- processes ---------------------------------------------------------------------
    def set_preload(self, modules: list[str]) -> None:
        """A forkserver of this run's own: an earlier run's in this process (`bench all`, the API) had
        its preload and its dataset (data/preload.py), so its nodes would import torch and load the
        data each on their own. Runs in one process are sequential: the last one's nodes are gone."""
        os.environ[RUNNER_ENV] = str(os.getpid())  # the forkserver dies with this process (forkserver_guard.py)
        stop_forkserver()
        request_main()
        # the runner's main module and this one (whose _bootstrap every node unpickles) imported
        # once there, not again in every node as it starts (forkserver_main.py)
        self._ctx.set_forkserver_preload(["testbed.runtimes.netns.forkserver_guard",
                                          "testbed.runtimes.netns.forkserver_main", __name__, *modules])

    def make_stop_event(self) -> StopEvent:
        self._stop_event = SealedStopFlag()  # lock-free, and the runner's alone to set
        return self._stop_event

    def start_node(self, node: Node, cfg, stop_event: StopEvent) -> NodeProcess:
        """Start the node's role (and its background stress); returns the role's process."""
        if getattr(cfg, "log_path", ""):  # a command's output: a file the node's uid may append to, and no other
            _own_file(Path(cfg.log_path), self.handles[node.name].identity)
        proc = self.start(node.name, cfg.target, {"cfg": cfg, "stop_event": stop_event})
        stress = node.profile.stress
        if stress is not None:
            for k in range(stress.processes):
                self.start(node.name, STRESS_TARGET, {"load": stress.cpu / stress.processes, "stop_event": stop_event},
                           label=f"stress{k}")
        return proc

    def start(self, node: str, target: Callable | str, kwargs: dict[str, Any], label: str = "") -> NodeProcess:
        h = self.handles[node]
        self.grant_slots(node, kwargs)
        p = ForkserverProcess(  # self._ctx's Process (the one forkserver), polled safely from two threads
            target=_bootstrap,
            args=(h.netns, self.run_id, node, target, Deferred(kwargs), h.env, self.keys.of(node), h.identity,
                  self.reach),
            name=f"edgebed-{node}{'-' + label if label else ''}",
            daemon=False,
        )
        p.start()
        # the ended ones go (a per-round trainer starts again and again: each kept would hold its
        # sentinel's file descriptor, freed with the object)
        h.processes = [q for q in h.processes if q.is_alive()] + [p]
        return p

    # -- changes during the run (live.py) ------------------------------------------------
    @contextmanager
    def _link_iface(self, node: str, which: str):
        with (self.fabric.uplink_iface if which == "up" else self.fabric.downlink_iface)(node) as iface:
            yield iface

    def set_stress(self, node: str, load: float) -> str:
        """Replace the node's background stress with `load` cores' worth (0: none)."""
        h = self.handles[node]
        old = [p for p in h.processes if "-stress" in p.name and p.is_alive()]
        for p in old:
            p.kill()
        loads = stress_loads(load)
        for k, one in enumerate(loads):
            self.start(node, STRESS_TARGET, {"load": one, "stop_event": self._stop_event}, label=f"stress-live{k}")
        return f"stress {load} cores in {len(loads)} process(es) (was {len(old)})"

    # -- observation -------------------------------------------------------------------
    def counters(self) -> dict[str, dict[str, int]]:
        """Per node: bytes/packets up (node -> net) and down, from the switch-side veth end."""
        return self.fabric.counters()

    # -- teardown ------------------------------------------------------------------------
    def stop_processes(self, grace: float) -> None:
        for name, h in self.handles.items():
            # a frozen node (offline, crashed) ends without running again: killed, then thawed (a
            # frozen process ends on nothing, not even SIGKILL, until then; thawed first, it would
            # finish the step it was frozen in and record it after the run's end)
            if h.cgroup.is_frozen():
                self.kill_node(name)
                try:
                    h.cgroup.freeze(False)
                except OSError:
                    pass
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
        self._close_control()
        self.fabric.close()
        if self.mps is not None:
            self.mps.stop()
            shutil.rmtree(self.mps.pipe.parent, ignore_errors=True)
        return cleanup_run(self.run_id, self.state, stop_runner=False, progress=self.progress)
