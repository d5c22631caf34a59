"""Link traces an event follows: a CSV of `time,bandwidth[,latency]` or a Mahimahi
packet-delivery trace (`*.up`, `*.down`, `*.mahi`), read into (time, rate, latency) rows."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

from testbed.data.textfile import read_capped_text
from testbed.scenario import units

MAHIMAHI_SUFFIXES = (".up", ".down", ".mahi")
MTU_BITS = 1500 * 8


MAX_TRACE_SECONDS = 7 * 86400  # a Mahimahi trace longer than a week is a wrong timestamp


def read_link_trace(path: str | Path) -> list[tuple[float, float, Optional[float]]]:
    """(time s, rate bit/s, latency s or None) rows of a link trace, time ascending. Errors name
    the line and never quote it."""
    p = Path(path)
    text = read_capped_text(p)
    if p.suffix in MAHIMAHI_SUFFIXES:
        return _read_mahimahi(p, text)
    rows = []
    for i, rec in enumerate(csv.reader(text.splitlines())):
        if not rec or rec[0].strip().startswith("#"):
            continue
        if i == 0 and not _is_number(rec[0]):
            continue  # header
        try:
            t = float(rec[0])
            rate = units.parse_rate(rec[1].strip())
            lat = units.parse_duration(rec[2].strip()) if len(rec) > 2 and rec[2].strip() else None
        except (ValueError, IndexError):
            raise ValueError(f"{p}: line {i + 1} is not `time,bandwidth[,latency]` (seconds, a rate such as "
                             "12mbit, a duration such as 20ms)") from None
        if not 0 <= t <= MAX_TRACE_SECONDS:
            raise ValueError(f"{p}: line {i + 1}: the time is not within 0 and {MAX_TRACE_SECONDS} s")
        rows.append((t, rate, lat))
    if not rows:
        raise ValueError(f"{p}: no rows")
    rows.sort(key=lambda r: r[0])
    return rows


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _read_mahimahi(p: Path, text: str) -> list[tuple[float, float, Optional[float]]]:
    """Mahimahi: each line is a millisecond at which one MTU-sized packet may be delivered (in
    any order here), counted per second."""
    counts: dict[int, int] = {}
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            ms = int(line)
        except ValueError:
            raise ValueError(f"{p}: line {i + 1} is not a delivery time in whole milliseconds") from None
        if not 0 <= ms <= MAX_TRACE_SECONDS * 1000:
            raise ValueError(f"{p}: line {i + 1}: the time is not within 0 and {MAX_TRACE_SECONDS} s")
        counts[ms // 1000] = counts.get(ms // 1000, 0) + 1
    if not counts:
        raise ValueError(f"{p}: no rows")
    # an empty second is an outage: keep a trickle (HTB cannot be set to 0)
    return [(float(s), max(8000.0, counts.get(s, 0) * MTU_BITS), None) for s in range(max(counts) + 1)]
