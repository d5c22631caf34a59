"""The scenario file: schema, defaults, validation with errors that name the field.

A scenario says what cluster to emulate (profiles, nodes), what to train (workload,
algorithm) and when to stop. `testbed.plan.load_scenario()` returns a fully resolved `Scenario`;
every problem is reported as `ScenarioError` with lines like
`workers[1].profile.bandwidth: '-5mbit' is not a rate`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from testbed.kernel import cgroups
from testbed.scenario import units
from testbed.scenario.fields import MAX_SECONDS, Bytes, Seconds, StrictModel
from testbed.scenario.links import LINK_PROPERTIES, BothDirections, Direction, as_direction, inherit
from testbed.scenario.loader import LoadError, excerpt, load_yaml_file
from testbed.scenario.traces import read_link_trace

MAX_WORKERS = 1024  # in all groups together (the namespace runtime has run 256 at once)
FIXED_SPLIT_DATASETS = ("mnist", "fashion_mnist", "idx", "cifar10")


class ScenarioError(ValueError):
    """Invalid scenario. `lines` holds one 'field.path: message' line per problem."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        super().__init__("\n".join(lines))


# --- link and compute profiles -------------------------------------------------------------


class Stress(StrictModel):
    """Background CPU load inside the node's own cgroup (competes with training for the quota)."""

    cpu: float = Field(0.5, gt=0, le=64, description="cores' worth of busy-looping (0.5 = half a core)")
    processes: int = Field(1, ge=1, le=64)


# The kernel's bounds for a CFS period, its default and the smallest quota it takes, in seconds.
MIN_CPU_PERIOD_S, MAX_CPU_PERIOD_S = cgroups.MIN_PERIOD_US / 1e6, cgroups.MAX_PERIOD_US / 1e6
DEFAULT_CPU_PERIOD_S, MIN_CPU_QUOTA_S = cgroups.PERIOD_US / 1e6, cgroups.MIN_QUOTA_US / 1e6


def cpu_quota_problem(cpus: float, period_s: Optional[float]) -> Optional[str]:
    """Why `cpus` cores cannot be a quota over this period (the kernel's floor is 1 ms), or None."""
    period = period_s if period_s is not None else DEFAULT_CPU_PERIOD_S
    if cpus * period < MIN_CPU_QUOTA_S - 1e-12:
        return (f"{cpus:g} cores over a {period * 1e3:g}ms CFS period is a quota under the kernel's 1ms; "
                f"the least is {MIN_CPU_QUOTA_S / period:g} cores (a longer cpu_period allows less)")
    return None


class Profile(BothDirections):
    """A device class: compute budget plus access link (`bandwidth`, `latency`, `jitter`, `loss`
    for both directions, `uplink`/`downlink` for one)."""

    cpus: Optional[float] = Field(None, gt=0, le=1024, description="CPU quota in cores (0.25 = quarter core)")
    cpu_period: Seconds = Field(None, description="the CFS period the quota is counted over (default 100ms, "
                                "Docker's too): a shorter one throttles in shorter slices")
    cpuset: Optional[str] = Field(None, description="CPUs to pin to, e.g. '0' or '0-1'")
    memory: Bytes = None
    uplink: Optional[Direction] = None
    downlink: Optional[Direction] = None
    stress: Optional[Stress] = None
    gpus: Optional[Union[int, list[int]]] = Field(None, description="a count (the first N of the host's) or "
                                                  "the host's GPU indices")
    gpu_memory: Bytes = Field(None, description="the most GPU memory the node may allocate (past it, it fails)")
    gpu_share: Optional[float] = Field(None, gt=0, le=1, description="the fraction of the GPU's compute the "
                                       "node may use (paced steps; MPS threads for a command workload)")

    @field_validator("uplink", "downlink", mode="before")
    @classmethod
    def _dir(cls, v: Any) -> Any:
        return as_direction(v)

    @field_validator("cpuset")
    @classmethod
    def _cpuset(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", str(v)):
            raise ValueError(f"'{v}' is not a cpuset (e.g. '0', '0-1', '0,2')")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 0 or isinstance(v, list) and any(g < 0 for g in v):
            raise ValueError(f"{v!r} is not a GPU count or list of GPU indices")
        return v

    @model_validator(mode="after")
    def _quota(self) -> "Profile":
        if self.cpu_period is not None:
            if self.cpus is None:
                raise ValueError("cpu_period: a CFS period needs a quota (cpus)")
            if not MIN_CPU_PERIOD_S <= self.cpu_period <= MAX_CPU_PERIOD_S:
                raise ValueError(f"cpu_period: {self.cpu_period * 1e3:g}ms is outside the kernel's 1ms-1s")
        if self.cpus is not None:
            quota_problem = cpu_quota_problem(self.cpus, self.cpu_period)
            if quota_problem:
                raise ValueError(f"cpus: {quota_problem}")
        for cap in ("gpu_memory", "gpu_share"):
            if getattr(self, cap) is not None and not self.has_gpus():
                raise ValueError(f"{cap}: caps a GPU, and this profile has none (gpus:)")
        return self

    def has_gpus(self) -> bool:
        return self.gpus not in (None, 0, [])

    def resolved_direction(self, which: Literal["uplink", "downlink"]) -> Direction:
        """The direction with the profile-wide properties filled in."""
        return inherit(getattr(self, which), self.both())


# --- nodes ---------------------------------------------------------------------------------


class NodeSpec(StrictModel):
    profile: Union[str, Profile, None] = None
    site: Optional[str] = Field(None, description="the site (LAN) the node is in; default: the first site")


# --- topology ------------------------------------------------------------------------------


class Site(StrictModel):
    """A LAN: its own switch. `lan` is the default access link of the nodes placed in it (a
    profile name or inline profile; a node's own profile overrides it field by field)."""

    lan: Union[str, Profile, None] = None


class LinkShape(BothDirections):
    """A link between two places, shaped per direction: `forward` is a -> b of `between: [a, b]`,
    `reverse` b -> a; bandwidth/latency/jitter/loss set both."""

    forward: Optional[Direction] = None
    reverse: Optional[Direction] = None

    @field_validator("forward", "reverse", mode="before")
    @classmethod
    def _dir(cls, v: Any) -> Any:
        return as_direction(v)

    def resolved(self, which: Literal["forward", "reverse"], base: Optional["LinkShape"] = None) -> Direction:
        """The direction with link-wide properties filled in, then `base`'s (the WAN default)."""
        return inherit(getattr(self, which), self.both(), base.resolved(which) if base is not None else None)


class WanLink(LinkShape):
    between: list[str] = Field(..., min_length=2, max_length=2, description="[site a, site b]")


class NodeLink(LinkShape):
    """A per-destination override between two nodes: their traffic to each other is shaped by
    this (forward = a -> b) instead of their access links' rates (HTB class + u32 filter)."""

    between: list[str] = Field(..., min_length=2, max_length=2, description="[node a, node b]")


class Wan(StrictModel):
    """Links between sites. `mesh`: every pair of sites gets a link shaped by `default`, with
    `links` overriding pairs; mesh false: only the listed `links` exist (traffic is routed over
    several of them where needed)."""

    default: LinkShape = Field(default_factory=LinkShape)
    mesh: bool = True
    links: list[WanLink] = Field(default_factory=list)


class WorkerGroup(StrictModel):
    count: int = Field(1, ge=1, le=1024)
    profile: Union[str, Profile, None] = None
    name: Optional[str] = Field(None, description="prefix of the node names of this group (default 'w')")
    site: Optional[str] = Field(None, description="the site (LAN) of this group's nodes; default: the first site")

    @field_validator("name")
    @classmethod
    def _name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"[a-z][a-z0-9]{0,5}", v):
            raise ValueError(f"'{v}' is not a group name (lowercase letters/digits, at most 6, starting with a letter)")
        return v


# --- training ------------------------------------------------------------------------------


class Injection(StrictModel):
    """Randomized data injection for non-IID data (ScaDLES Sec. IV-D, SelSync Sec. III-C): at
    every step a random ceil(alpha * N) of the workers send a beta fraction of their batch to
    every other worker, which trains on it beside its own."""

    alpha: float = Field(..., gt=0, le=1, description="fraction of the workers that share each step")
    beta: float = Field(..., gt=0, le=1, description="fraction of a sharing worker's batch it sends")
    local_batch: Union[int, Literal["eq3", "same"]] = Field(
        "eq3", description="own samples per step: SelSync Eq. 3's b/(1 + alpha*beta*N), the batch size, or a number")

    @field_validator("local_batch")
    @classmethod
    def _local_batch(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1")
        return v


# What a command workload's template may name (node.roles.command fills them in, and sets the
# environment variables torchrun and torch.distributed read: MASTER_ADDR, MASTER_PORT, RANK, ...).
COMMAND_PLACEHOLDERS = ("rank", "world_size", "node", "address", "master_addr", "master_port", "ps_addr",
                        "python", "home")  # python: the node's interpreter (torch, edgebed); home: its own folder


def command_problem(template: str) -> Optional[str]:
    """Why a command template cannot be filled in (an unknown {placeholder}, bad braces), or None."""
    import shlex

    try:
        filled = template.format(**{k: "x" for k in COMMAND_PLACEHOLDERS})
        if not shlex.split(filled):
            return "an empty command"
    except KeyError as e:
        return f"unknown placeholder {{{e.args[0]}}} (known: {', '.join(COMMAND_PLACEHOLDERS)})"
    except (ValueError, IndexError) as e:
        return f"cannot be filled in: {e}"
    return None


class Workload(StrictModel):
    model: str = "adacomp_cnn"
    dataset: str = "mnist5k"
    partition: str = "iid"
    batch_size: int = Field(32, ge=1, le=65536)
    lr: float = Field(0.05, gt=0, le=100)
    momentum: float = Field(0.0, ge=0, lt=1)
    eval_interval: int = Field(20, ge=1, description="evaluate every N model updates at the PS")
    eval_seconds: Optional[float] = Field(None, gt=0, le=3600, description="evaluate the latest model every T "
                                          "seconds of wall-clock time instead of every eval_interval versions")
    eval_samples: Optional[int] = Field(None, ge=1, description="cap on test samples per evaluation")
    test_size: Optional[int] = Field(None, ge=1, description="held-out test samples where edgebed splits the data")
    threads: Optional[int] = Field(None, ge=1, le=256, description="torch threads per node (default: ceil(cpus))")
    command: Optional[dict[Literal["ps", "worker", "evaluator"], str]] = Field(
        None, description="an unmodified program per role instead of edgebed's trainer (a command workload): "
        "placeholders {rank} {world_size} {node} {address} {master_addr} {master_port} {ps_addr} {python} {home}. "
        "The run completes when the evaluator's program ends well (a driver, such as `flwr run`), or without "
        "one, when every worker's has")
    injection: Optional[Injection] = None
    train_fraction: Optional[float] = Field(None, gt=0, le=1, description="train on this share of the training set "
                                            "(a seeded subset, before partitioning; AdaComp's Table II)")

    @field_validator("command")
    @classmethod
    def _command(cls, v: Optional[dict]) -> Optional[dict]:
        for role, template in (v or {}).items():
            problem = command_problem(template)
            if problem:
                raise ValueError(f"{role}: {problem}")
        if v is not None and not ({"worker", "evaluator"} & set(v)):
            raise ValueError("needs a worker or an evaluator command: the run ends when they do")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        from testbed.data.models import ModelError, model_factory

        try:
            model_factory(v)
        except ModelError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        from testbed.data.datasets import DatasetError, validate_dataset_spec

        try:
            validate_dataset_spec(v)
        except DatasetError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("eval_seconds", mode="before")
    @classmethod
    def _eval_seconds(cls, v: Any) -> Optional[float]:
        return None if v is None else units.parse_duration(v, allow_zero=False)

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str) -> str:
        from testbed.data.partition import parse_partition

        parse_partition(v)  # ValueError names the problem
        return v


class Stop(StrictModel):
    steps: Optional[int] = Field(None, ge=1, le=10**9, description="model updates applied at the PS")
    seconds: Optional[float] = None
    target_accuracy: Optional[float] = Field(None, gt=0, le=1)

    @field_validator("seconds", mode="before")
    @classmethod
    def _secs(cls, v: Any) -> Optional[float]:
        secs = None if v is None else units.parse_duration(v, allow_zero=False)
        if secs is not None and secs > MAX_SECONDS:
            raise ValueError(f"{secs:g}s is above the most edgebed takes here ({MAX_SECONDS:g}s)")
        return secs

    @model_validator(mode="after")
    def _some(self) -> "Stop":
        if self.steps is None and self.seconds is None and self.target_accuracy is None:
            self.steps = 200  # a file that says nothing still ends
        return self


class Algorithm(StrictModel):
    name: str = "bsp"
    params: dict[str, Any] = Field(default_factory=dict)


KAFKA_IMAGE = "apache/kafka:3.9.0"
"""Apache Kafka's official image (KRaft, single node) for `broker: {kind: kafka}`."""


def split_host_port(value: str) -> Optional[tuple[str, int]]:
    """(host, port) of "host:port", or None when it is not one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "," in value:
        return None
    return host, int(port)


class BrokerSpec(StrictModel):
    """Where the streams live.

    tansu: the embedded Kafka-API broker on a node of its own, producers beside it (ScaDLES' layout);
    kafka: Apache Kafka from its official image on the broker node (docker runtime), producers on a
    `producer` node; external: a Kafka the user runs on this host (`upstream`, 127.0.0.1 by
    default), which the nodes reach at `bootstrap`, the run's gateway address, through a relay of
    that one port; producers on a `producer` node.
    """

    kind: Literal["tansu", "kafka", "external"] = "tansu"
    bootstrap: Optional[str] = Field(None, description="gateway:port where the nodes reach an external Kafka "
                                                       "(kind: external; what the broker advertises)")
    upstream: Optional[str] = Field(None, description="host:port where this host reaches the external Kafka "
                                                      "(default 127.0.0.1 and bootstrap's port)")
    image: Optional[str] = Field(None, description=f"Kafka image (kind: kafka; default {KAFKA_IMAGE})")
    profile: Union[str, Profile, None] = None
    producer_profile: Union[str, Profile, None] = Field(
        None, description="profile of the producer node (kind: kafka or external)")
    site: Optional[str] = Field(None, description="the site of the broker (and producer) node")

    @model_validator(mode="after")
    def _kind_fields(self) -> "BrokerSpec":
        if self.kind == "external":
            if not self.bootstrap:
                raise ValueError("kind external needs bootstrap: host:port")
            for name in ("bootstrap", "upstream"):
                value = getattr(self, name)
                if value is not None and split_host_port(value) is None:
                    raise ValueError(f"{name}: {excerpt(value)} is not host:port (one broker)")
            if self.profile is not None:
                raise ValueError("profile: an external broker is not a node of the run (use producer_profile)")
            if self.upstream is None:
                self.upstream = f"127.0.0.1:{split_host_port(self.bootstrap)[1]}"
        elif self.bootstrap is not None or self.upstream is not None:
            field_name = "bootstrap" if self.bootstrap is not None else "upstream"
            raise ValueError(f"{field_name}: only for kind external (kind {self.kind} runs its own broker)")
        if self.image is not None and self.kind != "kafka":
            raise ValueError(f"image: only for kind kafka, not {self.kind}")
        if self.kind == "kafka" and self.image is None:
            self.image = KAFKA_IMAGE
        if self.producer_profile is not None and self.kind == "tansu":
            raise ValueError("producer_profile: with kind tansu the producers run on the broker node (use profile)")
        return self


class Streaming(StrictModel):
    """ScaDLES-style streaming: each worker trains on samples that stream to it through Kafka."""

    broker: BrokerSpec = Field(default_factory=BrokerSpec)
    rates: Any = Field("S1'", description="samples/s per device: a number, a list (one per worker: numbers or "
                                          "{trace: FILE}), S1/S2/S1'/S2', {uniform: {low, high}}, "
                                          "{normal: {mean, std}}, {trace: FILE} (time,rate CSV; time 0 = run start)")
    buffer: Literal["persistence", "truncation"] = "persistence"
    buffer_cap: Optional[int] = Field(None, ge=1, description="most samples a device keeps (memory bound)")
    batch: Any = Field("fixed", description="fixed (workload.batch_size), {fixed: b}, stream or "
                                            "{stream: {b_min, b_max}} (b_i = rate clipped)")

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: Any) -> Any:
        from testbed.data.streaming.rates import ConstantRate, TraceRate, parse_rate_spec

        if isinstance(v, list):
            if not v:
                raise ValueError("an empty list of rates")
            for i, r in enumerate(v):
                try:
                    spec = parse_rate_spec(r)
                except ValueError as e:
                    raise ValueError(f"[{i}]: {e}") from None
                if not isinstance(spec, (ConstantRate, TraceRate)):
                    raise ValueError(f"[{i}]: a list of rates holds numbers or {{trace: FILE}}, one per worker")
        else:
            parse_rate_spec(v)
        return v

    @field_validator("batch")
    @classmethod
    def _batch(cls, v: Any) -> Any:
        from testbed.data.streaming.buffer import parse_batch_policy

        if v != "fixed":
            parse_batch_policy(v)
        return v


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
    cpus: Optional[float] = Field(None, gt=0, le=1024, description="cpu: the new CFS quota in cores")
    load: Optional[float] = Field(None, ge=0, le=64, description="stress: cores' worth of busy loop (0 stops)")
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
            extra += [f for f in ("cpus", "load") if getattr(self, f) is not None and self.action != {"cpus": "cpu", "load": "stress"}[f]]
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


class Scenario(StrictModel):
    name: str = "scenario"
    seed: int = Field(0, ge=0, le=2**31 - 1, description="data order, partition, stream rates, crash draws")
    runtime: Literal["auto", "netns", "docker", "swarm"] = "auto"
    placement: dict[str, str] = Field(default_factory=dict, description="runtime swarm: a node, worker group, "
                                      "'workers' or site -> the host it runs on, by hostname or 'label:KEY=VALUE'")
    packages: list[str] = Field(default_factory=list, description="runtime docker: Python packages (folders with "
                                "a pyproject.toml, or wheels) installed into the nodes' image: the plugins' code")
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
    faults: Faults = Field(default_factory=Faults)

    @field_validator("sites")
    @classmethod
    def _sites(cls, v: dict[str, Site]) -> dict[str, Site]:
        for name in v:
            if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", name):
                raise ValueError(f"'{name}' is not a site name (lowercase letters/digits, at most 8, starting with a letter)")
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


def _fmt_loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            # pydantic adds the union member's type name ('str', 'Profile', 'function-before[...]') to loc.
            if part in ("str", "Profile", "int", "list[int]") or "[" in str(part) or part.startswith("function"):
                continue
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _fmt_msg(err: dict) -> str:
    msg = err.get("msg", "")
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if err.get("type") == "extra_forbidden":
        return "unknown field"
    if err.get("type") == "literal_error":
        return f"{excerpt(err.get('input'))} is not one of the allowed values ({msg.split('Input should be ')[-1]})"
    return msg if len(msg) <= MAX_MESSAGE else msg[:MAX_MESSAGE - 3] + "..."  # never echo much of the input


MAX_MESSAGE = 200


def _errors_to_lines(e: ValidationError) -> list[str]:
    lines: list[str] = []
    seen = set()
    for err in e.errors():
        line = f"{_fmt_loc(tuple(err['loc']))}: {_fmt_msg(err)}"
        # A union field (profile: str | Profile) fails once per member; the str member's
        # complaint ("Input should be a valid string") is noise when the dict was meant.
        if "Input should be a valid string" in line or "Input should be a valid integer" in line and "gpus" in line:
            continue
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return lines or [str(e)]


def _external_broker_problems(sc: Scenario) -> list[str]:
    """The nodes reach an external broker at the run's gateway address only (the relay's)."""
    broker = sc.streaming.broker if sc.streaming is not None else None
    if broker is None or broker.kind != "external":
        return []
    gateway = str(next(ipaddress.IPv4Network(sc.network.subnet).hosts()))
    host, port = split_host_port(broker.bootstrap)
    if host != gateway:
        return [f"streaming.broker.bootstrap: the nodes reach an external broker at the run's gateway, "
                f"{gateway}:{port} (relayed to upstream {excerpt(broker.upstream)}), not at {excerpt(host)}"]
    return []


def _cross_checks(sc: Scenario) -> list[str]:
    lines: list[str] = []
    known = ", ".join(sorted(sc.profiles)) or "none defined"
    refs = profile_refs(sc)
    if sc.streaming is not None and isinstance(sc.streaming.rates, list) and len(sc.streaming.rates) != sc.n_workers:
        lines.append(f"streaming.rates: {len(sc.streaming.rates)} rates for {sc.n_workers} workers")
    if sc.sites and sc.streaming is not None and sc.streaming.broker.kind != "tansu":
        lines.append(f"streaming.broker.kind: {sc.streaming.broker.kind} with sites is not supported yet (use tansu)")
    lines += _external_broker_problems(sc)
    for where, ref in refs:
        if isinstance(ref, str) and ref not in sc.profiles:
            lines.append(f"{where}: unknown profile '{ref}' (defined: {known})")
    all_nodes = sc.node_names()
    pairs: set[frozenset] = set()
    for i, link in enumerate(sc.links):
        a, b = link.between
        for n in (a, b):
            if n not in all_nodes:
                lines.append(f"links[{i}].between: unknown node '{n}' (nodes: {', '.join(all_nodes)})")
        if a == b:
            lines.append(f"links[{i}].between: a link from node '{a}' to itself")
        if frozenset((a, b)) in pairs:
            lines.append(f"links[{i}].between: a second link between '{a}' and '{b}'")
        pairs.add(frozenset((a, b)))
    lines += _event_problems(sc, all_nodes)
    names = [n for n, _ in sc.worker_names()]
    nodes = len(sc.node_names())  # the broker and producer nodes too
    if nodes + 1 > ipaddress.IPv4Network(sc.network.subnet).num_addresses - 2:
        lines.append(f"network.subnet: {sc.network.subnet} has too few addresses for {nodes} nodes and a gateway")
    if len(names) > MAX_WORKERS:
        lines.append(f"workers: {len(names)} workers in all; a run takes at most {MAX_WORKERS}")
    for n in names:
        if n in ("ps", "eval", "broker", "producer"):
            lines.append(f"workers: node name '{n}' is reserved")
    if len(set(names)) != len(names):
        lines.append("workers: two groups produce the same node names; give them different 'name' prefixes")
    from testbed.strategies import StrategyError, get_strategy_class

    try:
        cls = get_strategy_class(sc.algorithm.name)
    except StrategyError as e:
        lines.append(f"algorithm.name: {e}")
    else:
        try:
            cls.Params(**sc.algorithm.params)
        except ValidationError as e:
            lines += [f"algorithm.params.{line}" for line in _errors_to_lines(e)]
        except TypeError as e:
            lines.append(f"algorithm.params: {e}")
        if cls.decentralized and sc.workload.injection is not None:
            lines.append(f"workload.injection: {cls.name} is decentralized; data injection runs with PS algorithms")
        if cls.decentralized and sc.streaming is not None:
            lines.append(f"algorithm.name: {cls.name} is decentralized (no PS) and does not train from streams; "
                         "streaming needs a PS algorithm")
    for key, value in sc.placement.items():
        if not resolve_target(sc, key) and key not in sc.sites:
            lines.append(f"placement.{key}: names no node, worker group or site")
        if not value or (value.startswith("label:") and "=" not in value):
            lines.append(f"placement.{key}: '{value}' is neither a host name nor label:KEY=VALUE")
    if sc.network.encrypt and sc.runtime != "swarm":
        lines.append("network.encrypt: encrypts runtime swarm's overlay between hosts (runtime: swarm); a netns or "
                     "docker run's links never leave this machine, so there is no wire to encrypt")
    if sc.runtime == "netns":  # whether an engine answers is the runtime's preflight (testbed.runtimes.preflight)
        if uses_kafka_image(sc):
            lines.append(f"streaming.broker.kind: {KAFKA_NEEDS} and needs the docker runtime (runtime: docker or auto)")
    if sc.workload.test_size is not None and sc.workload.dataset.split(":")[0] in FIXED_SPLIT_DATASETS:
        lines.append(f"workload.test_size: dataset '{sc.workload.dataset}' comes with its own test split")
    # Named profiles and inline ones (`workers[0].profile: {jitter: 5ms}`) alike.
    checked = [(f"profiles.{n}", p) for n, p in sc.profiles.items()]
    checked += [(w, ref) for w, ref in refs if isinstance(ref, Profile)]
    for where, prof in checked:
        for d in ("uplink", "downlink"):
            r = prof.resolved_direction(d)  # type: ignore[arg-type]
            if r.jitter and not r.latency:
                lines.append(f"{where}.{d}: jitter without latency")
    return lines


def resolve_target(sc: Scenario, target: str) -> list[str]:
    """Node names a target stands for ([] when it names nothing)."""
    if target in sc.node_names():
        return [target]
    if target.startswith("wan:"):  # a WAN link between two sites: the target itself
        a, sep, b = target[4:].partition("-")
        linked = sc.wan.mesh or any({a, b} == set(link.between) for link in sc.wan.links)
        return [target] if sep and a in sc.sites and b in sc.sites and a != b and linked else []
    workers = [n for n, _ in sc.worker_names()]
    if target == "workers":
        return workers
    groups: dict[str, list[str]] = {}
    for (name, gi) in sc.worker_names():
        groups.setdefault(sc.workers[gi].name or "w", []).append(name)
    return groups.get(target, [])


def _event_problems(sc: Scenario, all_nodes: list[str]) -> list[str]:
    lines = []
    groups = sorted({g.name or "w" for g in sc.workers})
    for i, ev in enumerate(sc.events):
        nodes = resolve_target(sc, ev.target)
        if not nodes:
            lines.append(f"events[{i}].target: '{ev.target}' is no node, worker group, 'workers' or WAN link "
                         f"wan:A-B (nodes: {', '.join(all_nodes)}; groups: {', '.join(groups)})")
        elif ev.action in ("kill", "restart", "pause", "resume") and set(nodes) & {"broker", "producer"} \
                and sc.streaming is not None and sc.streaming.broker.kind == "kafka":
            lines.append(f"events[{i}].target: {ev.action} of the kafka broker's node is not supported")
        elif ev.action == "restart" and set(nodes) & {"broker", "producer"}:
            lines.append(f"events[{i}].action: the broker's node is not restarted (killing it ends the run: "
                         "the workers' streams and topics go with it)")
        if ev.target.startswith("wan:") and nodes and ev.action != "link":
            lines.append(f"events[{i}].action: a WAN link ({ev.target}) takes link events only, not {ev.action}")
        if ev.action == "cpu" and ev.cpus is not None:
            refs = [sc.node_profile_ref(n) for n in nodes]
            periods = {sc.profile_of(r).cpu_period for r in refs if not isinstance(r, str) or r in sc.profiles}
            for problem in {cpu_quota_problem(ev.cpus, p) for p in periods} - {None}:
                lines.append(f"events[{i}].cpus: {problem}")
        for peer in ev.peers:
            if not resolve_target(sc, peer):
                lines.append(f"events[{i}].peers: '{peer}' is no node, worker group or 'workers'")
        if ev.trace is not None:
            try:
                read_link_trace(ev.trace)
            except (OSError, ValueError) as e:
                lines.append(f"events[{i}].trace: {e}")
    return lines


KAFKA_NEEDS = "kafka runs Apache Kafka from its image"


def gpu_fields(sc: Scenario) -> list[str]:
    """The fields that ask for GPUs: named profiles and inline ones."""
    return [where for where, _ in gpu_profiles(sc)]


def gpu_profiles(sc: Scenario) -> list[tuple[str, Profile]]:
    """(`...gpus` field, profile) of every profile with GPUs: named ones and inline ones."""
    found = [(f"profiles.{n}.gpus", p) for n, p in sc.profiles.items() if p.has_gpus()]
    return found + [(f"{w}.gpus", ref) for w, ref in profile_refs(sc) if isinstance(ref, Profile) and ref.has_gpus()]


def profile_refs(sc: Scenario) -> list[tuple[str, Any]]:
    """(field, profile name or inline profile) of every place a scenario names a profile."""
    refs: list[tuple[str, Any]] = [("ps.profile", sc.ps.profile), ("evaluator.profile", sc.evaluator.profile)]
    refs += [(f"workers[{i}].profile", g.profile) for i, g in enumerate(sc.workers)]
    if sc.streaming is not None:
        refs.append(("streaming.broker.profile", sc.streaming.broker.profile))
        refs.append(("streaming.broker.producer_profile", sc.streaming.broker.producer_profile))
    return refs + [(f"sites.{n}.lan", site.lan) for n, site in sc.sites.items()]


def uses_kafka_image(sc: Scenario) -> bool:
    return sc.streaming is not None and sc.streaming.broker.kind == "kafka"


def validate_schema(data: Any) -> Scenario:
    """The scenario's fields and their cross-checks, one line per problem naming the field.
    What needs a plan (sites' subnets, WAN connectivity) is checked by testbed.plan.parse_scenario,
    the function callers use."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(["(top level): a scenario must be a mapping of fields"])
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as e:
        raise ScenarioError(_errors_to_lines(e)) from None
    lines = _cross_checks(sc)
    if lines:
        raise ScenarioError(lines)
    return sc


def read_scenario_file(path: Union[str, Path], trace_dirs: Sequence[Union[str, Path]] = ()) -> Any:
    """A scenario file's fields, its relative trace paths taken from the file's folder.

    Traces are read from that folder and its subfolders only, or from `trace_dirs`: a scenario
    handed over by someone else cannot make edgebed open any file on the host."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError([f"{p}: no such scenario file"])
    try:
        data = load_yaml_file(p)
    except LoadError as e:
        raise ScenarioError([f"{p}: {e}"]) from None
    data = _resolve_event_traces(_resolve_trace_paths(data, p.parent), p.parent)
    outside = traces_outside(data, [p.parent, *map(Path, trace_dirs)])
    if outside:
        raise ScenarioError(outside)
    return data


def traces_outside(data: Any, roots: Sequence[Path]) -> list[str]:
    """A line per trace path (streaming rates, events) that resolves outside every root folder
    (symbolic links followed), naming the field."""
    folders = [Path(os.path.realpath(r)) for r in roots]
    lines = []
    for field, trace in _trace_fields(data):
        real = Path(os.path.realpath(trace))
        if not any(real == f or f in real.parents for f in folders):
            lines.append(f"{field}: {excerpt(trace)} is outside the scenario's folder ({excerpt(str(roots[0]))}); "
                         "traces are read from there only (edgebed up/validate --trace-dir DIR allows another)")
    return lines


def _trace_fields(data: Any) -> list[tuple[str, str]]:
    """(field, path) of every trace a scenario's raw fields name."""
    out = []
    st = data.get("streaming") if isinstance(data, dict) else None
    rates = st.get("rates") if isinstance(st, dict) else None
    for i, r in (enumerate(rates) if isinstance(rates, list) else [(None, rates)]):
        if isinstance(r, dict) and isinstance(r.get("trace"), str) and r["trace"].strip():
            out.append((f"streaming.rates{'' if i is None else f'[{i}]'}.trace", r["trace"]))
    events = data.get("events") if isinstance(data, dict) else None
    for i, ev in enumerate(events if isinstance(events, list) else []):
        if isinstance(ev, dict) and isinstance(ev.get("trace"), str) and ev["trace"].strip():
            out.append((f"events[{i}].trace", ev["trace"]))
    return out


def _resolve_trace_paths(data: Any, base: Path) -> Any:
    """Relative `{trace: FILE}` rates are taken from the scenario file's folder, not the cwd."""
    st = data.get("streaming") if isinstance(data, dict) else None
    if not isinstance(st, dict):
        return data

    def fix(r: Any) -> Any:
        if isinstance(r, dict) and set(r) == {"trace"} and isinstance(r["trace"], str) \
                and r["trace"].strip() and not Path(r["trace"].strip()).is_absolute():
            return {"trace": str((base / r["trace"].strip()).resolve())}
        return r

    if "rates" in st:
        rates = st["rates"]
        st["rates"] = [fix(r) for r in rates] if isinstance(rates, list) else fix(rates)
    return data


def _resolve_event_traces(data: Any, base: Path) -> Any:
    """Relative event traces are taken from the scenario file's folder, not the cwd."""
    events = data.get("events") if isinstance(data, dict) else None
    for ev in events if isinstance(events, list) else []:
        t = ev.get("trace") if isinstance(ev, dict) else None
        if isinstance(t, str) and t.strip() and not Path(t.strip()).is_absolute():
            ev["trace"] = str((base / t.strip()).resolve())
    return data


def scenario_to_yaml(sc: Scenario) -> str:
    """The resolved scenario (defaults filled in), as written to RUN/scenario.yaml."""
    return yaml.safe_dump(sc.model_dump(mode="json", exclude_none=True), sort_keys=False)
