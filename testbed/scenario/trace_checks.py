"""Validation of the scenario's link traces (`uplink: {trace: ...}`, a profile's `trace:`): one
line per problem naming the field, before anything starts. A trace is read here (its format, its
rates, its length against its resolution), as it will be when the run replays it."""

from __future__ import annotations

from typing import Any

from testbed.scenario.latency_traces import delay_schedule
from testbed.scenario.links import Direction
from testbed.scenario.traces import direction_schedule


def _direction_problem(where: str, d: Direction, which: str) -> list[str]:
    for name, schedule in (("trace", direction_schedule), ("latency_trace", delay_schedule)):
        if getattr(d, name) is None:
            continue
        try:
            schedule(d, which, 0, "check")
        except ValueError as e:
            return [f"{where}.{name}: {(str(e).splitlines() or ['unreadable'])[0][:300]}"]
    return []


def trace_problems(sc: Any, refs: list[tuple[str, Any]]) -> list[str]:
    """Every traced access-link direction of the scenario's profiles (named, inline, sites' LANs)
    read and checked; a trace on a WAN link or a `links:` pair is refused (not replayed there)."""
    from testbed.scenario.profiles import Profile

    lines: list[str] = []
    checked = [(f"profiles.{n}", p) for n, p in sc.profiles.items()]
    checked += [(w, ref) for w, ref in refs if isinstance(ref, Profile)]
    for where, prof in checked:
        for which, name in (("up", "uplink"), ("down", "downlink")):
            own = getattr(prof, name)
            field = f"{where}.{name}" if own is not None and (own.trace or own.latency_trace) else where
            lines += _direction_problem(field, prof.resolved_direction(name), which)
    shapes = [(f"wan.links[{i}]", link) for i, link in enumerate(sc.wan.links)] + [("wan.default", sc.wan.default)]
    shapes += [(f"links[{i}]", link) for i, link in enumerate(sc.links)]
    for where, shape in shapes:
        for side in ("forward", "reverse"):
            d = getattr(shape, side)
            for key in ("trace", "latency_trace"):
                if d is not None and getattr(d, key) is not None:
                    lines.append(f"{where}.{side}.{key}: traces are replayed on access links only (a profile's "
                                 "uplink/downlink or trace)")
    return list(dict.fromkeys(lines))  # a profile's trace: one line, not one per direction


def event_trace_problems(sc: Any) -> list[str]:
    """Each link event's trace read at its resolution, in each direction it changes, as the run will
    replay it; a trace setting on an event without a trace, or a profile's own, refused."""
    lines: list[str] = []
    for i, ev in enumerate(sc.events):
        profiles_own = [f for f in ("latency_trace", "burst_loss") if getattr(ev, f) is not None]
        if profiles_own:
            lines.append(f"events[{i}]: {', '.join(profiles_own)} belong to a profile's link (an event's trace "
                         "replays its own latency column)")
        if ev.trace is None:
            settings = [f for f in ("trace_resolution", "trace_loop", "trace_offset") if getattr(ev, f) is not None]
            if settings:
                lines.append(f"events[{i}]: {', '.join(settings)} apply only to a link event with a trace")
            continue
        for which in (("up", "down") if ev.direction == "both" else (ev.direction,)):
            lines += _direction_problem(f"events[{i}]", ev, which)
    return list(dict.fromkeys(lines))
