"""A device's consumer: a thread that moves its topic's samples into the device's stream buffer."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from testbed.data.streaming.broker import BrokerWatch, consumer_config
from testbed.data.streaming.buffer import BatchPolicy, FixedBatch, StreamBuffer
from testbed.data.streaming.rates import RateSchedule
from testbed.data.streaming.sample_wire import decode_sample
from testbed.errors import RunFailed


class StreamFeeder(threading.Thread):
    """Polls the topic (assign(), no consumer group: one device, one topic) into `buffer`.

    With a time-varying `schedule` (a trace, time 0 = `t0`) the buffer's rate, which sets the
    truncation window, follows it. An unreachable broker (BrokerWatch) ends the thread with
    `error` set, which the training loop turns into a failure.

    `on_snapshot(row)` is called about every `snapshot_every` seconds with the buffer's
    counters, for the run's buffer table. Time is seconds since `t0` (the run's clock).
    """

    def __init__(self, bootstrap: str, topic: str, buffer: StreamBuffer, t0: float,
                 on_snapshot: Optional[Callable[[dict], None]] = None, snapshot_every: float = 1.0,
                 schedule: Optional[RateSchedule] = None, batch_policy: Optional[BatchPolicy] = None,
                 dilation: float = 1.0):
        super().__init__(daemon=True, name=f"feeder-{topic}")
        self.bootstrap, self.topic, self.buffer, self.t0 = bootstrap, topic, buffer, t0
        self.rate_schedule = schedule or RateSchedule.constant(buffer.rate)
        self.batch_policy = batch_policy or FixedBatch()
        self.on_snapshot = on_snapshot
        self.snapshot_every = snapshot_every
        self.lock = threading.Condition()
        self._halt = threading.Event()
        self.error: Optional[str] = None
        self.left_after_take = 0  # samples still buffered right after the last take (under the lock)
        # virtual time: the schedule's times and rates are the world's, k times faster than the wall
        self.dilation = dilation

    def now(self) -> float:
        return time.time() - self.t0

    def rate_now(self) -> float:
        """The device's rate now, the world's (samples per world second: a batch's and a window's size)."""
        return self.rate_schedule.rate_at(self.now() / self.dilation)

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        watch = BrokerWatch(self.bootstrap)
        cons = Consumer({**consumer_config(self.bootstrap, group=f"edgebed-{self.topic}"), "error_cb": watch})
        cons.assign([TopicPartition(self.topic, 0, 0)])
        next_snap = time.monotonic()
        try:
            while not self._halt.is_set():
                msgs = cons.consume(num_messages=1000, timeout=0.1)
                samples = [decode_sample(m.key(), m.value()) for m in msgs if m.error() is None]
                if samples:
                    watch.alive()
                problem = watch.failed()
                if problem:
                    raise RunFailed(problem)
                with self.lock:
                    if not self.rate_schedule.is_constant:  # a trace: the truncation window follows it
                        self.buffer.rate = self.rate_now()
                    if samples:
                        self.buffer.push(samples, self.now())
                        self.lock.notify_all()
                    if self.on_snapshot is not None and time.monotonic() >= next_snap:
                        self.on_snapshot(self.buffer.snapshot(self.now()))
                        next_snap += self.snapshot_every
        except Exception as e:  # reported to the training loop, which fails the node
            self.error = f"{type(e).__name__}: {e}"
        finally:
            cons.close()

    def next_take(self) -> tuple[int, int]:
        """(samples wanted, samples needed to start) for the next step, at the device's current rate."""
        rate = self.rate_now()
        # either policy waits for the same samples: truncation keeps at least the batch
        return self.batch_policy.batch_size(rate), self.batch_policy.min_samples(rate)

    def take(self, want: int, at_least: int, stop_event, timeout: float = 120.0) -> tuple[list, float]:
        """Wait until `at_least` samples are buffered, then take up to `want`. Returns (samples, waited s)."""
        start, timeout = time.monotonic(), timeout * self.dilation
        with self.lock:
            while self.buffer.buffered < at_least:
                if stop_event.is_set() or self.error or time.monotonic() - start > timeout:
                    return [], time.monotonic() - start
                self.lock.wait(0.1)
            taken = self.buffer.take(want, self.now())
            self.left_after_take = self.buffer.buffered
            return taken, time.monotonic() - start

    def stop(self) -> None:
        self._halt.set()
