"""The world's time and the wall's (virtual time, scenario.dilation): a quantity's mark, and the
records turned into the world's units as they are written.

Under dilation k the run happens k times slower on the wall than in the world the scenario
states. A node and the runner measure wall seconds; each row is written in the world's: every
time and duration divided by k, every rate (bit/s, samples/s, a quota's cores) multiplied by k.
Counts (bytes, packets, steps, samples) and shares are the same in both, and so is CPU time
(a quota of c/k cores for k x T seconds is c x T CPU seconds: the world's).
"""

from __future__ import annotations

from typing import Any


class Virtual:
    """A field's mark: a quantity of the emulated world, which a run dilated by k stretches on
    the wall: a time by k (kind 'time'), a rate divided by k (kind 'rate')."""

    def __init__(self, kind: str):
        if kind not in ("time", "rate"):
            raise ValueError(f"a Virtual mark is 'time' or 'rate', not {kind!r}")
        self.kind = kind

    def __repr__(self) -> str:
        return f"Virtual({self.kind!r})"


VIRTUAL_TIME, VIRTUAL_RATE = Virtual("time"), Virtual("rate")

# Each table's columns that are not counts: "time" (seconds: / k on the way to the world) or
# "rate" (per second: x k); "times" is a space-separated list of times.
COLUMN_KINDS: dict[str, dict[str, str]] = {
    "steps.csv": {"time": "time", "compute_seconds": "time", "comm_seconds": "time"},
    "eval.csv": {"time": "time", "evaluated_at": "time"},
    "traffic.csv": {"time": "time"},
    "events.csv": {"time": "time", "scheduled_time": "time"},
    "server.csv": {"time": "time"},
    "rounds.csv": {"time": "time", "open_seconds": "time", "report_seconds": "times"},
    "resources.csv": {"time": "time", "throttled_seconds": "time", "wait_seconds": "time", "cpu_quota": "rate"},
    "stream.csv": {"time": "time", "wait_seconds": "time"},
    "buffer.csv": {"time": "time"},  # its rate: the device's nominal one, the world's already
    "peers.csv": {"time": "time"},
    "report.csv": {"time": "time"},
    "shaping.csv": {"time": "time", "rate_bps": "rate"},
    "link_rates.csv": {"time": "time", "rate_bps": "rate", "trace_time": "time", "latency_s": "time"},
    "link_check.csv": {"configured_bps": "rate", "measured_bps": "rate", "expected_rtt_s": "time",
                       "measured_rtt_s": "time", "min_rtt_s": "time"},
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def to_world(value: Any, kind: str, k: float) -> Any:
    """A wall value of `kind` in the world's units (None, text and counts as they are)."""
    if kind == "times" and isinstance(value, str):
        return " ".join(f"{float(v) / k:.6g}" for v in value.split())
    if not _number(value):
        return value
    return value / k if kind == "time" else value * k


def world_row(table: str, row: dict[str, Any], k: float) -> dict[str, Any]:
    """A row of `table` measured on the wall of a run dilated by k, in the world's units."""
    kinds = COLUMN_KINDS.get(table)
    if k == 1 or not kinds:
        return row
    return {c: to_world(v, kinds[c], k) if c in kinds else v for c, v in row.items()}
