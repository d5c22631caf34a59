"""Link traces: a CSV of `time,bandwidth[,latency]`, a Mahimahi packet-delivery trace (`*.up`,
`*.down`, `*.mahi`, each optionally gzipped), or Pensieve's cooked `seconds Mbit/s` lines
(`*.mbps`), read into (time, rate, latency) rows; the library of recorded traces shipped in
testbed/traces/ (README there: sources and licences) and its catalog of short names; and a
direction's replay schedule, the rate at each tick of its resolution (`TraceSchedule`).

A link direction's `trace:` and a link event's (`{action: link, trace: FILE}`) are sampled at their
resolution, 100 ms by default (`read_trace_rates`); `read_link_trace` gives a trace's rows as they are
(Mahimahi's binned per second)."""

from __future__ import annotations

import csv
import difflib
import math
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Union

from testbed.data.textfile import MAX_TRACE_BYTES, capped_bytes, gunzip_capped, read_capped_text
from testbed.scenario import units

MAHIMAHI_SUFFIXES = (".up", ".down", ".mahi")
MBPS_SUFFIX = ".mbps"
MTU_BITS = 1500 * 8
MAX_TRACE_SECONDS = 7 * 86400  # a Mahimahi trace longer than a week is a wrong timestamp
MAX_RATE_BPS = 100e9  # a trace rate above 100 Gbit/s is a wrong unit, not a link
MIN_RESOLUTION_S, MAX_RESOLUTION_S = 0.01, 10.0
DEFAULT_RESOLUTION_S = 0.1
# A replay's ticks, at most: every trace at the default resolution (its rows span a week, and their
# mean spacing adds at most as much again); a finer resolution takes a shorter trace.
MAX_TICKS = round(2 * MAX_TRACE_SECONDS / DEFAULT_RESOLUTION_S)

LIBRARY = Path(__file__).resolve().parents[1] / "traces"
# short name -> (uplink file, downlink file) in LIBRARY; one file for both where the set has one
CATALOG: dict[str, tuple[str, str]] = {
    "att-lte-driving": ("mahimahi/ATT-LTE-driving.up.gz", "mahimahi/ATT-LTE-driving.down.gz"),
    "tmobile-lte-short": ("mahimahi/TMobile-LTE-short.up.gz", "mahimahi/TMobile-LTE-short.down.gz"),
    "verizon-lte-short": ("mahimahi/Verizon-LTE-short.up.gz", "mahimahi/Verizon-LTE-short.down.gz"),
    **{f"norway-{k}": (f"norway-hsdpa/norway_{k}_{n}.mbps",) * 2  # type: ignore[misc]
       for k, n in (("bus", 1), ("car", 2), ("train", 1), ("ferry", 2), ("metro", 2), ("tram", 10))},
    "fcc-broadband": ("fcc/trace_10022_yahoo.mbps", "fcc/trace_10022_yahoo.mbps"),
}
_LIBRARY_REF = re.compile(r"[A-Za-z0-9_-]{1,40}/[A-Za-z0-9_.-]{1,80}")

Row = tuple[float, float, Optional[float]]


# --------------------------------------------------------------------------------------------
# where a trace is


def is_library_ref(ref: str) -> bool:
    """A catalog name or a path inside the shipped library (`mahimahi/ATT-LTE-driving.up`)."""
    return ref in CATALOG or (_LIBRARY_REF.fullmatch(ref) is not None and _library_file(ref) is not None)


def _library_file(ref: str) -> Optional[Path]:
    if ".." in ref or _LIBRARY_REF.fullmatch(ref) is None:
        return None
    for cand in (LIBRARY / ref, LIBRARY / f"{ref}.gz"):
        if cand.is_file():
            return cand
    return None


def trace_file(ref: str, which: str) -> Path:
    """The file a direction's `trace:` names: a catalog name (its `.up` for "up", `.down` for
    "down"), a library path, or a user's file (an absolute path: loading made it one)."""
    if ref in CATALOG:
        return LIBRARY / CATALOG[ref][0 if which == "up" else 1]
    lib = _library_file(ref)
    if lib is not None:
        return lib
    close = difflib.get_close_matches(Path(ref).name.lower(), list(CATALOG), n=3, cutoff=0.6)
    if Path(ref).is_absolute() and (Path(ref).exists() or not close):
        return Path(ref)  # a user's file (loading resolved it from the scenario's folder)
    shown = Path(ref).name if re.fullmatch(r"[\w./-]{1,300}", ref) else "(that name)"
    raise ValueError(f"unknown trace '{shown}'" + (f" (closest: {', '.join(close)})" if close else
                                                    f" (catalog: {', '.join(CATALOG)}; or a file beside the scenario)"))


# --------------------------------------------------------------------------------------------
# reading


def read_trace_text(p: Path) -> str:
    """The file's text; a `.gz` file decompressed, capped as the plain text is, before and after."""
    if p.suffix != ".gz":
        return read_capped_text(p)
    try:
        raw = gunzip_capped(capped_bytes(p, MAX_TRACE_BYTES), MAX_TRACE_BYTES)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text once decompressed (byte {e.start})") from None


def trace_kind(p: Path) -> str:
    suffix = Path(p.stem).suffix if p.suffix == ".gz" else p.suffix
    return "mahimahi" if suffix in MAHIMAHI_SUFFIXES else "mbps" if suffix == MBPS_SUFFIX else "csv"


def read_link_trace(path: str | Path) -> list[Row]:
    """(time s, rate bit/s, latency s or None) rows of a link trace, time ascending (Mahimahi:
    per second). Errors name the line and never quote it."""
    p = Path(path)
    text = read_trace_text(p)
    kind = trace_kind(p)
    if kind == "mahimahi":
        return _binned(_mahimahi_ms(p, text), 1.0)
    rows = _read_mbps(p, text) if kind == "mbps" else _read_csv(p, text)
    if not rows:
        raise ValueError(f"{p}: no rows")
    rows.sort(key=lambda r: r[0])
    return rows


def _check_row(p: Path, i: int, t: float, rate: float) -> None:
    if not 0 <= t <= MAX_TRACE_SECONDS:
        raise ValueError(f"{p}: line {i + 1}: the time is not within 0 and {MAX_TRACE_SECONDS} s")
    if rate < 0:
        raise ValueError(f"{p}: line {i + 1}: a negative rate")
    if rate > MAX_RATE_BPS:
        raise ValueError(f"{p}: line {i + 1}: a rate above {units.format_rate(MAX_RATE_BPS)} (a wrong unit?)")


def _read_csv(p: Path, text: str) -> list[Row]:
    rows: list[Row] = []
    for i, rec in enumerate(csv.reader(text.splitlines())):
        if not rec or rec[0].strip().startswith("#"):
            continue
        if i == 0 and not is_number(rec[0]):
            continue  # header
        try:
            t = float(rec[0])
            rate_text = rec[1].strip()
            if rate_text.startswith("-"):
                raise ValueError(f"{p}: line {i + 1}: a negative rate")
            rate = units.parse_rate(rate_text)
            lat = units.parse_duration(rec[2].strip()) if len(rec) > 2 and rec[2].strip() else None
        except (ValueError, IndexError) as e:
            if "negative" in str(e):
                raise
            raise ValueError(f"{p}: line {i + 1} is not `time,bandwidth[,latency]` (seconds, a rate such as "
                             "12mbit, a duration such as 20ms)") from None
        _check_row(p, i, t, rate)
        rows.append((t, rate, lat))
    return rows


def _read_mbps(p: Path, text: str) -> list[Row]:
    """Pensieve's cooked traces: `seconds Mbit/s` per line (whitespace between)."""
    rows: list[Row] = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            t, mbps = float(parts[0]), float(parts[1])
        except ValueError:
            raise ValueError(f"{p}: line {i + 1} is not `seconds Mbit/s`") from None
        _check_row(p, i, t, mbps * 1e6)
        rows.append((t, mbps * 1e6, None))
    return rows


def is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _mahimahi_ms(p: Path, text: str) -> list[int]:
    """Mahimahi: each line is a millisecond at which one MTU-sized packet may be delivered."""
    out = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            ms = int(line)
        except ValueError:
            raise ValueError(f"{p}: line {i + 1} is not a delivery time in whole milliseconds") from None
        if not 0 <= ms <= MAX_TRACE_SECONDS * 1000:
            raise ValueError(f"{p}: line {i + 1}: the time is not within 0 and {MAX_TRACE_SECONDS} s")
        out.append(ms)
    if not out:
        raise ValueError(f"{p}: no rows")
    return out


def trickle(width: float) -> float:
    """The least rate a trace sets, for ticks of `width` seconds: one full frame per tick (Mahimahi's
    rate for a bin with one delivery opportunity). HTB cannot be set to 0, and it charges a frame's
    whole time on the wire against its class at the rate in force when the frame leaves: under this
    rate a frame outlasts its tick, and after an outage the link stayed shut for that frame's time
    (1.5 s at the 8 kbit/s trickle used before: `edgebed bench trace`, AT&T LTE driving)."""
    return MTU_BITS / width


def _binned_rates(ms: list[int], width: float, bins: int) -> list[float]:
    """Delivery opportunities counted per `width` seconds in `bins` bins (deliveries at the trace's
    very end in its last), as rates (an empty bin: the trickle); a float object per distinct count,
    not per bin."""
    counts = [0] * bins
    w_ms = width * 1000
    for m in ms:
        counts[min(int(m // w_ms), bins - 1)] += 1
    rate = {c: max(trickle(width), c * MTU_BITS / width) for c in set(counts)}
    return [rate[c] for c in counts]


def _binned(ms: list[int], width: float) -> list[Row]:
    """(start, rate, None) rows of `width` seconds, as `_binned_rates` counts them."""
    rates = _binned_rates(ms, width, max(ms) // round(width * 1000) + 1)
    return [(k * width, r, None) for k, r in enumerate(rates)]


# --------------------------------------------------------------------------------------------
# sampling at a resolution, and the replay schedule


def read_trace_rates(path: str | Path, resolution: float = DEFAULT_RESOLUTION_S) -> tuple[float, ...]:
    """`trace_rates`, read once per file and resolution (validation, planning and replay ask alike)."""
    return _cached_rates(str(path), float(resolution))


@lru_cache(maxsize=64)
def _cached_rates(path: str, resolution: float) -> tuple[float, ...]:
    return tuple(trace_rates(path, resolution))


def trace_rates(path: str | Path, resolution: float = DEFAULT_RESOLUTION_S) -> list[float]:
    """A trace's rate (bit/s) at each tick of `resolution` seconds: Mahimahi's deliveries counted
    per tick, a CSV's or cooked trace's steps sampled at each tick's start (each row holds until
    the next; the last for the rows' mean spacing). ValueError when the trace lasts less than
    one tick."""
    p = Path(path)
    text = read_trace_text(p)
    if trace_kind(p) == "mahimahi":
        ms = _mahimahi_ms(p, text)
        duration = max(ms) / 1000  # Mahimahi repeats a trace with its last timestamp as the period
        check_ticks(p, duration, resolution)
        return _binned_rates(ms, resolution, max(1, math.ceil(duration / resolution - 1e-9)))
    rows = read_link_trace(p)
    duration = steps_duration([t for t, _, _ in rows], resolution)
    check_ticks(p, duration, resolution)
    return [max(trickle(resolution), r) for r in sample_steps([(t, r) for t, r, _ in rows], resolution, duration)]


def check_ticks(p: Path, duration: float, resolution: float) -> None:
    """ValueError unless a trace of `duration` s fills at least one tick, and at most MAX_TICKS."""
    if duration + 1e-9 < resolution:
        raise ValueError(f"{p}: the trace lasts {duration:g} s, shorter than its resolution {resolution:g} s")
    if duration / resolution > MAX_TICKS:
        raise ValueError(f"{p}: the trace lasts {duration:g} s, more than {MAX_TICKS} ticks of {resolution:g} s "
                         "(a coarser trace_resolution)")


def steps_duration(times: list[float], resolution: float) -> float:
    """How long steps at `times` last: their span plus the mean spacing (a single row: one tick)."""
    span = times[-1] - times[0]
    return span + (span / (len(times) - 1) if len(times) > 1 else resolution)


def sample_steps(rows: list[tuple[float, float]], resolution: float, duration: float) -> list[float]:
    """(time, value) steps, time ascending, sampled at the start of each tick of `resolution`: each
    row's value holds until the next row's time."""
    out, j = [], 0
    for k in range(max(1, int(duration / resolution + 1e-9))):
        t = rows[0][0] + k * resolution
        while j + 1 < len(rows) and rows[j + 1][0] <= t + 1e-9:
            j += 1
        out.append(rows[j][1])
    return out


@dataclass(frozen=True)
class TraceSchedule:
    """One direction's replay: `rates[k]` holds from k * resolution seconds of the trace; the
    node starts `offset` seconds into it; at the end it loops or holds its last rate. A delay
    schedule (scenario/latency_traces.py) is the same with one-way delays in seconds as `rates`."""

    rates: tuple[float, ...]
    resolution: float
    loop: bool = True
    offset: float = 0.0

    @property
    def duration(self) -> float:
        return len(self.rates) * self.resolution

    def index_at(self, t: float) -> Optional[int]:
        """The tick whose rate holds `t` seconds after the node's start (None: past the end of a
        trace that stops; it then holds its last rate)."""
        k = int((t + self.offset) / self.resolution + 1e-9)
        if self.loop:
            return k % len(self.rates)
        return k if k < len(self.rates) else None

    def rate_at(self, t: float) -> float:
        k = self.index_at(t)
        return self.rates[-1] if k is None else self.rates[k]

    def trace_time(self, t: float) -> float:
        """Where in the trace the node is `t` seconds after its start."""
        return (t + self.offset) % self.duration if self.loop else t + self.offset

    def dilated(self, k: float, value_scale: float) -> "TraceSchedule":
        """The replay on the wall of a run dilated by k (scenario.dilation): every tick k times as
        long, each value times `value_scale` (a rate's 1/k, a delay's k)."""
        if k == 1:
            return self
        return TraceSchedule(tuple(v * value_scale for v in self.rates), self.resolution * k, self.loop,
                             self.offset * k)


def node_offset(offset: Union[float, str, None], duration: float, seed: int, node: str,
                resolution: float) -> float:
    """A node's start into its trace: seconds as given (within the trace), or `random`: drawn per
    node from the scenario's seed (the same run, the same offsets), on the tick grid."""
    if offset is None:
        return 0.0
    if offset == "random":
        ticks = max(1, int(duration / resolution))
        return random.Random(f"{seed}:{node}:trace").randrange(ticks) * resolution
    return float(offset) % duration if duration > 0 else 0.0


def direction_schedule(d: Any, which: str, seed: int, node: str, dilation: float = 1.0) -> Optional[TraceSchedule]:
    """The replay of a direction (a scenario `Direction`) that names a trace, for one node, on the
    wall of a run dilated by `dilation`; None when it names none."""
    if getattr(d, "trace", None) is None:
        return None
    resolution = d.trace_resolution if d.trace_resolution is not None else DEFAULT_RESOLUTION_S
    rates = read_trace_rates(trace_file(d.trace, which), resolution)
    offset = node_offset(d.trace_offset, len(rates) * resolution, seed, node, resolution)
    return TraceSchedule(rates, resolution, d.trace_loop is not False, offset).dilated(dilation, 1.0 / dilation)


def with_trace_start(d: Any, which: str, seed: int, node: str, dilation: float = 1.0) -> Any:
    """A traced direction with its rate at the node's start in the trace (so the link comes up
    shaped, with the HTB class the replay changes in place); any other direction as it is."""
    sched = direction_schedule(d, which, seed, node, dilation)
    return d if sched is None else d.model_copy(update={"rate": sched.rate_at(0.0)})
