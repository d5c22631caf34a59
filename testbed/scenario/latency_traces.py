"""Latency traces: a link direction's one-way delay over time, replayed like its rate (every tick
of the trace's resolution, changed only when it differs). Where it comes from:

- `latency_trace: FILE`, one of
  - `ping -D` output (`*.ping`, optionally gzipped): each reply's `[epoch] ... time=X ms` is a
    round-trip time, and each direction gets half of it (so a profile-wide `latency_trace:`
    gives the link the recorded RTT); lines without a reply (loss, `no answer yet`, the
    header and statistics) are skipped, the delay holding until the next reply;
  - a CSV of `time,latency` rows (seconds; a duration such as `20ms`, or a bare number in
    seconds). The header names the column's meaning: a name containing `rtt` is round trip
    (halved per direction), a name ending in `_ms` makes bare numbers milliseconds
    (`time,rtt_ms` is the usual shape of a recorded RTT log);
  - CICV5G's whitespace tables (a header naming `pub_time(ms)` and `delay(ms)`: a 5G round trip
    per echoed message), as the two shipped in testbed/traces/cicv5g/ (`LATENCY_CATALOG`);
- or the third column of a `trace:` CSV (`time,bandwidth,latency`), which is one-way.

Mahimahi's and Pensieve's formats carry no delay: a `trace:` in them replays the rate only.
"""

from __future__ import annotations

import csv
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from testbed.scenario import units
from testbed.scenario.traces import (
    CATALOG,
    DEFAULT_RESOLUTION_S,
    LIBRARY,
    MAX_TRACE_SECONDS,
    TraceSchedule,
    check_ticks,
    is_number,
    node_offset,
    read_link_trace,
    read_trace_text,
    sample_steps,
    steps_duration,
    trace_file,
    trace_kind,
)

PING_SUFFIX = ".ping"
# short name -> a recorded latency trace in the library (testbed/traces/README.md: sources, licences)
LATENCY_CATALOG: dict[str, str] = {
    "cicv5g-arterial-60": "cicv5g/arterial_n78_v60_run02.txt.gz",  # 5G n78, driving at 60 km/h, 61 s
    "cicv5g-urban-30": "cicv5g/urban_n78_v30_run01.txt.gz",  # 5G n78, urban road at 30 km/h, 244 s
}
CICV5G_TIME, CICV5G_RTT = "pub_time(ms)", "delay(ms)"  # CICV5G's columns: send time, round trip
MAX_DELAY_S = 10.0  # a one-way delay above 10 s is a wrong unit, not a link
# `ping -D`: "[1700000000.123456] 64 bytes from 10.0.0.1: icmp_seq=1 ttl=64 time=23.4 ms"
_PING_REPLY = re.compile(r"^\[(\d+(?:\.\d+)?)\].*?\btime[=<]\s*(\d+(?:\.\d+)?)\s*ms\b")
_PING_ANY_REPLY = re.compile(r"\btime[=<]\s*\d")

DelayRow = tuple[float, float]  # (time s, one-way delay s)


def _is_ping(p: Path) -> bool:
    return (Path(p.stem).suffix if p.suffix == ".gz" else p.suffix) == PING_SUFFIX


def read_delay_rows(path: str | Path) -> list[DelayRow]:
    """(time from the first row, one-way delay) rows of a latency trace, time ascending; errors name
    the line and never quote it."""
    p = Path(path)
    text = read_trace_text(p)
    first = text.lstrip().split("\n", 1)[0].split()
    rows = _read_ping(p, text) if _is_ping(p) else _read_cicv5g(p, text) if CICV5G_TIME in first \
        else _read_delay_csv(p, text)
    if not rows:
        raise ValueError(f"{p}: no delays (a latency trace is `ping -D` output or `time,latency` rows)")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    if rows[-1][0] - t0 > MAX_TRACE_SECONDS:  # epoch-stamped rows (ping, CICV5G) are checked only here
        raise ValueError(f"{p}: the rows span more than {MAX_TRACE_SECONDS} s")
    return [(t - t0, d) for t, d in rows]


def _checked(p: Path, i: int, t: float, delay: float, max_t: float = MAX_TRACE_SECONDS) -> DelayRow:
    if not 0 <= t <= max_t:
        raise ValueError(f"{p}: line {i + 1}: the time is not within 0 and {max_t:g} s")
    if not 0 <= delay <= MAX_DELAY_S:
        raise ValueError(f"{p}: line {i + 1}: a one-way delay outside 0-{MAX_DELAY_S:g} s (a wrong unit?)")
    return t, delay


def _read_ping(p: Path, text: str) -> list[DelayRow]:
    rows = []
    for i, line in enumerate(text.splitlines()):
        m = _PING_REPLY.match(line.strip())
        if m is None:
            if _PING_ANY_REPLY.search(line) and not line.lstrip().startswith("["):
                raise ValueError(f"{p}: line {i + 1}: a reply without a [timestamp] (record with `ping -D`)")
            continue
        rows.append(_checked(p, i, float(m.group(1)), float(m.group(2)) / 1e3 / 2, max_t=4e9))  # epoch seconds
    return rows


def _read_cicv5g(p: Path, text: str) -> list[DelayRow]:
    """CICV5G's whitespace table (zxr805/CICV5G): a header naming `pub_time(ms)` and `delay(ms)`,
    one row per echoed message; the delay is its round trip."""
    lines = text.strip().splitlines()
    header = lines[0].split()
    if CICV5G_RTT not in header:
        raise ValueError(f"{p}: line 1 names {CICV5G_TIME} but not {CICV5G_RTT}")
    at, rtt = header.index(CICV5G_TIME), header.index(CICV5G_RTT)
    rows = []
    for i, line in enumerate(lines[1:], start=1):
        cols = line.split()
        if not cols:
            continue
        try:
            t, d = float(cols[at]) / 1e3, float(cols[rtt]) / 1e3 / 2
        except (ValueError, IndexError):
            raise ValueError(f"{p}: line {i + 1}: no {CICV5G_TIME} and {CICV5G_RTT} numbers") from None
        rows.append(_checked(p, i, t, d, max_t=4e9))  # epoch seconds, rebased by the caller
    return rows


def _column_scale(name: str) -> tuple[float, float]:
    """(bare-number unit in seconds, share of the value that is this direction's) from a header name."""
    n = name.strip().lower()
    return (1e-3 if n.endswith("_ms") else 1.0), (0.5 if "rtt" in n else 1.0)


def _read_delay_csv(p: Path, text: str) -> list[DelayRow]:
    rows: list[DelayRow] = []
    unit, share = 1.0, 1.0
    for i, rec in enumerate(csv.reader(text.splitlines())):
        if not rec or rec[0].strip().startswith("#"):
            continue
        if i == 0 and not is_number(rec[0]):
            unit, share = _column_scale(rec[-1]) if len(rec) >= 2 else (1.0, 1.0)
            continue
        try:
            t = float(rec[0])
            value = rec[-1].strip() if len(rec) >= 2 else ""
            delay = float(value) * unit if is_number(value) else units.parse_duration(value)
        except (ValueError, IndexError):
            raise ValueError(f"{p}: line {i + 1} is not `time,latency` (seconds, a duration such as 20ms; "
                             "a header such as time,rtt_ms says its unit and that it is round trip)") from None
        rows.append(_checked(p, i, t, delay * share))
    return rows


def rate_trace_delays(path: str | Path) -> list[DelayRow]:
    """The one-way delays of a `trace:` CSV's latency column (empty: the trace has none)."""
    p = Path(path)
    if trace_kind(p) != "csv":
        return []
    rows = read_link_trace(p)
    return [(t, lat) for t, _, lat in rows if lat is not None]


# --------------------------------------------------------------------------------------------
# sampling and the replay schedule


def read_trace_delays(path: str | Path, resolution: float = DEFAULT_RESOLUTION_S,
                      from_rate_trace: bool = False) -> tuple[float, ...]:
    """A latency trace's one-way delay (s) at each tick of `resolution` seconds, read once per
    file (each row holds until the next; the last for the rows' mean spacing)."""
    return _cached_delays(str(path), float(resolution), from_rate_trace)


@lru_cache(maxsize=64)
def _cached_delays(path: str, resolution: float, from_rate_trace: bool) -> tuple[float, ...]:
    rows = rate_trace_delays(path) if from_rate_trace else read_delay_rows(path)
    if not rows:
        return ()
    duration = steps_duration([t for t, _ in rows], resolution)
    check_ticks(Path(path), duration, resolution)
    return tuple(sample_steps(rows, resolution, duration))


def latency_file(ref: str, which: str) -> Path:
    """The file a `latency_trace:` names: a latency catalog name, a library path or a user's file."""
    return LIBRARY / LATENCY_CATALOG[ref] if ref in LATENCY_CATALOG else trace_file(ref, which)


def delay_schedule(d: Any, which: str, seed: int, node: str, dilation: float = 1.0) -> Optional[TraceSchedule]:
    """The delay replay of a direction (a scenario `Direction`) for one node: its `latency_trace`,
    or its `trace:` CSV's latency column; None when it has neither. Its `rates` are one-way delays
    in seconds; offset, loop and resolution are the direction's trace settings, all on the wall of a
    run dilated by `dilation`."""
    resolution = d.trace_resolution if d.trace_resolution is not None else DEFAULT_RESOLUTION_S
    if getattr(d, "latency_trace", None) is not None:
        if d.latency_trace in CATALOG:
            raise ValueError(f"{d.latency_trace} is a rate trace of the catalog; latency traces: "
                             f"{', '.join(LATENCY_CATALOG)}, or `ping -D` output or time,latency rows")
        delays = read_trace_delays(latency_file(d.latency_trace, which), resolution)
        if getattr(d, "trace", None) is not None and read_trace_delays(trace_file(d.trace, which), resolution, True):
            raise ValueError("its trace has a latency column too: give one of trace's latency and latency_trace")
    elif getattr(d, "trace", None) is not None:
        delays = read_trace_delays(trace_file(d.trace, which), resolution, True)
    else:
        return None
    if not delays:
        return None
    offset = node_offset(d.trace_offset, len(delays) * resolution, seed, node, resolution)
    return TraceSchedule(delays, resolution, d.trace_loop is not False, offset).dilated(dilation, dilation)


def with_delay_start(d: Any, which: str, seed: int, node: str, dilation: float = 1.0) -> Any:
    """A direction whose delay is traced, with its delay at the node's start in the trace (so the
    link comes up delayed, and netem, where there is one, is changed in place from then on)."""
    sched = delay_schedule(d, which, seed, node, dilation)
    return d if sched is None else d.model_copy(update={"latency": sched.rate_at(0.0) or None})
