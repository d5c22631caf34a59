"""The link properties, declared once. Every place that shapes a direction (a profile, a site's
LAN, a `links:` pair, a WAN link, an event, `edgebed link`) uses `Direction`'s fields, and one
rule, `inherit`, says which value wins: the most specific layer that sets a property
(event > `links:` pair > the node's profile > its site's LAN profile; a direction's own field >
the fields a profile or link sets for both directions)."""

from __future__ import annotations

from typing import Any, Optional

from testbed.scenario.fields import Delay, Probability, Rate, StrictModel


class Direction(StrictModel):
    """One direction of a link. Unset properties are inherited (`inherit`)."""

    rate: Rate = None  # None = unshaped
    latency: Delay = None  # one-way
    jitter: Delay = None
    loss: Probability = None

    def set_properties(self) -> dict:
        """The properties this direction sets, by name."""
        return {f: getattr(self, f) for f in LINK_PROPERTIES if getattr(self, f) is not None}


LINK_PROPERTIES: tuple[str, ...] = tuple(Direction.model_fields)


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
                        for f in LINK_PROPERTIES})


def as_direction(v: Any) -> Any:
    """`uplink: 10mbit` is shorthand for `uplink: {rate: 10mbit}`."""
    if v is None or isinstance(v, (dict, Direction)):
        return v
    return {"rate": v}
