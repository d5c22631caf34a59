"""Tests for testbed.data.streaming.rates: ScaDLES rate sets, spec parsing, traces, send schedules."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from testbed.data.streaming.rates import (
    DEFAULT_FLOOR,
    PAPER_RANGE,
    RATE_SETS,
    ConstantRate,
    NormalRate,
    RateSchedule,
    TraceRate,
    UniformRate,
    device_schedules,
    paced,
    parse_rate_spec,
    read_rate_trace,
    sample_device_rates,
    schedule_for,
)

N_DRAWS = 200_000

# --------------------------------------------------------------------------- named sets


def test_rate_sets_match_scadles_table_1():
    assert set(RATE_SETS) == {"S1", "S2", "S1'", "S2'"}
    s1, s2 = RATE_SETS["S1"], RATE_SETS["S2"]
    assert isinstance(s1, UniformRate) and isinstance(s2, UniformRate)
    assert (s1.mean, s1.std) == pytest.approx((38.0, 24.0))
    assert (s2.mean, s2.std) == pytest.approx((300.0, 112.0))
    # uniform with mean m and std s spans m -/+ sqrt(3) s
    assert (s1.low, s1.high) == pytest.approx((38 - 24 * math.sqrt(3), 38 + 24 * math.sqrt(3)))
    assert s1.low < 0  # the reason for the floor
    assert (s2.low, s2.high) == pytest.approx((106.0103, 493.9897), abs=1e-3)
    assert RATE_SETS["S1'"] == NormalRate(64.0, 24.0, name="S1'")
    assert RATE_SETS["S2'"] == NormalRate(256.0, 28.0, name="S2'")


def _clipped_uniform_moments(a: float, b: float, f: float) -> tuple[float, float]:
    """Mean and std of max(X, f) for X ~ U(a, b), a < f < b."""
    w = b - a
    m1 = (f * (f - a) + (b * b - f * f) / 2) / w
    m2 = (f * f * (f - a) + (b**3 - f**3) / 3) / w
    return m1, math.sqrt(m2 - m1 * m1)


@pytest.mark.parametrize("name", ["S1", "S2", "S1'", "S2'"])
def test_raw_draws_have_table_1_moments(name):
    mean, std = {"S1": (38, 24), "S2": (300, 112), "S1'": (64, 24), "S2'": (256, 28)}[name]
    r = np.array(sample_device_rates(name, N_DRAWS, seed=1, floor=None))
    assert r.mean() == pytest.approx(mean, rel=0.01)
    assert r.std() == pytest.approx(std, rel=0.01)


def test_s1_draws_are_clipped_to_the_papers_floor():
    r = np.array(sample_device_rates("S1", N_DRAWS, seed=2))
    assert r.min() == PAPER_RANGE[0] == 8.0  # ScaDLES Sec. V: every device's rate is in [8, 1024]
    s1 = RATE_SETS["S1"]
    assert (r == 8.0).mean() == pytest.approx((8.0 - s1.low) / (s1.high - s1.low), abs=0.004)  # ~13.9%
    m, s = _clipped_uniform_moments(s1.low, s1.high, 8.0)
    assert m == pytest.approx(38.8, abs=0.1)
    assert r.mean() == pytest.approx(m, rel=0.01)
    assert r.std() == pytest.approx(s, rel=0.01)
    assert r.max() <= s1.high


@pytest.mark.parametrize("name", ["S2", "S2'"])
def test_high_sets_never_reach_the_bounds(name):
    r = sample_device_rates(name, 10_000, seed=3)
    assert 8.0 < min(r) and max(r) < 1024.0


def test_only_the_papers_sets_are_held_to_its_range():
    r = sample_device_rates("S1'", 10_000, seed=4)
    assert min(r) == 8.0 and max(r) < 1024.0  # S1' dips below 8 in ~1% of draws
    own = sample_device_rates({"normal": {"mean": 900, "std": 300}}, 10_000, seed=4)
    assert max(own) > 1024.0 and min(own) >= DEFAULT_FLOOR == 1.0


def test_sampling_is_deterministic_per_seed_and_prefix_stable():
    a = sample_device_rates("S1'", 16, seed=7)
    assert a == sample_device_rates("S1'", 16, seed=7)
    assert a != sample_device_rates("S1'", 16, seed=8)
    # device i's rate does not depend on how many devices there are
    assert sample_device_rates("S1'", 4, seed=7) == a[:4]
    assert sample_device_rates("S2", 32, seed=7)[:16] == sample_device_rates("S2", 16, seed=7)
    assert all(isinstance(x, float) for x in a)


def test_sampling_other_specs():
    assert sample_device_rates(100, 3, seed=0) == [100.0, 100.0, 100.0]
    assert sample_device_rates({"uniform": {"low": 5, "high": 6}}, 0, seed=0) == []
    r = sample_device_rates({"uniform": {"low": 5, "high": 6}}, 1000, seed=0)
    assert 5 <= min(r) and max(r) <= 6
    r = sample_device_rates({"normal": {"mean": 50, "std": 0}}, 3, seed=0)
    assert r == [50.0, 50.0, 50.0]
    with pytest.raises(ValueError, match="n_devices"):
        sample_device_rates("S1", -1, seed=0)
    with pytest.raises(ValueError, match="floor"):
        sample_device_rates("S1", 2, seed=0, floor=0)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, name",
    [("S1", "S1"), ("s1", "S1"), ("S2", "S2"), (" s2 ", "S2"), ("S1'", "S1'"), ("s1'", "S1'"),
     ("S2'", "S2'"), ("s2'", "S2'"), ("S1\u2032", "S1'"), ("S2\u2019", "S2'")],
)  # fmt: skip
def test_parse_set_names(text, name):
    assert parse_rate_spec(text) is RATE_SETS[name]


def test_parse_numbers_and_mappings():
    assert parse_rate_spec(100) == ConstantRate(100.0)
    assert parse_rate_spec(2.5) == ConstantRate(2.5)
    assert parse_rate_spec("1e2") == ConstantRate(100.0)
    assert parse_rate_spec(np.float32(8)) == ConstantRate(8.0)
    assert parse_rate_spec({"uniform": {"low": 10, "high": 60}}) == UniformRate(10.0, 60.0)
    assert parse_rate_spec({"normal": {"mean": 64, "std": 24}}) == NormalRate(64.0, 24.0)
    spec = parse_rate_spec({"uniform": {"low": 10, "high": 60}})
    assert spec.kind == "uniform" and spec.mean == 35.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.low = 3


@pytest.mark.parametrize(
    "value, message",
    [
        (0, "rate must be > 0"),
        (-3, "rate must be > 0"),
        ("0", "rate must be > 0"),
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (True, "rate must be a number"),
        (None, "rate must be a number"),
        ("fast", "rate must be a number"),
        ("S3", "rate must be a number"),
        ([10], "rate must be a number"),
        ({"uniform": {"low": 0, "high": 5}}, "uniform.low must be > 0"),
        ({"uniform": {"low": -1, "high": 5}}, "uniform.low must be > 0"),
        ({"uniform": {"low": 5, "high": 1}}, "uniform.high must be >= uniform.low"),
        ({"uniform": {"low": 5}}, "uniform must have exactly the keys low, high"),
        ({"uniform": {"low": 1, "high": 2, "mean": 3}}, "uniform must have exactly the keys"),
        ({"uniform": {"low": "a", "high": 2}}, "uniform.low must be a number"),
        ({"uniform": 5}, "uniform must be a mapping"),
        ({"normal": {"mean": 0, "std": 1}}, "normal.mean must be > 0"),
        ({"normal": {"mean": 10, "std": -1}}, "normal.std must be >= 0"),
        ({"normal": {"mean": 10}}, "normal must have exactly the keys mean, std"),
        ({"poisson": {"lam": 3}}, "must be uniform, normal or trace"),
        ({"uniform": {"low": 1, "high": 2}, "normal": {"mean": 1, "std": 1}}, "exactly one key"),
        ({}, "exactly one key"),
        ({"trace": 3}, "trace must be a path"),
        ({"trace": ""}, "trace must be a path"),
    ],
)
def test_parse_errors(value, message):
    with pytest.raises(ValueError) as ei:
        parse_rate_spec(value)
    assert message in str(ei.value)
    assert "\n" not in str(ei.value)


# --------------------------------------------------------------------------- traces


def _write(tmp_path, text, name="trace.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_trace_parse(tmp_path):
    p = _write(tmp_path, "time,rate\n0,10\n1,20\n\n# comment\n5, 2.5\n")
    spec = parse_rate_spec({"trace": str(p)})
    assert isinstance(spec, TraceRate)
    assert spec.times == (0.0, 1.0, 5.0) and spec.rates == (10.0, 20.0, 2.5)
    assert spec.path == str(p)
    # relative paths resolve against base_dir
    assert parse_rate_spec({"trace": "trace.csv"}, base_dir=tmp_path) == spec
    assert sample_device_rates(spec, 2, seed=0) == [10.0, 10.0]  # initial rate
    scheds = device_schedules(spec, 3, seed=0)
    assert len(scheds) == 3 and all(s == RateSchedule((0, 1, 5), (10, 20, 2.5)) for s in scheds)


@pytest.mark.parametrize(
    "text, message",
    [
        ("t,r\n0,10\n", ":1: header must be 'time,rate'"),
        ("time,rate\n1,10\n", ":2: first time must be 0"),
        ("time,rate\n0,10\n1,0\n", ":3: rate must be > 0"),
        ("time,rate\n0,10\n1,-4\n", ":3: rate must be > 0"),
        ("time,rate\n0,10\n2,5\n2,6\n", ":4: times must be strictly ascending"),
        ("time,rate\n0,10\n2,5\n1,6\n", ":4: times must be strictly ascending"),
        ("time,rate\n0,ten\n", ":2: time and rate must be numbers"),
        ("time,rate\n0,10,3\n", ":2: expected 2 columns"),
        ("time,rate\n0,nan\n", ":2: time and rate must be finite"),
        ("", "empty, expected header"),
        ("time,rate\n", "no rows after the header"),
    ],
)
def test_trace_errors_name_the_line(tmp_path, text, message):
    p = _write(tmp_path, text)
    with pytest.raises(ValueError) as ei:
        parse_rate_spec({"trace": str(p)})
    assert message in str(ei.value)
    assert str(p) in str(ei.value) and "\n" not in str(ei.value)


def test_trace_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        read_rate_trace(tmp_path / "nope.csv")


# --------------------------------------------------------------------------- schedules


def test_trace_schedule_values_and_send_times():
    s = RateSchedule((0.0, 1.0), (10.0, 20.0))  # 10/s for 1 s, then 20/s
    assert s.rate_at(0.0) == 10 and s.rate_at(0.999) == 10 and s.rate_at(1.0) == 20
    assert s.rate_at(1e6) == 20 and s.rate_at(-1) == 10  # holds the last value
    times = list(s.send_times(0.0, 2.0))
    assert len(times) == 30
    assert times[:3] == pytest.approx([0.1, 0.2, 0.3])
    assert times[9] == pytest.approx(1.0) and times[10] == pytest.approx(1.05)
    assert times[-1] == pytest.approx(2.0)
    assert all(b > a for a, b in zip(times, times[1:]))
    assert s.expected_count(1.5) == pytest.approx(20.0)
    assert s.count_by(1.0) == 10 and s.count_by(2.0) == 30 and s.count_by(0) == 0
    assert s.send_time(10) == 1.0 and s.send_time(11) == pytest.approx(1.05)
    assert s.next_send_time(1.0) == pytest.approx(1.05)
    assert s.next_send_time(0.95) == pytest.approx(1.0)
    # a window (start, until]
    assert len(list(s.send_times(1.0, 2.0))) == 20
    # unbounded iterator
    it = s.send_times(5.0)
    assert next(it) == pytest.approx(5.05)


def test_constant_schedule_has_no_drift():
    s = RateSchedule.constant(3.0)
    assert s.is_constant and s.rate_at(123) == 3.0
    assert s.send_time(3_000_000) == pytest.approx(1_000_000.0, abs=1e-9)
    accumulated = sum([1 / 3] * 3_000_000)
    assert abs(accumulated - 1_000_000.0) > abs(s.send_time(3_000_000) - 1_000_000.0)


def test_schedule_validation_and_helpers():
    with pytest.raises(ValueError, match="starts at time 0"):
        RateSchedule((1.0,), (5.0,))
    with pytest.raises(ValueError, match="strictly ascending"):
        RateSchedule((0.0, 2.0, 2.0), (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="> 0"):
        RateSchedule((0.0,), (0.0,))
    with pytest.raises(ValueError, match="k starts at 1"):
        RateSchedule.constant(1.0).send_time(0)
    assert schedule_for(100) == RateSchedule.constant(100)
    assert schedule_for("S1", rate=12.5) == RateSchedule.constant(12.5)
    with pytest.raises(ValueError, match="sampled rate"):
        schedule_for("S1")
    rates = sample_device_rates("S2'", 4, seed=5)
    assert [s.rate_at(0) for s in device_schedules("S2'", 4, seed=5)] == rates


def test_paced_targets_absolute_times():
    """Each wake-up aims at origin + send_time(k): a sleep that overshoots by 10 ms never adds up."""
    now = [100.0]

    def clock():
        return now[0]

    def sleep(d):
        now[0] += d + 0.01

    s = RateSchedule.constant(10.0)
    out = list(paced(s, origin=100.0, until=5.0, clock=clock, sleep=sleep))
    assert [k for k, _ in out] == list(range(1, 51))
    assert all(lat == pytest.approx(0.01) for _, lat in out)
    assert now[0] == pytest.approx(105.01)


def test_paced_catches_up_without_sleeping():
    now = [0.0]
    slept = []
    out = []
    gen = paced(RateSchedule.constant(10.0), origin=0.0, clock=lambda: now[0], sleep=slept.append)
    now[0] = 0.35  # producer stalled: samples 1-3 are late
    for _ in range(3):
        out.append(next(gen))
    assert [k for k, _ in out] == [1, 2, 3]
    assert [lat for _, lat in out] == pytest.approx([0.25, 0.15, 0.05])
    assert slept == []
    next(gen)
    assert slept == [pytest.approx(0.05)]


def test_paced_skip_until_starts_after_a_late_start():
    """A producer that starts 2.05 s into its schedule sends the first sample due after that, no burst."""
    now = [102.05]
    slept = []
    gen = paced(RateSchedule((0.0, 1.0), (10.0, 20.0)), origin=100.0, skip_until=2.05,
                clock=lambda: now[0], sleep=lambda d: (slept.append(d), now.__setitem__(0, now[0] + d)))
    k, late = next(gen)
    # 10 in the first second, then 20/s: N(2.05) = 10 + 21 = 31, so the next is sample 32 at 2.1 s
    assert k == 32 and late == 0.0 and slept == [pytest.approx(0.05)]
