"""Tests for testbed.scenario.units: rates (bits), sizes, durations, fractions."""

from __future__ import annotations

import math

import pytest

from testbed.scenario.units import UnitError, format_rate, parse_duration, parse_fraction, parse_rate, parse_size

# --------------------------------------------------------------------------- rates


@pytest.mark.parametrize(
    "text, bps",
    [
        ("10mbit", 1e7),
        ("1gbit", 1e9),
        ("500kbit", 5e5),
        ("100bit", 100.0),
        ("2.5mbit", 2.5e6),
        ("10 mbit", 1e7),
        ("  10mbit  ", 1e7),
        ("10MBIT", 1e7),
        # papers' spelling: bits, not tc's bytes
        ("100Mbps", 1e8),
        ("100mbps", 1e8),
        ("1Gbps", 1e9),
        ("64kbps", 6.4e4),
        ("1Mb/s", 1e6),
        ("1mb/s", 1e6),
        # bytes per second only when written as uppercase B/s
        ("1MB/s", 8e6),
        ("1KB/s", 8e3),
        ("2GB/s", 1.6e10),
        ("100B/s", 800.0),
        # plain numbers are bits per second
        ("1e6", 1e6),
        ("1.5e3kbit", 1.5e6),
        ("12345", 12345.0),
    ],
)
def test_parse_rate_strings(text, bps):
    assert parse_rate(text) == pytest.approx(bps, rel=1e-12)
    assert isinstance(parse_rate(text), float)


@pytest.mark.parametrize("value, bps", [(1000, 1000.0), (2.5e6, 2.5e6), (1, 1.0)])
def test_parse_rate_numbers(value, bps):
    out = parse_rate(value)
    assert out == bps and isinstance(out, float)


@pytest.mark.parametrize(
    "value",
    ["-5mbit", "0mbit", "0", "fast", "10 furlongs", "", "mbit", "10mbit/s/s", "1e400mbit",
     True, False, None, 0, -1, -2.5, float("nan"), float("inf"), [10], {"rate": 1}],
)
def test_parse_rate_rejects(value):
    with pytest.raises(UnitError) as ei:
        parse_rate(value)
    assert "is not a rate" in str(ei.value)


def test_parse_rate_error_names_the_input_and_unit():
    with pytest.raises(UnitError, match=r"'10 furlongs' is not a rate \(unknown unit 'furlongs'"):
        parse_rate("10 furlongs")
    with pytest.raises(UnitError, match=r"^'-5mbit' is not a rate"):
        parse_rate("-5mbit")
    with pytest.raises(UnitError, match=r"'0mbit' is not a rate \(must be > 0\)"):
        parse_rate("0mbit")


def test_unit_error_is_value_error():
    # pydantic turns ValueError from validators into field errors
    assert issubclass(UnitError, ValueError)


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "value, size",
    [
        ("512m", 512 * 1024**2),
        ("512M", 512 * 1024**2),
        ("512MiB", 512 * 1024**2),
        ("512MB", 512 * 1000**2),
        ("2GiB", 2 * 1024**3),
        ("2g", 2 * 1024**3),
        ("2GB", 2 * 10**9),
        ("64k", 64 * 1024),
        ("64kb", 64_000),
        ("1.5k", 1536),
        ("100", 100),
        ("100b", 100),
        (4096, 4096),
    ],
)
def test_parse_size(value, size):
    out = parse_size(value)
    assert out == size and isinstance(out, int)


@pytest.mark.parametrize(
    "value", ["-1m", "0", "0m", "lots", "5 parsecs", "1e400", True, None, 0, -10, float("inf"), float("nan")]
)
def test_parse_size_rejects(value):
    with pytest.raises(UnitError, match="is not a size"):
        parse_size(value)


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    "value, secs",
    [
        ("20ms", 0.02),
        ("1.5s", 1.5),
        ("50us", 50e-6),
        ("2sec", 2.0),
        ("2min", 120.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("20MS", 0.02),
        ("3", 3.0),
        (0, 0.0),
        (0.25, 0.25),
        (7, 7.0),
        ("0ms", 0.0),
    ],
)
def test_parse_duration(value, secs):
    out = parse_duration(value)
    assert out == pytest.approx(secs, rel=1e-12)
    assert isinstance(out, float)


@pytest.mark.parametrize(
    "value", ["-5ms", -1, -0.001, "soon", "5 fortnights", "ms", True, None, [1], float("nan"), float("inf")]
)
def test_parse_duration_rejects(value):
    with pytest.raises(UnitError, match="is not a duration"):
        parse_duration(value)


def test_parse_duration_negative_message():
    with pytest.raises(UnitError, match=r"must be >= 0"):
        parse_duration(-1)


def test_parse_duration_allow_zero():
    assert parse_duration(0, allow_zero=True) == 0.0
    with pytest.raises(UnitError, match=r"must be > 0"):
        parse_duration(0, allow_zero=False)
    with pytest.raises(UnitError, match=r"must be > 0"):
        parse_duration("0s", allow_zero=False)
    assert parse_duration("1ms", allow_zero=False) == pytest.approx(0.001)


# --------------------------------------------------------------------------- fractions


@pytest.mark.parametrize(
    "value, frac",
    [("1%", 0.01), ("0.5%", 0.005), ("100%", 1.0), ("0%", 0.0), (" 25% ", 0.25), ("0.3", 0.3),
     (0.5, 0.5), (0, 0.0), (1, 1.0)],
)
def test_parse_fraction(value, frac):
    assert parse_fraction(value) == pytest.approx(frac, rel=1e-12)


@pytest.mark.parametrize(
    "value", ["150%", "-1%", 1.5, -0.1, 2, "half", "%", True, None, float("nan"), "nan"]
)
def test_parse_fraction_rejects(value):
    with pytest.raises(UnitError, match="is not a fraction"):
        parse_fraction(value)


# --------------------------------------------------------------------------- formatting


@pytest.mark.parametrize(
    "bps, text",
    [(1e7, "10mbit"), (1e9, "1gbit"), (1.5e9, "1.5gbit"), (5e5, "500kbit"), (2.5e6, "2.5mbit"),
     (999, "999bit"), (1000, "1kbit"), (1, "1bit")],
)
def test_format_rate(bps, text):
    assert format_rate(bps) == text


@pytest.mark.parametrize("text", ["10mbit", "1gbit", "500kbit", "2.5mbit", "100bit"])
def test_format_rate_round_trips(text):
    assert format_rate(parse_rate(text)) == text
    assert math.isclose(parse_rate(format_rate(parse_rate(text))), parse_rate(text))
