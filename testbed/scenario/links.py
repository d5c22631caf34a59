"""The link properties, declared once. Every place that shapes a direction (a profile, a site's
LAN, a `links:` pair, a WAN link, an event, `edgebed link`) uses `Direction`'s fields, and one
rule, `inherit`, says which value wins: the most specific layer that sets a property
(event > `links:` pair > the node's profile > its site's LAN profile; a direction's own field >
the fields a profile or link sets for both directions)."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator

from testbed.scenario.fields import Delay, Probability, Rate, StrictModel, UndilatedSeconds
from testbed.scenario.traces import MAX_RESOLUTION_S, MIN_RESOLUTION_S


class BurstLoss(StrictModel):
    """Bursty loss, a two-state Gilbert-Elliott chain stepped every replay tick: good -> bad with
    probability `p`, bad -> good with `r`; each state drops with its own probability."""

    p: float = Field(..., gt=0, le=1, description="per tick, the chance to go from good to bad")
    r: float = Field(..., gt=0, le=1, description="per tick, the chance to go from bad to good")
    good_loss: float = Field(0.0, ge=0, le=1)
    bad_loss: float = Field(1.0, ge=0, le=1)


class Direction(StrictModel):
    """One direction of a link. Unset properties are inherited (`inherit`)."""

    rate: Rate = None  # None = unshaped
    latency: Delay = None  # one-way
    jitter: Delay = None
    loss: Probability = None
    # a recorded trace the rate follows (scenario/traces.py), replayed in place every resolution
    trace: Optional[str] = Field(default=None, min_length=1, max_length=300, description="a catalog name (traces "
                                 "README), a library path (mahimahi/ATT-LTE-driving.up) or a file beside the scenario")
    # a recorded delay the latency follows (scenario/latency_traces.py), on the trace's clock and settings
    latency_trace: Optional[str] = Field(default=None, min_length=1, max_length=300, description="a latency "
                                         "catalog name, `ping -D` output (half of each RTT), a CICV5G table or "
                                         "time,latency rows; replaces `latency`")
    trace_loop: Optional[bool] = Field(default=None, description="at the trace's end: start over (default) "
                                                                 "or hold its last rate")
    trace_offset: Union[Literal["random"], UndilatedSeconds] = Field(
        default=None, description="where in the trace a node starts: seconds, or random (per node, from the "
        "scenario's seed)")
    trace_resolution: UndilatedSeconds = Field(default=None, description="how often the rate changes (default 100ms)")
    burst_loss: Optional[BurstLoss] = Field(default=None, description="Gilbert-Elliott loss, its state stepped "
                                            "every trace_resolution (replaces `loss`)")

    @field_validator("trace_resolution")
    @classmethod
    def _resolution(cls, v: Optional[float]) -> Optional[float]:
        return trace_resolution(v)

    def set_properties(self) -> dict:
        """The properties this direction sets, by name."""
        return {f: getattr(self, f) for f in LINK_PROPERTIES if getattr(self, f) is not None}


def trace_resolution(v: Optional[float]) -> Optional[float]:
    """A replay's tick, within 10 ms (finer is timer noise) and 10 s."""
    if v is not None and not MIN_RESOLUTION_S <= v <= MAX_RESOLUTION_S:
        raise ValueError(f"{v:g}s is outside {MIN_RESOLUTION_S * 1e3:g}ms-{MAX_RESOLUTION_S:g}s")
    return v


TRACE_FIELDS: tuple[str, ...] = ("trace", "latency_trace", "trace_loop", "trace_offset", "trace_resolution",
                                 "burst_loss")
LINK_PROPERTIES: tuple[str, ...] = tuple(f for f in Direction.model_fields if f not in TRACE_FIELDS)


class BothDirections(StrictModel):
    """Link properties given once for both directions; `bandwidth` is both directions' rate."""

    bandwidth: Rate = None
    latency: Delay = None
    jitter: Delay = None
    loss: Probability = None

    def both(self) -> Direction:
        return Direction(rate=self.bandwidth, latency=self.latency, jitter=self.jitter, loss=self.loss)


def inherit(*layers: Optional[Direction]) -> Direction:
    """Each property from the first layer (most specific first) that sets it."""
    return Direction(**{f: next((getattr(d, f) for d in layers if d is not None and getattr(d, f) is not None), None)
                        for f in Direction.model_fields})


def as_direction(v: Any) -> Any:
    """`uplink: 10mbit` is shorthand for `uplink: {rate: 10mbit}`."""
    if v is None or isinstance(v, (dict, Direction)):
        return v
    return {"rate": v}
