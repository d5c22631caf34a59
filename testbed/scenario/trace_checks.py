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
