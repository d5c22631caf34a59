"""The building blocks of the schema: a model that refuses unknown fields, and quantities
written with units (`10mbit`, `20ms`, `1%`, `512MiB`), parsed by units.py."""

from __future__ import annotations

from typing import Annotated, Any, Callable, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict

from testbed.records.virtual import VIRTUAL_RATE, VIRTUAL_TIME, Virtual  # noqa: F401 (the schema's marks)
from testbed.scenario import units


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# --- quantities written with units ------------------------------------------------------------


def _optional(parse: Callable[[Any], Any]) -> BeforeValidator:
    return BeforeValidator(lambda v: None if v is None else parse(v))


# Upper bounds: beyond them a value is a typo, and the kernel or the trainer would refuse it
# late (a rate over HTB's range), or the run would hang (a day of latency).
MAX_RATE = 100e9  # bit/s
MAX_DELAY = 60.0  # s, one-way latency or jitter
MAX_SECONDS = 366 * 86400.0  # s, any other duration: a run, an event's time
MAX_BYTES = 1 << 40  # memory


def _at_most(parse: Callable[[Any], Any], limit: float, show: Callable[[float], str]) -> Callable[[Any], Any]:
    def parse_bounded(v: Any) -> Any:
        x = parse(v)
        if x > limit:
            raise ValueError(f"{show(x)} is above the most edgebed takes here ({show(limit)})")
        return x

    return parse_bounded


def _seconds(x: float) -> str:
    return f"{x:g}s"


_seconds_value = _optional(_at_most(units.parse_duration, MAX_SECONDS, _seconds))
Rate = Annotated[Optional[float], _optional(_at_most(units.parse_rate, MAX_RATE, units.format_rate)),
                 VIRTUAL_RATE]  # bit/s
Delay = Annotated[Optional[float], _optional(_at_most(units.parse_duration, MAX_DELAY, _seconds)), VIRTUAL_TIME]
Seconds = Annotated[Optional[float], _seconds_value, VIRTUAL_TIME]
# A duration that is not the emulated world's: the host's (a CFS period) or a trace's own
# coordinates (its resolution, an offset into it: its replay schedule is what dilates).
UndilatedSeconds = Annotated[Optional[float], _seconds_value]
Probability = Annotated[Optional[float], _optional(units.parse_fraction)]
Bytes = Annotated[Optional[int], _optional(_at_most(units.parse_size, MAX_BYTES, lambda x: f"{x / 2**30:g}GiB"))]
