"""The scenario file's model: a `Scenario` of profiles, nodes, workload, algorithm, network,
faults and a timeline of events, with defaults (pydantic). Its parts live beside it:
`profiles` (the cluster's shape), `workload` (what is trained, and until when), `streaming`.
Checks across fields are `checks`; reading a file is `scenario_file`."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from testbed.scenario.devices.catalog import Device, check_name
from testbed.scenario.fields import VIRTUAL_RATE, VIRTUAL_TIME, Seconds, StrictModel
from testbed.scenario.links import LINK_PROPERTIES, Direction
from testbed.scenario.profiles import NodeLink, NodeSpec, Profile, Site, Wan, WorkerGroup
from testbed.scenario.streaming import Streaming
from testbed.scenario.workload import Algorithm, Stop, Workload


class Network(StrictModel):
    subnet: str = "10.77.0.0/16"
    verify_links: bool = Field(False, description="measure each worker's path to the PS after bring-up, before "
                                                  "training (rate per direction, RTT where a latency is set): "
                                                  "RUN/link_check.csv; `edgebed up --verify-links`")
    encrypt: bool = Field(False, description="runtime swarm: the run's overlay networks encrypted between hosts "
                                             "(IPsec ESP, AES-GCM: Docker's `--opt encrypted`); every host's "
                                             "kernel needs ESP and GCM, or the run is refused")

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str) -> str:
        try:
            net = ipaddress.IPv4Network(v, strict=True)
        except ValueError as e:
            raise ValueError(f"'{v}' is not an IPv4 subnet ({e})") from None
        if net.num_addresses < 8:
            raise ValueError(f"'{v}' is too small")
        special = [what for what, bad in (("loopback", net.is_loopback), ("multicast", net.is_multicast),
                                          ("link-local", net.is_link_local), ("reserved", net.is_reserved),
                                          ("unspecified", net.network_address.is_unspecified)) if bad]
        if special:
            raise ValueError(f"'{v}' is a {special[0]} range: use a private one (e.g. 10.77.0.0/16)")
        return v


class Faults(StrictModel):
    """What the PS does about a worker that stops answering (killed, frozen, cut off)."""

    worker_timeout: Seconds = Field(30.0, description="synchronous algorithms: a worker silent this long "
                                                       "while the others wait on it is lost")
    on_worker_loss: Literal["continue", "stop"] = Field("continue", description="go on with the survivors, or stop")
    crash_per_push: float = Field(0.0, ge=0, lt=1, description="each worker crashes after a push with this "
                                                              "probability (AdaComp Sec. V.D: p = 0.004)")
    crash_action: Literal["pause", "kill"] = Field("pause", description="how a crash is made: freeze the node "
                                                                       "(the paper) or kill its processes")


EVENT_ACTIONS = ("link", "cpu", "stress", "kill", "restart", "pause", "resume", "partition", "heal")


class Event(Direction):
    """A change during the run (testbed/run/timeline.py): at a time, or when training reaches a step.
    A link event changes the link properties it sets (Direction's), on one or both directions."""

    at: Seconds = Field(None, description="seconds since the nodes started")
    at_step: Optional[int] = Field(None, ge=0, description="when the model version reaches this step")
    target: str = Field(..., description="a node, a worker group's name, or 'workers'")
    action: Literal["link", "cpu", "stress", "kill", "restart", "pause", "resume", "partition", "heal"]
    direction: Literal["up", "down", "both"] = "both"
    trace: Optional[str] = Field(None, description="link: follow a bandwidth trace (CSV or Mahimahi)")
    cpus: Annotated[Optional[float], VIRTUAL_RATE] = Field(None, gt=0, le=1024,
                                                           description="cpu: the new CFS quota in cores")
    load: Annotated[Optional[float], VIRTUAL_RATE] = Field(None, ge=0, le=64, description="stress: cores' worth "
                                                           "of busy loop (0 stops)")
    peers: list[str] = Field(default_factory=list, description="partition: cut the target off from these "
                                                               "(nodes or groups); heal: these, or all")

    @model_validator(mode="after")
    def _when_and_what(self) -> "Event":
        if (self.at is None) == (self.at_step is None):
            raise ValueError("give exactly one of 'at' (seconds) and 'at_step'")
        link_fields = list(self.set_properties())
        if self.action == "link":
            if self.trace is None and not link_fields:
                raise ValueError(f"a link event needs {', '.join(LINK_PROPERTIES)} or trace")
            if self.trace is not None and link_fields:
                raise ValueError("a link event follows either a trace or the fields given, not both")
        else:
            extra = link_fields + (["trace"] if self.trace is not None else []) + \
                (["direction"] if self.direction != "both" else [])
            extra += [f for f in ("cpus", "load")
                      if getattr(self, f) is not None and self.action != {"cpus": "cpu", "load": "stress"}[f]]
            extra += ["peers"] if self.peers and self.action not in ("partition", "heal") else []
            if extra:
                raise ValueError(f"{', '.join(extra)} do not apply to a {self.action} event")
        if self.action == "cpu" and self.cpus is None:
            raise ValueError("a cpu event needs cpus")
        if self.action == "stress" and self.load is None:
            raise ValueError("a stress event needs load (0 stops it)")
        if self.action == "partition" and not self.peers:
            raise ValueError("a partition event needs peers (the nodes to cut the target off from)")
        return self

    def change_fields(self) -> dict:
        if self.action == "link":
            return {"direction": self.direction, **self.set_properties()}
        if self.action == "cpu":
            return {"cpus": self.cpus}
        if self.action == "stress":
            return {"load": self.load}
        if self.action in ("partition", "heal"):
            return {"peers": list(self.peers)}
        return {}


class Availability(StrictModel):
    """When some workers are online: a seeded two-state model (exponential online and
    offline durations) or a trace of online intervals. Offline, a worker's link is cut and its
    trainer frozen; back online it rejoins as a thawed worker does (plan/availability.py)."""

    target: str = Field("workers", description="a worker, a worker group's name, or 'workers'")
    online: Seconds = Field(None, description="the model: mean time online")
    offline: Seconds = Field(None, description="the model: mean time offline")
    start: Literal["random", "online"] = Field("random", description="the model: each worker's first state "
                                               "(random: online with the share of time it is online)")
    cycle: Seconds = Field(None, description="the model: a daily cycle's period (24h, or shorter to compress "
                           "a day): the mean online time is longest and offline shortest at cycle_peak")
    cycle_peak: Seconds = Field(0.0, description="the model: when in the cycle the most workers are online")
    cycle_amplitude: float = Field(0.5, ge=0.0, le=0.9, description="the model: each switch's means are scaled by "
                                   "1 +- amplitude x cos(2 pi (t - peak) / cycle)")
    trace: Optional[str] = Field(None, min_length=1, max_length=300,
                                 description="a CSV of node,start,end: each worker's online intervals (seconds); "
                                             "a worker of the target the trace does not name is always online")
    trace_format: Literal["csv", "fedscale", "flash"] = Field(
        "csv", description="csv: node,start,end; fedscale: FedScale's client_behave_trace (a pickle of plain dicts "
        "and lists, nothing else loaded), worker i of the target as client first_client + i, repeating every "
        "finish_time; flash: FLASH's state_traces.json (a device online while locked, on Wi-Fi and charging, "
        "as FLASH reads it), worker i as user first_client + i")
    first_client: int = Field(1, ge=0, le=10**9, description="fedscale, flash: the client id of the target's "
                              "first worker")
    time_scale: Annotated[float, VIRTUAL_TIME] = Field(1.0, gt=0.0, le=1000.0, description="run seconds per "
                                                       "trace second (0.01: a day's trace in 14.4 minutes)")
    while_offline: Literal["freeze", "stop"] = Field("freeze", description="an offline worker's trainer: frozen "
                                                     "where it is, or stopped (its memory freed) and started again "
                                                     "when it is back, as a restarted worker (it pulls the model)")

    @model_validator(mode="after")
    def _model_or_trace(self) -> "Availability":
        model = [f for f in ("online", "offline") if getattr(self, f) is not None]
        if self.trace is not None and model:
            raise ValueError(f"{model[0]}: give a trace or the model's online and offline, not both")
        if self.trace is None and len(model) != 2:
            raise ValueError("give the model's online and offline (mean seconds), or a trace")
        for f in model:
            if getattr(self, f) < 1.0:
                raise ValueError(f"{f}: at least 1s (a worker that comes and goes faster is not emulated)")
        if self.cycle is not None and (self.trace is not None or self.cycle < 10.0):
            raise ValueError("cycle: a daily cycle of the model (online and offline), at least 10s")
        return self


class Scenario(StrictModel):
    name: str = "scenario"
    seed: int = Field(0, ge=0, le=2**31 - 1, description="data order, partition, stream rates, crash draws")
    runtime: str = Field("auto", pattern=r"^[a-z][a-z0-9_-]{0,31}$",
                         description="auto, or a runtime registered in the edgebed.runtimes entry-point group "
                         "(edgebed's own: netns, docker, swarm); what each cannot run is its own check")
    placement: dict[str, str] = Field(default_factory=dict, description="runtime swarm: a node, worker group, "
                                      "'workers' or site -> the host it runs on, by hostname or 'label:KEY=VALUE'")
    packages: list[str] = Field(default_factory=list, description="runtime docker: Python packages (folders with "
                                "a pyproject.toml, or wheels) installed into the nodes' image: the plugins' code")
    dilation: Union[float, Literal["auto"]] = Field(
        1.0, description="virtual time: the run's world k times slower than the wall (every time the scenario "
        "states x k, every rate / k), so a host too small for it keeps its promises; records in the world's "
        "seconds. auto: k chosen from the plan and a calibration of this host (edgebed up --dilation)")
    network: Network = Field(default_factory=Network)
    workload: Workload = Field(default_factory=Workload)
    stop: Stop = Field(default_factory=Stop)
    algorithm: Algorithm = Field(default_factory=Algorithm)
    profiles: dict[str, Profile] = Field(default_factory=dict)
    ps: NodeSpec = Field(default_factory=NodeSpec)
    evaluator: NodeSpec = Field(default_factory=NodeSpec)
    workers: list[WorkerGroup] = Field(default_factory=lambda: [WorkerGroup(count=2)])
    streaming: Optional[Streaming] = None
    sites: dict[str, Site] = Field(default_factory=dict, description="named LANs; none: one LAN for all")
    wan: Wan = Field(default_factory=Wan)
    links: list[NodeLink] = Field(default_factory=list, description="per node pair overrides of the access links")
    events: list[Event] = Field(default_factory=list, description="the timeline: changes during the run")
    availability: list[Availability] = Field(default_factory=list, description="when workers are online: per "
                                             "target a seeded on/off model or a trace of online intervals")
    faults: Faults = Field(default_factory=Faults)
    devices: Optional[dict[str, Device]] = Field(None, description="the scenario's own catalog entries (name -> "
                                                 "cores, memory, gflops, source, derivation), or a YAML file of "
                                                 "them in the scenario's folder")

    @field_validator("devices", mode="before")
    @classmethod
    def _devices(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError("a devices file is read from the scenario's folder when the scenario is read from a "
                             "file (edgebed up/validate FILE); here, give the entries inline")
        for name in v if isinstance(v, dict) else ():
            bad = check_name(name)
            if bad:
                raise ValueError(f"an entry's name {bad}")
        return v

    @field_validator("dilation")
    @classmethod
    def _dilation(cls, v: Union[float, str]) -> Union[float, str]:
        if not isinstance(v, str) and not 1.0 <= v <= 64.0:
            raise ValueError(f"{v:g} is outside 1-64 (1: no dilation)")
        return v

    @field_validator("sites")
    @classmethod
    def _sites(cls, v: dict[str, Site]) -> dict[str, Site]:
        for name in v:
            if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", name):
                raise ValueError(f"'{name}' is not a site name "
                                 "(lowercase letters/digits, at most 8, starting with a letter)")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", v):
            raise ValueError(f"'{v}' is not a scenario name (letters, digits, '-', '_', '.')")
        return v

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: list[WorkerGroup]) -> list[WorkerGroup]:
        if not v:
            raise ValueError("at least one worker group is needed")
        return v

    # -- resolution helpers ------------------------------------------------------------------

    def profile_of(self, ref: Union[str, Profile, None]) -> Profile:
        if ref is None:
            return Profile()
        if isinstance(ref, Profile):
            return ref
        return self.profiles[ref]

    def node_profile_ref(self, node: str) -> Union[str, Profile, None]:
        """The profile reference a node of node_names() is made from."""
        groups = dict(self.worker_names())
        if node in groups:
            return self.workers[groups[node]].profile
        broker = self.streaming.broker if self.streaming is not None else None
        refs = {"ps": self.ps.profile, "eval": self.evaluator.profile,
                "broker": broker.profile if broker else None,
                "producer": broker.producer_profile if broker else None}
        return refs.get(node)

    def worker_names(self) -> list[tuple[str, int]]:
        """(node name, group index) for every worker, in order."""
        out: list[tuple[str, int]] = []
        counters: dict[str, int] = {}
        for gi, g in enumerate(self.workers):
            prefix = g.name or "w"
            for _ in range(g.count):
                i = counters.get(prefix, 0)
                counters[prefix] = i + 1
                out.append((f"{prefix}{i}", gi))
        return out

    def node_names(self) -> list[str]:
        """Every node the scenario makes."""
        out = ["ps", "eval"] + [n for n, _ in self.worker_names()]
        if self.streaming is not None:
            kind = self.streaming.broker.kind
            out += {"tansu": ["broker"], "kafka": ["broker", "producer"], "external": ["producer"]}[kind]
        return out

    @property
    def n_workers(self) -> int:
        return sum(g.count for g in self.workers)
