"""The contract between the runner and a runtime: what every runtime must do (the abstract
methods), what some can do (declared in `features`, never probed by name), what it returns (a
NodeProcess per role or job, a StopEvent per run), and the changes during a run (live.LiveOps:
each operation declared there, a runtime without it says so by name). A runtime also says,
before anything is made, whether it can run here (`available`) and what of a scenario it cannot
meet (`problems`, `scenario_problems`, `plugin_refusals`); it registers in the entry point group
`edgebed.runtimes` and registers its clean-up (state.register_sweeper). Nothing else needs to
know it exists: runtimes/README.md says what a new backend implements."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable, Optional, Protocol, runtime_checkable

from testbed.kernel.cgroups import CgroupUsage
from testbed.kernel.gpus import GpuProcessUse, gpu_process_use
from testbed.kernel.shaping import DirectionPlan, KernelCaps, probe_kernel
from testbed.plan.cluster import ClusterSpec, Node
from testbed.runtimes.control.channel_auth import RunKeys
from testbed.runtimes.live import LiveOps
from testbed.runtimes.state import RunState
from testbed.runtimes.ticks import Tick, no_ticks

if TYPE_CHECKING:  # types only: the runtime makes them where it has them
    from testbed.runtimes.control.hub import ControlHub
    from testbed.runtimes.control.network import ControlNetwork
    from testbed.runtimes.fabric import WanLinks


@dataclass(frozen=True)
class Features:
    """What a runtime can do beyond the contract."""
    # Nodes fork from one process that loaded the run's dataset once (the runner asks it to).
    shared_data: bool = False
    # Link-check flows may run together and still read their rates (containers' exec'd
    # measuring processes, each under its container's quota, read low when run at once).
    concurrent_flows: bool = False
    # Nodes run on the runner's host and may write files it reads (a command's output: netns).
    same_host: bool = False


@dataclass(frozen=True)
class NodeUsage:
    """One node's resources so far (resources.csv)."""
    cpu_seconds: Optional[float]
    memory_bytes: Optional[int]
    throttled_seconds: Optional[float]
    gpu_memory_bytes: Optional[int] = None  # its processes' on the GPUs (NVML), where it has GPUs
    gpu_util: Optional[int] = None  # % of a GPU's SMs its busiest process used, NVML's latest sample
    # The fidelity monitor's inputs (records.fidelity): the quota now in cores (None: unlimited),
    # time runnable but waiting, CFS periods and those throttled.
    cpu_quota: Optional[float] = None
    wait_seconds: Optional[float] = None
    nr_periods: Optional[int] = None
    nr_throttled: Optional[int] = None


@runtime_checkable
class NodeProcess(Protocol):
    """What `start_node` and `start` return, watched by the runner like a multiprocessing.Process
    (which is one): a node's role (one generation of it) or a job run inside a node."""

    def is_alive(self) -> bool: ...

    @property
    def exitcode(self) -> Optional[int]: ...  # None while it runs; negative: killed by that signal

    def join(self, timeout: Optional[float] = None) -> None: ...

    def kill(self) -> None: ...


@runtime_checkable
class StopEvent(Protocol):
    """What `make_stop_event` returns: set by the runner to stop the run, polled by every role
    (node.stop_flag.StopFlag where roles fork from the runner; the hub's word elsewhere)."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class Unavailable:
    """Why a runtime cannot run here: `why` for `runtime auto: X, because <why>`, `line` when a
    scenario or the command line named the runtime (RuntimeUnavailable's message)."""
    why: str
    line: str


def needs_root(name: str) -> Optional[Unavailable]:
    """A runtime that makes namespaces, links and cgroups on this machine needs root."""
    if os.geteuid() == 0:
        return None
    return Unavailable("needs root", f"the {name} runtime needs root (it creates network namespaces, veth links, tc "
                                   "qdiscs and cgroups, and shapes containers' links from the host); run edgebed "
                                   "with sudo")


class NodeHandle(Protocol):
    """What a runtime keeps per node; live changes and benchmarks read these fields."""
    node: Node
    netns: str
    uplink: DirectionPlan
    downlink: DirectionPlan
    cgroup: CgroupUsage
    compute: dict
    processes: list


def node_gpu_use(h: NodeHandle, gpu_use: dict[int, GpuProcessUse]) -> tuple[Optional[int], Optional[int]]:
    """(GPU memory, SM %) of a node's processes, by the process ids in its cgroup (this host's)."""
    if not h.compute.get("gpus") or not gpu_use:
        return None, None
    pids = h.cgroup.pids() if hasattr(h.cgroup, "pids") else set()
    mine = [gpu_use[p] for p in pids if p in gpu_use]
    utils = [u.sm_percent for u in mine if u.sm_percent is not None]
    return sum(u.memory_bytes for u in mine), (max(utils) if utils else None)


class Runtime(LiveOps, ABC):
    name: ClassVar[str]  # as scenarios name it: its entry point's name in `edgebed.runtimes`
    features: ClassVar[Features] = Features()
    # `runtime: auto` tries the runtimes with a rank, lowest first, and runs the first that can run
    # here (None: only when named); `auto_note` follows `runtime: NAME` when auto chose it.
    auto_rank: ClassVar[Optional[int]] = None
    auto_note: ClassVar[str] = ""
    # how a node's link is shaped, in words (link benchmarks' `shaper`)
    shaper: ClassVar[str] = "htb (egress of each veth end)"

    def __init__(self, state: RunState, caps: Optional[KernelCaps] = None):
        super().__init__()
        self.state = state
        self.run_id = state.run_id
        self.run_dir = Path(state.run_dir)
        self.caps = caps or probe_kernel()
        self.handles: dict[str, NodeHandle] = {}
        self.fabric: Optional[WanLinks] = None  # the sites' routers and WAN links, where the run has them
        self.control: Optional[ControlNetwork] = None  # the nodes' way to the runner
        self.hub: Optional[ControlHub] = None  # the runner's end of it
        self.keys = RunKeys()  # who may speak on it: the hub's key and each node's, made for this run
        self.image: Optional[str] = None  # the node image, for runtimes that run one
        self.warnings: list[str] = []  # what bring-up could not do as asked (meta.json's warnings)
        self._idle_usage: dict[str, NodeUsage] = {}  # node -> its usage read with no process in it
        self.progress: Tick = no_ticks  # a fleet's bring-up and teardown as they go (the runner's to show)

    # -- before a run: can it run here, can it run this ---------------------------------------
    @classmethod
    def available(cls) -> Optional[Unavailable]:
        """Why this runtime cannot run on this machine now (no root, no engine, no image), or None."""
        return None

    @classmethod
    def auto_refusal(cls, sc) -> Optional[str]:
        """Why `runtime: auto` should not pick this runtime for `sc` though it is available, or None."""
        return None

    @classmethod
    def scenario_problems(cls, sc) -> list[str]:
        """Validation's part (pure, no engine asked): one line per field this runtime cannot meet."""
        return []

    @classmethod
    def problems(cls, sc) -> list[str]:
        """Preflight's part (after validation, before bring-up; may ask an engine): one line per
        field whose need this machine cannot meet on this runtime."""
        return []

    @classmethod
    def auto_problems(cls, sc) -> Optional[list[str]]:
        """`problems` when `runtime: auto` asks; None: auto would not pick this runtime (the next
        one's are asked)."""
        return cls.problems(sc)

    @classmethod
    def plugin_refusals(cls, sc, plugins: list[tuple[str, str]]) -> list[str]:
        """One line per (field, name) of a user's plugin this runtime's nodes cannot run (empty:
        they can: preflight then tries the plugin's model and dataset here)."""
        return []

    @classmethod
    def open(cls, state: RunState, say: Callable[[str], None]) -> "Runtime":
        """The runtime for one run, with whatever it needs from this machine (an engine, an image)."""
        return cls(state)

    def bench_placement(self) -> Optional[dict]:
        """Where a fidelity benchmark's ps and workers go (scenario `placement:`) so its measured
        paths are the ones the runtime makes (across hosts, where it has several); None: anywhere."""
        return None

    def use_packages(self, packages: list[str]) -> None:
        """A user's packages (plugins) for the nodes: the docker runtime installs them into its
        image; on netns they are edgebed's own environment's (installed, or on PYTHONPATH)."""

    def caps_of(self, node: str) -> KernelCaps:
        """What the kernel that shapes `node`'s link can do: this machine's, unless the node is
        on another host (the swarm runtime asks each node)."""
        return self.caps

    def placer(self, sc):
        """Which host each node runs on (plan.placement): this machine, unless the runtime has more."""
        from testbed.plan.placement import SingleHost

        return SingleHost()

    # -- bring-up --------------------------------------------------------------------------
    @abstractmethod
    def create(self, spec: ClusterSpec) -> None:
        """Make every node and link of `spec`: nothing runs in them yet."""

    def set_preload(self, modules: list[str]) -> None:
        """Modules the node processes should find imported (where they fork from one process)."""

    @abstractmethod
    def make_stop_event(self) -> StopEvent:
        """An event every node's role polls; set by the runner to stop the run."""

    @abstractmethod
    def start_node(self, node: Node, cfg, stop_event: StopEvent) -> NodeProcess:
        """Start the node's role (`cfg.target`, module:function, a node.supervisor.RoleConfig) and its
        background stress; the role's process (a restart starts the next generation)."""

    @abstractmethod
    def start(self, node: str, target: Callable | str, kwargs: dict, label: str = "") -> NodeProcess:
        """Run a module-level function inside a node (benchmarks, link checks) with `kwargs`."""

    def start_idle(self, stop_event: StopEvent) -> None:
        """Make nodes ready to host `start` jobs without a role (a container needs a first process)."""

    # -- observation -----------------------------------------------------------------------
    @abstractmethod
    def counters(self) -> dict[str, dict[str, int]]:
        """Per node: up_bytes, up_packets, down_bytes, down_packets of its access link."""

    def link_counter(self, node: str, key: str) -> int:
        """One counter of a node's access link, read now (measurements time their reads)."""
        return self.counters()[node][key]

    def wan_counters(self) -> dict[tuple[str, str], dict[str, int]]:
        return self.fabric.wan_counters() if self.fabric is not None else {}

    def link_stats(self, links: Optional[Iterable[str]] = None) -> dict[str, dict]:
        """Per "node/up" and "node/down" (`links`: those alone): the access class's rate_bps (None:
        unshaped), bytes, packets, drops, overlimits, backlog (shaping.read_htb_stats); {} where
        not readable here."""
        return {}

    def channel_urls(self) -> tuple[str, str]:
        """(up, down) of the control channel as a node sees them (testbed.node.channel)."""
        return self.control.urls()

    def _build_control(self) -> None:
        """Every node's ctl0 on the run's control network (after the nodes' namespaces exist), and
        the hub listening on it."""
        from testbed.runtimes.control.network import ControlNetwork

        self.control = ControlNetwork(self.state)
        self.control.build({name: h.netns for name, h in self.handles.items()}, self.progress)
        self.hub = self.control.open_hub(self.run_dir, self.keys)

    def _close_control(self) -> None:
        """At teardown: the hub stops (the runner closed it already, after its last rows)."""
        if self.hub is not None:
            self.hub.close()

    def grant_slots(self, node: str, kwargs: dict) -> None:
        """The mailbox slots among a job's arguments: the job's node may fill them, no other node."""
        up, down = self.channel_urls()
        for value in kwargs.values():
            if self.hub is not None and isinstance(value, str) and value.startswith(f"{up} {down} "):
                self.hub.grant_put(value[len(up) + len(down) + 2:], node)

    def mailbox(self, name: str = ""):
        """Where measurement jobs (`start`: link checks, benchmarks) put their results and flags:
        slots on the control channel that the runner reads like files (runtimes.control.mailbox)."""
        from testbed.runtimes.control.mailbox import Mailbox

        return Mailbox(self.hub, *self.channel_urls(), name)

    def gateway_netns(self) -> Optional[str]:
        """The namespace the run's gateway address is in (where a relay to an external broker
        listens): the fabric's switch, or None for this host's own (Docker's bridge)."""
        return self.fabric.gateway_netns if self.fabric is not None else None

    def topology_meta(self) -> Optional[dict]:
        return self.fabric.topology_meta() if self.fabric is not None else None

    def node_meta(self) -> dict:
        """meta.json's per-node entry: namespace, compute limits, and how each direction was made."""
        return {name: {"netns": h.netns, "compute": h.compute, "uplink": h.uplink.to_meta(),
                       "downlink": h.downlink.to_meta()} for name, h in self.handles.items()}

    def usage(self) -> dict[str, NodeUsage]:
        """Each node's CPU, memory, throttling, quota and GPU use now. A node with no process
        that had none at its last reading is that reading again (nothing ran to change it): a
        fleet's idle devices cost one read each, not seven."""
        out = {}
        gpu_use = gpu_process_use() if any(h.compute.get("gpus") for h in self.handles.values()) else {}
        idle = self._idle_usage
        for name, h in self.handles.items():
            empty = h.cgroup.idle()
            if empty and name in idle:
                out[name] = idle[name]
                continue
            out[name] = self._node_usage(h, gpu_use)
            if empty:
                idle[name] = out[name]
            else:
                idle.pop(name, None)
        return out

    @staticmethod
    def _node_usage(h, gpu_use: dict) -> NodeUsage:
        thr = h.cgroup.throttled() or {}
        throttled = thr.get("throttled_time", thr.get("throttled_usec", 0) * 1000) / 1e9 if thr else None
        return NodeUsage(h.cgroup.cpu_seconds(), h.cgroup.memory_bytes(), throttled,
                         *node_gpu_use(h, gpu_use), cpu_quota=h.cgroup.quota_cores(),
                         wait_seconds=h.cgroup.wait_seconds(), nr_periods=thr.get("nr_periods"),
                         nr_throttled=thr.get("nr_throttled"))

    # -- teardown --------------------------------------------------------------------------
    @abstractmethod
    def stop_processes(self, grace: float) -> None:
        """Wait up to `grace` seconds for every node process to end, then kill what is left."""

    @abstractmethod
    def teardown(self) -> list[str]:
        """Remove everything of the run; the problems left (empty: clean)."""
