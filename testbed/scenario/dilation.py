"""Virtual time: a scenario as the wall sees it when its world runs k times slower.

A scenario states its world: link rates, delays, event times, timeouts, a device's speed. A run
dilated by k (`dilation: K`, `edgebed up --dilation K`; Gupta et al., "To Infinity and Beyond:
Time-Warped Network Emulation", NSDI 2006) keeps every one of them on a clock k times slower:
each time the world states is k times as long on the wall and each rate (bit/s, a CPU quota's
cores, a background load) k times smaller, so a host k times too small for the world gives each
node what it was promised. The bandwidth-delay product in packets is unchanged (rate / k times
delay x k), and so are a transfer's packets, a step's samples and every count. The records are
turned back to the world's seconds as they are written (records.virtual).

`wall_scenario` is that one transformation, made from the schema's own marks: every field
annotated `Virtual("time")` (fields.Seconds, fields.Delay, and each plain field so marked)
multiplied by k, every `Virtual("rate")` (fields.Rate, a quota's cores) divided by k. What the
marks do not reach is scaled where it is planned: trace replays (scenario.traces, a schedule's
`dilated`), a device's step time (run.devices), stream rates (plan.streams), and an algorithm's
parameters (its `Params` model's marked fields, here)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel

from testbed.errors import BadInput
from testbed.records.virtual import Virtual
from testbed.scenario.profiles import DEFAULT_CPU_PERIOD_S, MAX_CPU_PERIOD_S, Profile, cpu_quota_problem
from testbed.scenario.schema import Scenario

MAX_DILATION = 64.0


class DilationError(BadInput):
    """A scenario that cannot be dilated by the factor asked (one line naming the field)."""


def factor(sc: Scenario) -> float:
    """k of a scenario that has one (a number); 1 for `auto` not yet chosen."""
    return float(sc.dilation) if not isinstance(sc.dilation, str) else 1.0


def mark_of(info: Any) -> Optional[str]:
    """'time' or 'rate' for a field (pydantic FieldInfo) marked Virtual, else None."""
    return next((m.kind for m in getattr(info, "metadata", ()) if isinstance(m, Virtual)), None)


def _scaled(value: Any, kind: str, k: float) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value  # None, or a union's other member ('random')
    return value * k if kind == "time" else value / k


def dilate_model(model: BaseModel, k: float, path: str = "") -> BaseModel:
    """`model` with every marked field scaled by k (times x k, rates / k), its sub-models too;
    no validator runs again (a field's bounds are the world's)."""
    updates: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        value = getattr(model, name)
        kind = mark_of(info)
        where = f"{path}{name}"
        if kind is not None:
            updates[name] = _scaled(value, kind, k)
        elif isinstance(value, BaseModel):
            updates[name] = dilate_model(value, k, where + ".")
        elif isinstance(value, list):
            updates[name] = [dilate_model(v, k, f"{where}[{i}].") if isinstance(v, BaseModel) else v
                             for i, v in enumerate(value)]
        elif isinstance(value, dict):
            updates[name] = {key: dilate_model(v, k, f"{where}.{key}.") if isinstance(v, BaseModel) else v
                             for key, v in value.items()}
    out = model.model_copy(update=updates)
    cpus = out.cpus if isinstance(out, Profile) else None
    if isinstance(out, Profile) and cpus is not None:
        period = wall_period(out.cpu_period, k)
        out = out.model_copy(update={"cpu_period": period})
        problem = cpu_quota_problem(cpus, period)
        if problem:
            raise DilationError(f"{path}cpus: under dilation {k:g}, {problem}")
    return out


def wall_period(period: Optional[float], k: float) -> float:
    """A quota's CFS period on the wall: k times the world's (at most the kernel's 1 s), so that
    a period holds the same CPU time at cpus / k and CFS's rhythm (a burst at full speed up to
    the quota, then a wait for the next period) is the world's rhythm, k times slower."""
    return min(MAX_CPU_PERIOD_S, (period if period is not None else DEFAULT_CPU_PERIOD_S) * k)


def dilate_params(name: str, params: dict, k: float) -> dict:
    """An algorithm's parameters with the fields its `Params` model marks scaled; the others as given."""
    from testbed.strategies import get_strategy_class

    model = getattr(get_strategy_class(name), "Params", None)
    if model is None or not params:
        return dict(params)
    out = dict(params)
    for field_name, info in model.model_fields.items():
        kind = mark_of(info)
        if kind is not None and field_name in out:
            out[field_name] = _scaled(out[field_name], kind, k)
    return out


def wall_scenario(sc: Scenario, k: float) -> Scenario:
    """The scenario as the wall sees it under dilation k (its `dilation` then k): what a run makes
    and runs. k = 1 gives the scenario itself."""
    if not 1.0 <= k <= MAX_DILATION:
        raise DilationError(f"dilation: {k:g} is outside 1-{MAX_DILATION:g}")
    if k == 1.0:
        return sc.model_copy(update={"dilation": 1.0})
    wall = dilate_model(sc, k)
    assert isinstance(wall, Scenario)
    algorithm = wall.algorithm.model_copy(update={"params": dilate_params(sc.algorithm.name, sc.algorithm.params, k)})
    return wall.model_copy(update={"dilation": k, "algorithm": algorithm})
