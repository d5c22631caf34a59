"""A scenario's cluster shape: device profiles (compute budget and access link), nodes, sites
and the links between them, worker groups."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from testbed.kernel import cgroups
from testbed.scenario.devices.catalog import Speed, check_name
from testbed.scenario.fields import VIRTUAL_RATE, Bytes, StrictModel, UndilatedSeconds
from testbed.scenario.links import (
    TRACE_FIELDS,
    BothDirections,
    BurstLoss,
    Direction,
    as_direction,
    inherit,
    trace_resolution,
)


class Stress(StrictModel):
    """Background CPU load inside the node's own cgroup (competes with training for the quota)."""

    cpu: Annotated[float, VIRTUAL_RATE] = Field(0.5, gt=0, le=64, description="cores' worth of busy-looping "
                                                "(0.5 = half a core)")
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

    cpus: Annotated[Optional[float], VIRTUAL_RATE] = Field(None, gt=0, le=1024, description="CPU quota in cores "
                                                           "(0.25 = quarter core)")
    cpu_period: UndilatedSeconds = Field(None, description="the CFS period the quota is counted over (default 100ms, "
                                "Docker's too): a shorter one throttles in shorter slices")
    cpuset: Optional[str] = Field(None, description="CPUs to pin to, e.g. '0' or '0-1'")
    device: Optional[str] = Field(None, description="a device of the catalog (edgebed devices): the node is "
                                  "calibrated on its host and runs at the device's speed (not with cpus)")
    speed: Optional[Speed] = Field(None, description="the speed in the catalog's unit, {gflops: per core, cores: N} "
                                   "(not with cpus or device)")
    pace_steps: Optional[bool] = Field(None, description="a device's training steps held to its time in user "
                                       "space, under a quota with headroom (node.pacing), not by the quota alone; "
                                       "the default for a device profile (false: the quota alone)")
    memory: Bytes = None
    uplink: Optional[Direction] = None
    downlink: Optional[Direction] = None
    stress: Optional[Stress] = None
    gpus: Optional[Union[int, list[int]]] = Field(None, description="a count (the first N of the host's) or "
                                                  "the host's GPU indices")
    gpu_memory: Bytes = Field(None, description="the most GPU memory the node may allocate (past it, it fails)")
    gpu_share: Optional[float] = Field(None, gt=0, le=1, description="the fraction of the GPU's compute the "
                                       "node may use (paced steps; MPS threads for a command workload)")
    # a recorded trace for both directions (a catalog name picks .up for the uplink, .down for the downlink)
    trace: Optional[str] = Field(None, min_length=1, max_length=300)
    latency_trace: Optional[str] = Field(None, min_length=1, max_length=300)  # each direction gets half an RTT
    trace_loop: Optional[bool] = None
    trace_offset: Union[Literal["random"], UndilatedSeconds] = None
    trace_resolution: UndilatedSeconds = None
    burst_loss: Optional[BurstLoss] = None

    @field_validator("uplink", "downlink", mode="before")
    @classmethod
    def _dir(cls, v: Any) -> Any:
        return as_direction(v)

    @field_validator("trace_resolution")
    @classmethod
    def _resolution(cls, v: Optional[float]) -> Optional[float]:
        return trace_resolution(v)

    @field_validator("cpuset")
    @classmethod
    def _cpuset(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", str(v)):
            raise ValueError(f"'{v}' is not a cpuset (e.g. '0', '0-1', '0,2')")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: Optional[str]) -> Optional[str]:
        bad = check_name(v) if v is not None else None
        if bad:
            raise ValueError(f"the value {bad}")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 0 or isinstance(v, list) and any(g < 0 for g in v):
            raise ValueError(f"{v!r} is not a GPU count or list of GPU indices")
        return v

    @model_validator(mode="after")
    def _quota(self) -> "Profile":
        if self.cpus is not None and (self.device is not None or self.speed is not None):
            which = "device" if self.device is not None else "speed"
            raise ValueError(f"{which}: a device's quota comes from calibrating its host; not together with cpus "
                             "(a share of whatever host runs the node): keep one")
        if self.device is not None and self.speed is not None:
            raise ValueError("speed: the device names its speed; give device or speed, not both")
        if self.pace_steps and not self.is_device():
            raise ValueError("pace_steps: paces a device's steps to its calibrated time; give device or speed")
        if self.cpu_period is not None:
            if self.cpus is None and self.is_device():
                raise ValueError("cpu_period: goes with cpus; a device's calibrated quota runs over the default "
                                 "100ms period")
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

    def is_device(self) -> bool:
        """Whether the node's speed is in device terms (calibrated per host), not a host share."""
        return self.device is not None or self.speed is not None

    def paces_steps(self) -> bool:
        """Whether a device node's steps are paced (node/pacing.py): by default, unless pace_steps is false.
        Paced, a step keeps its device's time far more closely than by the quota alone
        (BENCHMARKS.md, "Device profiles")."""
        return self.is_device() and self.pace_steps is not False

    def has_gpus(self) -> bool:
        return self.gpus not in (None, 0, [])

    def resolved_direction(self, which: Literal["uplink", "downlink"]) -> Direction:
        """The direction with the profile-wide properties filled in."""
        return inherit(getattr(self, which), self.both(), Direction(**{f: getattr(self, f) for f in TRACE_FIELDS}))


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
    count: int = Field(1, ge=1, le=10_000)
    profile: Union[str, Profile, None] = None
    name: Optional[str] = Field(None, description="prefix of the node names of this group (default 'w')")
    site: Optional[str] = Field(None, description="the site (LAN) of this group's nodes; default: the first site")

    @field_validator("name")
    @classmethod
    def _name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.fullmatch(r"[a-z][a-z0-9]{0,5}", v):
            raise ValueError(f"'{v}' is not a group name (lowercase letters/digits, at most 6, starting with a letter)")
        return v
