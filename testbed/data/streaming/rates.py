"""Streaming rates of edge devices (samples per second), after ScaDLES (Tyagi & Sharma).

ScaDLES Table I samples one rate per device from one of four named sets:

    set   distribution  mean  std     support / note
    S1    uniform        38    24     [38 - 24*sqrt(3), 38 + 24*sqrt(3)] = [-3.57, 79.57]
    S2    uniform       300   112     [106.0, 494.0]
    S1'   normal         64    24
    S2'   normal        256    28

A uniform law with mean m and standard deviation s spans [m - sqrt(3) s, m + sqrt(3) s].
S1's support reaches below zero, and a normal law has unbounded support, so rates drawn from
the paper's sets are clipped to the paper's range, `PAPER_RANGE` = [8, 1024] samples/s (Sec. V:
"stream-rate for any device remains within this range regardless of the streaming
distribution"; the same bounds as the batch, b_min and b_max). With S1 about 13.9% of draws
are clipped to 8; the mean moves from 38 to about 38.9. S1' reaches below 8 in 1% of draws
(2.3 std below its mean); S2 and S2' never come near either bound. A user's own law is
clipped only to a floor (`DEFAULT_FLOOR` = 1 sample/s): a device must stream *something*, and
a rate of 0 would make its producer sleep forever and its batch size undefined.

A rate can also vary in time (the paper notes intra-device heterogeneity: traffic, time of day):
`{trace: PATH}` reads a piecewise-constant trace, CSV with header `time,rate`.

`RateSchedule` turns a (possibly time-varying) rate into send times. Convention: the k-th
sample (k = 1, 2, ...) is sent at the time t where the expected count N(t) = integral of the
rate from 0 to t reaches k. So a constant rate r sends at 1/r, 2/r, ... ("sleep 1/rate, send"),
and N(t) samples have been sent by time t (interval (0, t]). Send times are absolute times
from the schedule's origin: a producer sleeps until origin + send_time(k), which never drifts.
"""

from __future__ import annotations

import bisect
import csv
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Union

import numpy as np

from testbed.data.textfile import read_capped_text

DEFAULT_FLOOR = 1.0
"""Samples per second below which drawn device rates are clipped (see module docstring)."""
PAPER_RANGE = (8.0, 1024.0)
"""Where a rate drawn from one of the paper's sets is clipped to (see module docstring)."""

_SQRT3 = math.sqrt(3.0)


def _finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x)


# --------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class ConstantRate:
    """Every device streams at the same fixed rate."""

    rate: float

    kind: ClassVar[str] = "constant"


@dataclass(frozen=True)
class UniformRate:
    """Per-device rates drawn from U(low, high). `name` is set for the paper's sets."""

    low: float
    high: float
    name: str | None = None

    kind: ClassVar[str] = "uniform"

    @classmethod
    def from_mean_std(cls, mean: float, std: float, name: str | None = None) -> UniformRate:
        half = _SQRT3 * std
        return cls(low=mean - half, high=mean + half, name=name)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2.0

    @property
    def std(self) -> float:
        return (self.high - self.low) / (2.0 * _SQRT3)


@dataclass(frozen=True)
class NormalRate:
    """Per-device rates drawn from N(mean, std^2). `name` is set for the paper's sets."""

    mean: float
    std: float
    name: str | None = None

    kind: ClassVar[str] = "normal"


@dataclass(frozen=True)
class TraceRate:
    """A piecewise-constant rate over time, the same for every device.

    `times[j]` (seconds, ascending, `times[0] == 0`) is when `rates[j]` starts; the last rate
    holds forever.
    """

    path: str
    times: tuple[float, ...]
    rates: tuple[float, ...]

    kind: ClassVar[str] = "trace"


RateSpec = Union[ConstantRate, UniformRate, NormalRate, TraceRate]

RATE_SETS: dict[str, UniformRate | NormalRate] = {
    "S1": UniformRate.from_mean_std(38.0, 24.0, name="S1"),
    "S2": UniformRate.from_mean_std(300.0, 112.0, name="S2"),
    "S1'": NormalRate(64.0, 24.0, name="S1'"),
    "S2'": NormalRate(256.0, 28.0, name="S2'"),
}
"""ScaDLES Table I (samples/s per device): uniform S1 (38, 24), S2 (300, 112); normal S1' (64, 24),
S2' (256, 28) as (mean, std)."""

_PRIMES = ("'", "\u2032", "\u2019")  # ASCII apostrophe, prime, right single quote


# --------------------------------------------------------------------------- parsing


def _number(value: object, what: str) -> float:
    """A finite real number (bools refused), or ValueError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return x


def _set_name(text: str) -> str | None:
    s = text.strip()
    for p in _PRIMES[1:]:
        s = s.replace(p, "'")
    if len(s) >= 2 and s[0] in "sS":
        key = "S" + s[1:]
        if key in RATE_SETS:
            return key
    return None


def _fields(value: object, kind: str, required: tuple[str, ...]) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{kind} must be a mapping with keys {', '.join(required)}, got {value!r}")
    keys = set(map(str, value.keys()))
    if keys != set(required):
        raise ValueError(
            f"{kind} must have exactly the keys {', '.join(required)}, got {', '.join(sorted(keys)) or 'none'}"
        )
    return {k: _number(value[k], f"{kind}.{k}") for k in required}


def read_rate_trace(path: str | Path) -> TraceRate:
    """Read and validate a rate trace: CSV, header `time,rate`, one row per change.

    Times are seconds from the start of the run, the first is 0, strictly ascending; rates are
    samples/s, > 0. Blank lines and lines starting with `#` are skipped. Errors name the line.
    """
    p = Path(path)
    text = read_capped_text(p)
    times: list[float] = []
    rates: list[float] = []
    header_seen = False
    for lineno, row in enumerate(csv.reader(text.splitlines()), start=1):
        cells = [c.strip() for c in row]
        if not cells or all(c == "" for c in cells) or cells[0].startswith("#"):
            continue
        if not header_seen:
            if [c.lower() for c in cells] != ["time", "rate"]:
                raise ValueError(f"trace {p}:{lineno}: header must be 'time,rate'")
            header_seen = True
            continue
        if len(cells) != 2:
            raise ValueError(f"trace {p}:{lineno}: expected 2 columns 'time,rate', got {len(cells)}")
        try:
            t, r = float(cells[0]), float(cells[1])
        except ValueError:
            raise ValueError(f"trace {p}:{lineno}: time and rate must be numbers") from None
        if not (math.isfinite(t) and math.isfinite(r)):
            raise ValueError(f"trace {p}:{lineno}: time and rate must be finite")
        if not times and t != 0.0:
            raise ValueError(f"trace {p}:{lineno}: first time must be 0")
        if times and t <= times[-1]:
            raise ValueError(f"trace {p}:{lineno}: times must be strictly ascending, {t:g} follows {times[-1]:g}")
        if r <= 0:
            raise ValueError(f"trace {p}:{lineno}: rate must be > 0 samples/s")
        times.append(t)
        rates.append(r)
    if not header_seen:
        raise ValueError(f"trace {p}: empty, expected header 'time,rate' and at least one row")
    if not times:
        raise ValueError(f"trace {p}: no rows after the header 'time,rate'")
    return TraceRate(path=str(p), times=tuple(times), rates=tuple(rates))


def parse_rate_spec(value: object, base_dir: str | Path | None = None) -> RateSpec:
    """Parse a scenario's rate spec.

    Accepted forms (rates in samples per second):
      * a positive number (or a numeric string): `ConstantRate`
      * a set name: "S1", "S2", "S1'", "S2'" (case-insensitive S; a typographic prime is accepted)
      * `{uniform: {low, high}}` with 0 < low <= high
      * `{normal: {mean, std}}` with mean > 0, std >= 0
      * `{trace: PATH}`: CSV `time,rate`, validated now; a relative PATH is taken from
        `base_dir` (the scenario file's folder) when given, else from the working directory.

    Raises ValueError with a one-line message saying what is expected.
    """
    if isinstance(value, (ConstantRate, UniformRate, NormalRate, TraceRate)):
        return value
    if isinstance(value, str):
        name = _set_name(value)
        if name is not None:
            return RATE_SETS[name]
        try:
            x = float(value.strip())
        except ValueError:
            raise ValueError(
                f"rate must be a number > 0, one of {', '.join(RATE_SETS)}, or a mapping "
                f"{{uniform|normal|trace: ...}}; got {value!r}"
            ) from None
        value = x
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        x = _number(value, "rate")
        if x <= 0:
            raise ValueError(f"rate must be > 0 samples/s, got {value!r}")
        return ConstantRate(x)
    if isinstance(value, Mapping):
        if len(value) != 1:
            raise ValueError(
                f"rate mapping must have exactly one key (uniform, normal or trace), "
                f"got {', '.join(map(str, value)) or 'none'}"
            )
        ((kind, body),) = value.items()
        if kind == "uniform":
            f = _fields(body, "uniform", ("low", "high"))
            if f["low"] <= 0:
                raise ValueError(f"uniform.low must be > 0, got {f['low']:g}")
            if f["high"] < f["low"]:
                raise ValueError(f"uniform.high must be >= uniform.low, got low={f['low']:g} high={f['high']:g}")
            return UniformRate(f["low"], f["high"])
        if kind == "normal":
            f = _fields(body, "normal", ("mean", "std"))
            if f["mean"] <= 0:
                raise ValueError(f"normal.mean must be > 0, got {f['mean']:g}")
            if f["std"] < 0:
                raise ValueError(f"normal.std must be >= 0, got {f['std']:g}")
            return NormalRate(f["mean"], f["std"])
        if kind == "trace":
            if not isinstance(body, (str, Path)) or not str(body).strip():
                raise ValueError(f"trace must be a path to a CSV file with header 'time,rate', got {body!r}")
            p = Path(str(body).strip())
            if not p.is_absolute() and base_dir is not None:
                p = Path(base_dir) / p
            return read_rate_trace(p)
        raise ValueError(f"rate mapping key must be uniform, normal or trace, got {kind!r}")
    raise ValueError(
        f"rate must be a number > 0, one of {', '.join(RATE_SETS)}, or a mapping "
        f"{{uniform|normal|trace: ...}}; got {value!r}"
    )


# --------------------------------------------------------------------------- per-device rates


def sample_device_rates(
    spec: RateSpec | object, n_devices: int, seed: int, floor: float | None = DEFAULT_FLOOR
) -> list[float]:
    """One nominal rate per device (samples/s), deterministic for `seed`.

    Device i's rate does not depend on `n_devices` (draws are taken in device order from one
    generator), so adding devices keeps the first ones' rates. Draws below `floor` are clipped
    to it, and draws from the paper's sets to `PAPER_RANGE` as well (`floor=None` keeps raw
    draws, which may be <= 0: for analysis only). A constant spec
    gives its rate to every device; a trace gives its initial rate (use `device_schedules` for
    the time-varying schedule).
    """
    spec = parse_rate_spec(spec)
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 0:
        raise ValueError(f"n_devices must be an integer >= 0, got {n_devices!r}")
    if floor is not None and not (math.isfinite(floor) and floor > 0):
        raise ValueError(f"floor must be > 0 samples/s or None, got {floor!r}")
    if isinstance(spec, ConstantRate):
        return [spec.rate] * n_devices
    if isinstance(spec, TraceRate):
        return [spec.rates[0]] * n_devices
    rng = np.random.default_rng(seed)
    if isinstance(spec, UniformRate):
        draws = rng.uniform(spec.low, spec.high, size=n_devices)
    else:
        draws = rng.normal(spec.mean, spec.std, size=n_devices)
    if floor is not None:
        low, high = (max(floor, PAPER_RANGE[0]), PAPER_RANGE[1]) if spec in RATE_SETS.values() else (floor, np.inf)
        draws = np.clip(draws, low, max(low, high))
    return [float(x) for x in draws]


# --------------------------------------------------------------------------- schedules


class RateSchedule:
    """A piecewise-constant rate r(t) for t >= 0 and the send times it implies.

    `times[0] == 0`, ascending; `rates[j] > 0` holds on [times[j], times[j+1]), the last forever.
    N(t) = integral_0^t r is the expected number of samples sent by t; sample k (1-based) is
    sent at N^-1(k). All times are relative to the schedule's origin (the producer's start).
    """

    __slots__ = ("times", "rates", "_counts")

    def __init__(self, times: Sequence[float], rates: Sequence[float]) -> None:
        ts = tuple(float(t) for t in times)
        rs = tuple(float(r) for r in rates)
        if not ts or len(ts) != len(rs):
            raise ValueError("a schedule needs as many times as rates, at least one")
        if ts[0] != 0.0:
            raise ValueError(f"a schedule starts at time 0, got {ts[0]:g}")
        if any(not math.isfinite(t) for t in ts) or any(b <= a for a, b in zip(ts, ts[1:])):
            raise ValueError("schedule times must be finite and strictly ascending")
        if any(not (math.isfinite(r) and r > 0) for r in rs):
            raise ValueError("schedule rates must be finite and > 0 samples/s")
        self.times = ts
        self.rates = rs
        counts = [0.0]
        for j in range(1, len(ts)):
            counts.append(counts[-1] + rs[j - 1] * (ts[j] - ts[j - 1]))
        self._counts = tuple(counts)  # N(times[j])

    @classmethod
    def constant(cls, rate: float) -> RateSchedule:
        return cls((0.0,), (rate,))

    @classmethod
    def from_trace(cls, trace: TraceRate) -> RateSchedule:
        return cls(trace.times, trace.rates)

    def __repr__(self) -> str:
        if len(self.rates) == 1:
            return f"RateSchedule.constant({self.rates[0]:g})"
        return f"RateSchedule({len(self.rates)} segments, {self.rates[0]:g}..{self.rates[-1]:g}/s)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RateSchedule) and (self.times, self.rates) == (other.times, other.rates)

    def __hash__(self) -> int:
        return hash((self.times, self.rates))

    @property
    def is_constant(self) -> bool:
        return len(self.rates) == 1

    def _segment(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.times, t) - 1)

    def rate_at(self, t: float) -> float:
        """Rate at time t (the first rate before 0, the last one after the trace ends)."""
        return self.rates[self._segment(t)]

    def expected_count(self, t: float) -> float:
        """N(t): samples sent in (0, t], as a real number (0 for t <= 0)."""
        if t <= 0:
            return 0.0
        j = self._segment(t)
        return self._counts[j] + self.rates[j] * (t - self.times[j])

    def count_by(self, t: float) -> int:
        """Whole samples sent in (0, t]: floor(N(t)), robust to rounding at exact send times."""
        n = self.expected_count(t)
        return int(math.floor(n + 1e-9 * max(1.0, n)))

    def send_time(self, k: int) -> float:
        """Time of the k-th sample (k >= 1): N^-1(k)."""
        if k < 1:
            raise ValueError(f"sample index k starts at 1, got {k}")
        j = max(0, bisect.bisect_left(self._counts, k) - 1)
        return self.times[j] + (k - self._counts[j]) / self.rates[j]

    def next_send_time(self, after: float) -> float:
        """First send time strictly after `after`."""
        return self.send_time(self.count_by(after) + 1)

    def send_times(self, start: float = 0.0, until: float | None = None) -> Iterator[float]:
        """Send times in (start, until] (unbounded when until is None), ascending.

        Each is computed from its index, not by adding intervals, so there is no drift.
        """
        k = self.count_by(start) + 1
        while True:
            t = self.send_time(k)
            if until is not None and t > until + 1e-12 * max(1.0, abs(until)):
                return
            yield t
            k += 1


def schedule_for(spec: RateSpec | object, rate: float | None = None) -> RateSchedule:
    """The schedule of one device: a trace's own schedule, else constant at `rate` (the device's
    sampled rate; for a ConstantRate spec it may be omitted)."""
    spec = parse_rate_spec(spec)
    if isinstance(spec, TraceRate):
        return RateSchedule.from_trace(spec)
    if rate is None:
        if isinstance(spec, ConstantRate):
            return RateSchedule.constant(spec.rate)
        raise ValueError(f"a {spec.kind} spec needs the device's sampled rate")
    return RateSchedule.constant(rate)


def device_schedules(
    spec: RateSpec | object, n_devices: int, seed: int, floor: float | None = DEFAULT_FLOOR
) -> list[RateSchedule]:
    """One schedule per device: constant at the device's sampled rate, or the trace."""
    spec = parse_rate_spec(spec)
    if isinstance(spec, TraceRate):
        return [RateSchedule.from_trace(spec)] * n_devices
    return [RateSchedule.constant(r) for r in sample_device_rates(spec, n_devices, seed, floor)]


def paced(
    schedule: RateSchedule,
    origin: float,
    *,
    until: float | None = None,
    skip_until: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[tuple[int, float]]:
    """For a producer: sleep until each send time, then yield (k, lateness_seconds).

    `origin` is the clock reading of the schedule's time 0 and `until` a schedule time at which
    to stop. Every wake-up targets origin + send_time(k), so sleep overshoot is never
    accumulated; a producer that fell behind sends at once (lateness > 0) until it catches up.
    `skip_until` (a schedule time) starts with the first send after it: a producer that
    starts late on a schedule whose time 0 is the run's start does not burst to catch up.
    """
    k = 1 if skip_until is None else schedule.count_by(skip_until) + 1
    while True:
        st = schedule.send_time(k)
        if until is not None and st > until:
            return
        target = origin + st
        delay = target - clock()
        if delay > 0:
            sleep(delay)
        yield k, max(0.0, clock() - target)
        k += 1
