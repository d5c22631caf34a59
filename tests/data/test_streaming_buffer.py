"""Tests for testbed.data.streaming.buffer: persistence/truncation buffers, batch policies, Eq. 2-3."""

from __future__ import annotations

import math

import pytest

from testbed.data.streaming.buffer import (
    CIFAR_SAMPLE_BYTES,
    STREAM_COLUMNS,
    FixedBatch,
    StreamBatch,
    StreamBuffer,
    backlog_bytes,
    batch_size_for,
    eq2_backlog,
    eq3_backlog,
    parse_batch_policy,
    simulate_buffer,
    truncation_backlog,
)
from testbed.data.streaming.rates import RateSchedule


def counters(buf: StreamBuffer) -> tuple[int, int, int, int, int]:
    assert buf.arrived == buf.trained_on + buf.dropped + buf.buffered  # conservation
    return buf.arrived, buf.trained_on, buf.dropped, buf.buffered, buf.buffered_bytes


# --------------------------------------------------------------------------- persistence


def test_persistence_is_fifo_and_keeps_everything():
    buf: StreamBuffer[int] = StreamBuffer("persistence", rate=10, sample_bytes_hint=100)
    assert buf.push(range(0, 5), now=0.0) == 5
    assert counters(buf) == (5, 0, 0, 5, 500)
    assert buf.take(3, now=1.0) == [0, 1, 2]
    assert counters(buf) == (5, 3, 0, 2, 200)
    buf.push(list(range(5, 15)), now=2.0)
    assert counters(buf) == (15, 3, 0, 12, 1200)
    assert buf.take(8, now=3.0) == [3, 4, 5, 6, 7, 8, 9, 10]
    assert counters(buf) == (15, 11, 0, 4, 400)
    assert buf.take(8, now=4.0) == [11, 12, 13, 14]  # fewer than asked: what is there
    assert counters(buf) == (15, 15, 0, 0, 0)
    assert buf.take(8, now=5.0) == []
    assert buf.keep_on_take is None


# --------------------------------------------------------------------------- truncation


def test_truncation_keeps_the_last_ceil_rate_samples_at_each_take():
    buf: StreamBuffer[int] = StreamBuffer("truncation", rate=4, sample_bytes_hint=10)
    buf.push(range(10), now=0.0)
    assert counters(buf) == (10, 0, 0, 10, 100)  # no truncation on arrival
    assert buf.take(3, now=1.0) == [6, 7, 8]  # kept [6, 7, 8, 9], 6 dropped, oldest kept first
    assert counters(buf) == (10, 3, 6, 1, 10)
    assert buf.dropped_truncation == 6 and buf.dropped_cap == 0
    buf.push([10, 11], now=2.0)
    assert counters(buf) == (12, 3, 6, 3, 30)
    assert buf.take(3, now=3.0) == [9, 10, 11]  # 3 <= 4: nothing dropped
    assert counters(buf) == (12, 6, 6, 0, 0)
    buf.rate = 2.5  # a trace changed the rate: window ceil(2.5) = 3
    assert buf.keep_on_take == 3
    buf.push([12, 13, 14, 15, 16], now=4.0)
    assert buf.take(1, now=5.0) == [14]
    assert counters(buf) == (17, 7, 8, 2, 20)
    # a stream batch of b_i = ceil(S_i) takes the whole window
    buf.push(range(17, 30), now=6.0)
    assert buf.take(StreamBatch(b_min=1).batch_size(buf.rate), now=7.0) == [27, 28, 29]
    assert counters(buf) == (30, 10, 20, 0, 0)  # [15, 16] + 13 arrivals, 12 dropped


def test_truncation_window_for_float_rates():
    assert StreamBuffer("truncation", rate=37.2).keep_on_take == 38
    assert StreamBuffer("truncation", rate=37.0).keep_on_take == 37
    assert StreamBuffer("truncation", rate=0.3).keep_on_take == 1
    assert truncation_backlog(300) == 300


# --------------------------------------------------------------------------- cap


def test_cap_drops_oldest_beyond_cap_for_persistence():
    buf: StreamBuffer[int] = StreamBuffer("persistence", rate=100, cap_samples=5)
    buf.push(range(8), now=0.0)
    assert counters(buf) == (8, 0, 3, 5, 0)
    assert buf.dropped_cap == 3
    assert buf.take(2, now=1.0) == [3, 4]
    buf.push([8, 9, 10], now=2.0)  # 3 + 3 = 6 > 5: drop [5]
    assert counters(buf) == (11, 2, 4, 5, 0)
    assert buf.take(10, now=3.0) == [6, 7, 8, 9, 10]


def test_cap_applies_to_truncation_too():
    buf: StreamBuffer[int] = StreamBuffer("truncation", rate=10, cap_samples=3)
    buf.push(range(5), now=0.0)
    assert counters(buf) == (5, 0, 2, 3, 0)
    assert buf.take(10, now=1.0) == [2, 3, 4]  # window 10 > 3: no truncation drop
    assert (buf.dropped_cap, buf.dropped_truncation) == (2, 0)


# --------------------------------------------------------------------------- misc buffer


def test_anonymous_samples_and_snapshot():
    buf: StreamBuffer[None] = StreamBuffer("persistence", rate=50, sample_bytes_hint=CIFAR_SAMPLE_BYTES)
    buf.push_count(120, now=1.0)
    assert buf.take_count(64, now=1.5) == 64
    assert buf.take(2, now=1.6) == [None, None]
    row = buf.snapshot(2.0)
    assert row == {"time": 2.0, "arrived": 120, "trained": 66, "dropped": 0, "buffered": 54,
                   "buffered_bytes": 54 * 3072, "rate": 50.0}  # fmt: skip
    assert list(row) == [c for c in STREAM_COLUMNS if c != "node"]
    assert len(buf) == 54


def test_buffer_validation():
    with pytest.raises(ValueError, match="persistence' or 'truncation"):
        StreamBuffer("keep-all", rate=10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate must be"):
        StreamBuffer("truncation", rate=0)
    with pytest.raises(ValueError, match="cap_samples"):
        StreamBuffer("persistence", rate=1, cap_samples=0)
    buf = StreamBuffer("persistence", rate=10)
    buf.push([1], now=5.0)
    with pytest.raises(ValueError, match="time went backwards"):
        buf.take(1, now=4.0)
    with pytest.raises(ValueError, match="batch_size"):
        buf.take(-1, now=6.0)
    with pytest.raises(ValueError, match="rate must be"):
        buf.rate = -1


# --------------------------------------------------------------------------- batch policies


def test_stream_batch_clips_rate_to_bounds():
    sb = StreamBatch()
    assert (sb.b_min, sb.b_max) == (8, 1024)
    assert sb.batch_size(3) == 8
    assert sb.batch_size(8) == 8
    assert sb.batch_size(38) == 38
    assert sb.batch_size(37.2) == 38
    assert sb.batch_size(300.0) == 300
    assert sb.batch_size(1024) == 1024
    assert sb.batch_size(5000) == 1024
    assert batch_size_for(sb, 1.0) == 8
    assert batch_size_for(StreamBatch(16, 64), 100) == 64
    assert sb.min_samples(300) == 8 and sb.expected_wait(8, 10) == 0.0
    with pytest.raises(ValueError, match="b_max must be >= b_min"):
        StreamBatch(64, 8)


def test_fixed_batch_and_wait():
    fb = FixedBatch(64)
    assert batch_size_for(fb, 3) == 64 and batch_size_for(fb, 5000) == 64
    assert fb.min_samples(10) == 64
    assert fb.expected_wait(14, 10.0) == pytest.approx(5.0)  # (b - buffered) / p
    assert fb.expected_wait(0, 32.0) == pytest.approx(2.0)  # the paper's b/p
    assert fb.expected_wait(100, 10.0) == 0.0
    with pytest.raises(ValueError, match="FixedBatch.b"):
        FixedBatch(0)


def test_parse_batch_policy():
    assert parse_batch_policy(64) == FixedBatch(64)
    assert parse_batch_policy({"fixed": 32}) == FixedBatch(32)
    assert parse_batch_policy("stream") == StreamBatch()
    assert parse_batch_policy({"stream": {"b_min": 4}}) == StreamBatch(4, 1024)
    assert parse_batch_policy({"stream": None}) == StreamBatch()
    for bad in ["big", True, 1.5, {"stream": {"bmax": 3}}, {"fixed": 1, "stream": {}}]:
        with pytest.raises(ValueError):
            parse_batch_policy(bad)


# --------------------------------------------------------------------------- Eq. 2 / Eq. 3


def test_eq2_hand_computed():
    # S = 100/s, t = 1.2 s, b = 64: each step leaves 120 - 64 = 56 more; plus the first second's 100
    assert eq2_backlog(100, 1.2, 64, 0) == pytest.approx(100)
    assert eq2_backlog(100, 1.2, 64, 1) == pytest.approx(156)
    assert eq2_backlog(100, 1.2, 64, 10) == pytest.approx(660)
    # b_i = t_i * S_i: the backlog stays S_i whatever T
    assert eq2_backlog(100, 1.2, 120, 1000) == pytest.approx(100)
    with pytest.raises(ValueError, match="step_time\\*rate >= batch"):
        eq2_backlog(10, 1.0, 64, 5)


def test_eq3_and_table_2_bytes():
    assert eq3_backlog(100, 1.2, 1e5) == pytest.approx(12_000_100)
    # ScaDLES Table II (GB there = GiB): ResNet152, t = 1.2 s
    gib = 2**30
    assert backlog_bytes(eq3_backlog(100, 1.2, 1e5)) / gib == pytest.approx(34.33, abs=0.005)
    assert backlog_bytes(eq3_backlog(600, 1.2, 1e3)) / gib == pytest.approx(2.06, abs=0.005)
    assert backlog_bytes(eq3_backlog(600, 1.2, 1e4)) / gib == pytest.approx(20.6, abs=0.005)
    assert backlog_bytes(eq3_backlog(600, 1.6, 1e4)) / gib == pytest.approx(27.5, abs=0.05)


@pytest.mark.parametrize("rate, step_time, b", [(100, 1.2, 64), (600, 1.6, 64), (50, 2.0, 40), (38, 1.5, 8)])
def test_simulated_persistence_matches_eq2(rate, step_time, b):
    sim = simulate_buffer(RateSchedule.constant(rate), FixedBatch(b), "persistence", step_time, 200)
    for s in sim:
        assert s.wait == 0.0 and s.batch == b and s.dropped == 0
        assert s.buffered == round(eq2_backlog(rate, step_time, b, s.step))


def test_eq2_assumes_a_first_second_with_at_least_b_samples():
    # S = 50 < b = 100 <= t*S = 100: the first step waits for b samples, so the backlog is
    # (t*S - b)*T + b rather than Eq. 2's (t*S - b)*T + S
    sim = simulate_buffer(RateSchedule.constant(50), FixedBatch(100), "persistence", 2.0, 5)
    assert sim[0].wait == pytest.approx(1.0)
    assert all(s.wait == 0 for s in sim[1:])
    assert [s.buffered for s in sim] == [100] * 5
    assert eq2_backlog(50, 2.0, 100, 5) == 50


def test_simulated_stream_batch_with_truncation_stays_bounded():
    # ScaDLES: b_i = S_i with truncation -> backlog O(S_i) (here t*S = 120 after each step's arrivals)
    sim = simulate_buffer(RateSchedule.constant(100), StreamBatch(), "truncation", 1.2, 100)
    assert all(s.batch == 100 and s.buffered == 120 and s.wait == 0 for s in sim)
    assert sim[-1].dropped == 99 * 20  # every take after the first drops the 20 oldest
    # persistence with the same stream batch grows as Eq. 2 with b_i = S_i
    sim = simulate_buffer(RateSchedule.constant(100), StreamBatch(), "persistence", 1.2, 100)
    assert [s.buffered for s in sim[:3]] == [120, 140, 160]
    assert sim[-1].buffered == round(eq2_backlog(100, 1.2, 100, 100))


def test_simulated_fixed_batch_waits_for_slow_stream():
    sim = simulate_buffer(RateSchedule.constant(10), FixedBatch(64), "persistence", 0.5, 3)
    # 10 buffered at t=1; the 64th sample arrives at 6.4 s
    assert sim[0].start == pytest.approx(6.4) and sim[0].wait == pytest.approx(5.4)
    assert sim[0].end == pytest.approx(6.9) and sim[0].buffered == 5
    assert sim[1].wait == pytest.approx(FixedBatch(64).expected_wait(5, 10))  # 5.9 s
    assert sim[1].start == pytest.approx(12.8)
    assert all(s.batch == 64 for s in sim)


def test_simulated_trace_rate_change():
    # 100/s for 10 s, then 20/s: a stream batch follows the rate
    sched = RateSchedule((0.0, 10.0), (100.0, 20.0))
    sim = simulate_buffer(sched, StreamBatch(), "truncation", 1.0, 15)
    assert sim[0].batch == 100 and sim[-1].batch == 20
    assert all(s.buffered <= 100 for s in sim)
    assert math.isclose(sim[-1].end, 16.0)


def test_truncation_trains_as_persistence_does():
    # b = 64 at 20 samples/s: both policies wait for 64 and train on 64 (Table IV compares what
    # they hold under the same training); truncation keeps max(ceil(rate), b) at a take
    from testbed.data.streaming.consumer import StreamFeeder

    def feeder(policy, batch):
        return StreamFeeder("127.0.0.1:1", "t", StreamBuffer(policy, 20.0), t0=0.0, batch_policy=batch)

    assert feeder("persistence", FixedBatch(64)).next_take() == (64, 64)
    assert feeder("truncation", FixedBatch(64)).next_take() == (64, 64)
    buf = StreamBuffer("truncation", 20.0)
    buf.push_count(150, now=0.0)
    assert buf.take_count(64, now=0.0) == 64 and buf.buffered == 0 and buf.dropped_truncation == 86
    buf.push_count(150, now=1.0)
    assert buf.take_count(8, now=1.0) == 8 and buf.buffered == 12  # keeps ceil(rate) = 20 when b < rate
    sim = {p: simulate_buffer(RateSchedule.constant(20.0), FixedBatch(64), p,
                              step_time=0.5, steps=10) for p in ("persistence", "truncation")}
    assert [s.batch for s in sim["persistence"]] == [s.batch for s in sim["truncation"]] == [64] * 10
    assert [s.start for s in sim["persistence"]] == [s.start for s in sim["truncation"]]
    sb = StreamBatch()
    assert feeder("truncation", sb).next_take() == (sb.batch_size(20.0), sb.min_samples(20.0))
