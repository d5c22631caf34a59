"""Parsing of the human-written quantities in scenario files: rates, sizes, durations, fractions.

Rates are in *bits* per second, the way papers write them ("100 Mbps WAN", "10mbit").
Note that this differs from tc(8), where "mbps" means megabytes per second: edgebed
accepts `kbit/mbit/gbit` (tc's spelling) and `kbps/mbps/gbps` (papers' spelling), all bits.
Bytes per second must be written explicitly as `MB/s`, `KB/s` ...
"""

from __future__ import annotations

import math
import re

from testbed.errors import BadInput

_NUM = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"

_RATE_UNITS = {
    "": 1, "bit": 1, "bps": 1, "b/s": 1,  # "" : YAML reads 1e7 as the string "1e7"
    "kbit": 1e3, "kbps": 1e3, "kb/s": 1e3,
    "mbit": 1e6, "mbps": 1e6, "mb/s": 1e6,
    "gbit": 1e9, "gbps": 1e9, "gb/s": 1e9,
}
# Explicit byte rates: uppercase B followed by /s (checked case-sensitively below).
_BYTE_RATE_UNITS = {"B/s": 8, "KB/s": 8e3, "MB/s": 8e6, "GB/s": 8e9}

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
}

_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


class UnitError(BadInput):
    """A quantity that cannot be parsed; the message says what was expected."""


def _split(text: str) -> tuple[float, str]:
    m = re.fullmatch(_NUM + r"\s*(?P<unit>[A-Za-z/%]*)", text.strip())
    if not m or not math.isfinite(float(m.group("num"))):  # '1e400' overflows to inf
        raise UnitError
    return float(m.group("num")), m.group("unit")


def parse_rate(value: object) -> float:
    """Return bits per second. Numbers without unit are bits per second."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a rate")
    if isinstance(value, (int, float)):
        if not value > 0 or not math.isfinite(value):  # also YAML's .nan / .inf
            raise UnitError(f"{value!r} is not a rate (must be a finite number > 0)")
        return float(value)
    if not isinstance(value, str):
        raise UnitError(f"{value!r} is not a rate")
    try:
        num, unit = _split(value)
    except UnitError:
        raise UnitError(f"'{value}' is not a rate (e.g. '10mbit', '1gbit', '500kbit')") from None
    if unit in _BYTE_RATE_UNITS:
        bps = num * _BYTE_RATE_UNITS[unit]
    elif unit.lower() in _RATE_UNITS:
        bps = num * _RATE_UNITS[unit.lower()]
    else:
        raise UnitError(f"'{value}' is not a rate (unknown unit '{unit}'; use bit, kbit, mbit, gbit)")
    if bps <= 0:
        raise UnitError(f"'{value}' is not a rate (must be > 0)")
    return bps


def parse_size(value: object) -> int:
    """Return bytes. '512m' and '512MiB' are binary, '512MB' decimal (as docker and k8s do)."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a size")
    if isinstance(value, (int, float)):
        if not value > 0 or not math.isfinite(value):  # int(inf) would raise OverflowError
            raise UnitError(f"{value!r} is not a size (must be a finite number > 0)")
        return int(value)
    if not isinstance(value, str):
        raise UnitError(f"{value!r} is not a size")
    try:
        num, unit = _split(value)
    except UnitError:
        raise UnitError(f"'{value}' is not a size (e.g. '512m', '2GiB')") from None
    if unit.lower() not in _SIZE_UNITS:
        raise UnitError(f"'{value}' is not a size (unknown unit '{unit}')")
    size = int(num * _SIZE_UNITS[unit.lower()])
    if size <= 0:
        raise UnitError(f"'{value}' is not a size (must be > 0)")
    return size


def parse_duration(value: object, *, allow_zero: bool = True) -> float:
    """Return seconds. Numbers without unit are seconds."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        secs = float(value)
        if not math.isfinite(secs):
            raise UnitError(f"{value!r} is not a duration (must be finite)")
    elif isinstance(value, str):
        try:
            num, unit = _split(value)
        except UnitError:
            raise UnitError(f"'{value}' is not a duration (e.g. '20ms', '1.5s')") from None
        if unit.lower() not in _TIME_UNITS and unit != "":
            raise UnitError(f"'{value}' is not a duration (unknown unit '{unit}'; use us, ms, s)")
        secs = num * _TIME_UNITS.get(unit.lower(), 1.0)
    else:
        raise UnitError(f"{value!r} is not a duration")
    if secs < 0 or (secs == 0 and not allow_zero):
        raise UnitError(f"'{value}' is not a duration (must be {'>=' if allow_zero else '>'} 0)")
    return secs


def parse_fraction(value: object) -> float:
    """Return a probability in [0, 1]; accepts 0.01 or '1%'."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not a fraction")
    if isinstance(value, str):
        text = value.strip()
        try:
            frac = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
        except ValueError:
            raise UnitError(f"'{value}' is not a fraction (e.g. '1%' or 0.01)") from None
    elif isinstance(value, (int, float)):
        frac = float(value)
    else:
        raise UnitError(f"{value!r} is not a fraction")
    if not 0.0 <= frac <= 1.0:
        raise UnitError(f"'{value}' is not a fraction (must be between 0 and 1, or 0% and 100%)")
    return frac


def parse_cpuset(cpuset: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5} (a huge range: its two ends only, enough to name a missing CPU)."""
    out: set[int] = set()
    for part in cpuset.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1)) if int(b or a) - int(a) < 4096 else {int(a), int(b)}
    return out


def format_rate(bps: float) -> str:
    """The tc-style spelling of a rate, for messages and meta.json."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def stress_loads(load: float) -> list[float]:
    """`load` cores of background stress as per-process loads (one process busies one core)."""
    if load <= 0:
        return []
    n = max(1, int(-(-load // 1)))
    return [load / n] * n
