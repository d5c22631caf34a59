"""A device's streaming buffer, batch policies, and ScaDLES' buffer-growth formulas.

Buffer policies (ScaDLES Sec. IV, "Limited memory and storage"):

* **persistence**: keep every sample until it is trained on; `take` is FIFO. With a step time
  t_i, rate S_i and batch b_i the backlog grows linearly with the step count T (Eq. 2).
* **truncation**: "discard the residual samples and hold just enough data corresponding to the
  device's streaming rate S_i". At each `take` the buffer first keeps only the most recent
  max(ceil(rate), batch_size) samples (older ones are dropped), then hands out up to
  `batch_size` of those, oldest first. Between takes arrivals accumulate (t_i * S_i of them per
  step). Keeping at least the batch makes truncation change what is *held*, never how a device
  trains: a fixed-batch device (b = 64) streaming below 64/s still waits for and trains on 64,
  as under persistence (under ScaDLES' stream batches, b_i <= ceil(S_i) or b_min, the same).

Either policy may also have a memory cap: after each push, samples beyond `cap_samples` are
dropped, oldest first.

Batch policies (ScaDLES Sec. IV / V-D, NOTES.md):

* `FixedBatch(b)`: conventional DDL (b = 64 in the paper). A step needs b samples; with fewer
  buffered the worker waits, about (b - buffered) / rate seconds (the paper's b/p).
* `StreamBatch(b_min=8, b_max=1024)`: ScaDLES, b_i = S_i clipped to [b_min, b_max]. A step
  never waits for the full b_i: it trains on min(buffered, b_i) samples once b_min are there.

The rate is a float; batch sizes and the truncation window use ceil(rate) (equal to the rate
for the integer rates of the paper's experiments).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, Union

from testbed.data.streaming.rates import RateSchedule
from testbed.records.columns import BUFFER_COLUMNS as STREAM_COLUMNS  # noqa: F401  (testbed.data.streaming exports it)

T = TypeVar("T")

BufferPolicy = Literal["persistence", "truncation"]
BUFFER_POLICIES: tuple[str, ...] = ("persistence", "truncation")

CIFAR_SAMPLE_BYTES = 3 * 32 * 32
"""Bytes of one 32x32 RGB uint8 image: ScaDLES Table II's per-sample size (its "3 KB")."""


def _ceil_rate(rate: float) -> int:
    """ceil(rate), tolerant of float noise just above an integer (37.000000001 -> 37)."""
    return max(1, int(math.ceil(rate - 1e-9)))


def _check_rate(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a finite number > 0 samples/s, got {rate!r}")
    return float(rate)


def _check_count(n: object, what: str, minimum: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {n!r}")
    return n


# --------------------------------------------------------------------------- batch policies


@dataclass(frozen=True)
class FixedBatch:
    """Conventional DDL: every step trains on exactly b samples, waiting for them if needed."""

    b: int = 64

    def __post_init__(self) -> None:
        _check_count(self.b, "FixedBatch.b", 1)

    def batch_size(self, rate: float) -> int:
        return self.b

    def min_samples(self, rate: float) -> int:
        """Samples that must be buffered before a step may start."""
        return self.b

    def expected_wait(self, buffered: int, rate: float) -> float:
        """Seconds until b samples are buffered at a constant `rate` (0 when already there)."""
        return max(0, self.b - buffered) / _check_rate(rate)


@dataclass(frozen=True)
class StreamBatch:
    """ScaDLES: b_i = ceil(S_i) clipped to [b_min, b_max]; a step starts once b_min are buffered."""

    b_min: int = 8
    b_max: int = 1024

    def __post_init__(self) -> None:
        _check_count(self.b_min, "StreamBatch.b_min", 1)
        _check_count(self.b_max, "StreamBatch.b_max", 1)
        if self.b_max < self.b_min:
            raise ValueError(f"StreamBatch.b_max must be >= b_min, got b_min={self.b_min} b_max={self.b_max}")

    def batch_size(self, rate: float) -> int:
        return min(self.b_max, max(self.b_min, _ceil_rate(_check_rate(rate))))

    def min_samples(self, rate: float) -> int:
        return self.b_min

    def expected_wait(self, buffered: int, rate: float) -> float:
        return max(0, self.b_min - buffered) / _check_rate(rate)


BatchPolicy = Union[FixedBatch, StreamBatch]


def batch_size_for(policy: BatchPolicy, rate: float) -> int:
    """The batch size a device streaming at `rate` samples/s trains on under `policy`."""
    return policy.batch_size(rate)


def parse_batch_policy(value: object) -> BatchPolicy:
    """`64` or `{fixed: 64}` -> FixedBatch; `"stream"` or `{stream: {b_min, b_max}}` -> StreamBatch."""
    if isinstance(value, (FixedBatch, StreamBatch)):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return FixedBatch(value)
    if isinstance(value, str) and value.strip().lower() == "stream":
        return StreamBatch()
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, body),) = value.items()
        if kind == "fixed":
            return FixedBatch(body)  # type: ignore[arg-type]
        if kind == "stream":
            body = {} if body is None else body
            if not isinstance(body, Mapping) or not set(body) <= {"b_min", "b_max"}:
                raise ValueError(f"stream batch takes only b_min and b_max, got {body!r}")
            return StreamBatch(**body)
    raise ValueError(f"batch must be an integer >= 1, 'stream', {{fixed: b}} or {{stream: {{b_min, b_max}}}}; "
                     f"got {value!r}")


# --------------------------------------------------------------------------- the buffer


class _Chunk(Generic[T]):
    """A run of consecutive samples: real items, or `count` anonymous ones (items is None)."""

    __slots__ = ("items", "start", "stop")

    def __init__(self, items: Sequence[T] | None, start: int, stop: int) -> None:
        self.items = items
        self.start = start
        self.stop = stop

    def __len__(self) -> int:
        return self.stop - self.start


class StreamBuffer(Generic[T]):
    """One device's buffer of streamed samples, with counters for the records table.

    Counters (samples, cumulative except `buffered`): arrived = trained_on + dropped + buffered.
    `buffered_bytes` = buffered * sample_bytes_hint (a per-sample size estimate, e.g. 3,072 for a
    CIFAR uint8 image as in ScaDLES Table II). Times passed to push/take/snapshot must not go
    backwards. Items are anything (decoded arrays, raw Kafka records); `push_count`/`take_count`
    work on anonymous samples for simulations.
    """

    def __init__(
        self,
        policy: BufferPolicy,
        rate: float,
        cap_samples: int | None = None,
        sample_bytes_hint: int = 0,
    ) -> None:
        if policy not in BUFFER_POLICIES:
            raise ValueError(f"buffer policy must be 'persistence' or 'truncation', got {policy!r}")
        if cap_samples is not None:
            _check_count(cap_samples, "cap_samples", 1)
        _check_count(sample_bytes_hint, "sample_bytes_hint", 0)
        self.policy: BufferPolicy = policy
        self._rate = _check_rate(rate)
        self.cap_samples = cap_samples
        self.sample_bytes_hint = sample_bytes_hint
        self.arrived = 0
        self.trained_on = 0
        self.dropped_truncation = 0
        self.dropped_cap = 0
        self._chunks: deque[_Chunk[T]] = deque()
        self._n = 0
        self._last_time = -math.inf

    def __repr__(self) -> str:
        return (
            f"StreamBuffer({self.policy}, rate={self._rate:g}, buffered={self._n}, arrived={self.arrived}, "
            f"trained={self.trained_on}, dropped={self.dropped})"
        )

    def __len__(self) -> int:
        return self._n

    # ---- properties

    @property
    def rate(self) -> float:
        return self._rate

    @rate.setter
    def rate(self, value: float) -> None:
        """Update the device's current rate (a time-varying trace): it sets the truncation window."""
        self._rate = _check_rate(value)

    @property
    def keep_on_take(self) -> int | None:
        """Samples truncation keeps at a take beside the batch: ceil(rate); None for persistence."""
        return _ceil_rate(self._rate) if self.policy == "truncation" else None

    @property
    def buffered(self) -> int:
        return self._n

    @property
    def dropped(self) -> int:
        return self.dropped_truncation + self.dropped_cap

    @property
    def buffered_bytes(self) -> int:
        return self._n * self.sample_bytes_hint

    # ---- internals

    def _tick(self, now: float) -> None:
        if not math.isfinite(now):
            raise ValueError(f"time must be finite, got {now!r}")
        if now < self._last_time:
            raise ValueError(f"time went backwards: {now:g} after {self._last_time:g}")
        self._last_time = now

    def _append(self, chunk: _Chunk[T]) -> int:
        n = len(chunk)
        if n:
            self._chunks.append(chunk)
            self._n += n
            self.arrived += n
        if self.cap_samples is not None and self._n > self.cap_samples:
            self.dropped_cap += self._remove_oldest(self._n - self.cap_samples, None)
        return n

    def _remove_oldest(self, k: int, out: list[T | None] | None) -> int:
        """Remove the k oldest samples (fewer if not there), appending them to `out` if given."""
        k = min(k, self._n)
        left = k
        while left:
            c = self._chunks[0]
            take = min(left, len(c))
            if out is not None:
                if c.items is None:
                    out.extend([None] * take)
                else:
                    out.extend(c.items[c.start : c.start + take])
            c.start += take
            if not len(c):
                self._chunks.popleft()
            left -= take
        self._n -= k
        return k

    def _take(self, batch_size: int, now: float, out: list[T | None] | None) -> int:
        _check_count(batch_size, "batch_size", 0)
        self._tick(now)
        if self.policy == "truncation":
            keep = max(_ceil_rate(self._rate), batch_size)
            if self._n > keep:
                self.dropped_truncation += self._remove_oldest(self._n - keep, None)
        n = self._remove_oldest(batch_size, out)
        self.trained_on += n
        return n

    # ---- public

    def push(self, samples: Iterable[T], now: float) -> int:
        """Append arrivals (oldest first); apply the cap. Returns how many arrived."""
        self._tick(now)
        items = samples if isinstance(samples, Sequence) else list(samples)
        return self._append(_Chunk(items, 0, len(items)))

    def push_count(self, n: int, now: float) -> int:
        """Append n anonymous arrivals (simulation)."""
        _check_count(n, "n", 0)
        self._tick(now)
        return self._append(_Chunk(None, 0, n))

    def take(self, batch_size: int, now: float) -> list[T]:
        """Remove up to `batch_size` samples for a training step (truncating first, if so set).

        Anonymous samples (from push_count) come out as None.
        """
        out: list[T | None] = []
        self._take(batch_size, now, out)
        return out  # type: ignore[return-value]

    def take_count(self, batch_size: int, now: float) -> int:
        """Like take, without materializing the samples; returns how many were taken."""
        return self._take(batch_size, now, None)

    def snapshot(self, now: float) -> dict[str, float | int]:
        """A records row: time, arrived, trained, dropped, buffered, buffered_bytes, rate (no node)."""
        self._tick(now)
        return {
            "time": now,
            "arrived": self.arrived,
            "trained": self.trained_on,
            "dropped": self.dropped,
            "buffered": self._n,
            "buffered_bytes": self.buffered_bytes,
            "rate": self._rate,
        }


# --------------------------------------------------------------------------- ScaDLES formulas


def eq2_backlog(rate: float, step_time: float, batch: float, steps: float) -> float:
    """ScaDLES Eq. 2: samples buffered under persistence after T steps,

        Q_i = (t_i * S_i - b_i) * T + S_i,   valid when t_i * S_i >= b_i.

    (S_i samples arrive in a first second before training starts; each step takes b_i and
    t_i * S_i arrive meanwhile.) Raises ValueError outside the formula's domain, where the
    worker waits for data instead and the backlog stays bounded. The derivation also assumes
    S_i >= b_i (the paper's scenario "S_i > b_i"): with S_i < b_i <= t_i * S_i the first step
    waits for b_i samples and the backlog is (t_i * S_i - b_i) * T + b_i instead.
    """
    rate, step_time, batch, steps = float(rate), float(step_time), float(batch), float(steps)
    if rate <= 0 or step_time < 0 or batch < 0 or steps < 0:
        raise ValueError("eq2_backlog needs rate > 0, step_time >= 0, batch >= 0, steps >= 0")
    if step_time * rate < batch:
        raise ValueError(
            f"Eq. 2 holds only when step_time*rate >= batch, got {step_time:g}*{rate:g} < {batch:g}"
        )
    return (step_time * rate - batch) * steps + rate


def eq3_backlog(rate: float, step_time: float, steps: float) -> float:
    """ScaDLES Eq. 3, Eq. 2 when t_i * S_i >> b_i: Q_i = T * t_i * S_i + S_i."""
    return float(steps) * float(step_time) * float(rate) + float(rate)


def truncation_backlog(rate: float) -> int:
    """Samples a truncation buffer holds right after a take's truncation: ceil(S_i), O(S_i)."""
    return _ceil_rate(_check_rate(rate))


def backlog_bytes(samples: float, sample_bytes: int = CIFAR_SAMPLE_BYTES) -> float:
    """Bytes of a backlog. ScaDLES Table II = eq3_backlog(...) * 3,072 bytes, reported in GiB
    (e.g. t=1.2 s, S=100/s, T=1e5: 34.33)."""
    return float(samples) * sample_bytes


@dataclass(frozen=True)
class SimStep:
    """One simulated training step: when it started, its wait, its batch, and the buffer's
    counters just before the next step's take (after the step's arrivals)."""

    step: int
    start: float
    wait: float
    batch: int
    end: float
    arrived: int
    trained: int
    dropped: int
    buffered: int


def simulate_buffer(
    schedule: RateSchedule,
    batch: BatchPolicy,
    policy: BufferPolicy,
    step_time: float,
    steps: int,
    *,
    warmup: float = 1.0,
    cap_samples: int | None = None,
) -> list[SimStep]:
    """Simulate one device: arrivals at the schedule's send times, a step every `step_time`.

    Training starts at `warmup` seconds (1 s: Eq. 2's first S_i samples). Before each step the
    worker waits, if needed, until `batch.min_samples` are buffered (the same under either
    policy: truncation keeps at least the batch); the step then takes `batch.batch_size(rate)` and lasts
    `step_time`. With persistence, a constant integer rate, FixedBatch and
    step_time*rate >= b, `buffered` after step T equals `eq2_backlog(rate, step_time, b, T)`.
    """
    _check_count(steps, "steps", 0)
    if not (math.isfinite(step_time) and step_time >= 0) or not (math.isfinite(warmup) and warmup >= 0):
        raise ValueError("step_time and warmup must be finite and >= 0")
    buf: StreamBuffer[None] = StreamBuffer(policy, schedule.rate_at(0.0), cap_samples=cap_samples)
    sent = 0  # samples pushed so far (= schedule index of the last arrival)
    now = warmup
    out: list[SimStep] = []

    def arrive_until(t: float) -> None:
        nonlocal sent
        n = schedule.count_by(t)
        if n > sent:
            buf.push_count(n - sent, t)
            sent = n

    arrive_until(now)
    for i in range(1, steps + 1):
        rate = schedule.rate_at(now)
        buf.rate = rate
        need = batch.min_samples(rate)
        start = now
        if buf.buffered < need:
            # the (need - buffered)-th sample still to come; drops only happen at push (cap) and take,
            # so with a cap >= need this arrival suffices
            start = schedule.send_time(sent + need - buf.buffered)
            arrive_until(start)
        b = batch.batch_size(rate)
        taken = buf.take_count(b, start)
        now = start + step_time
        arrive_until(now)
        out.append(
            SimStep(
                step=i, start=start, wait=start - (out[-1].end if out else warmup), batch=taken, end=now,
                arrived=buf.arrived, trained=buf.trained_on, dropped=buf.dropped, buffered=buf.buffered,
            )
        )
    return out
