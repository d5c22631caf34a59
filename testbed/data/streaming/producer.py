"""Producers: one process per device topic, publishing the device's own samples at its rate.

As in the ScaDLES paper (and its code: key = label, value = image bytes, sleep 1/rate between
sends), they run beside the broker, on the broker node (or on a producer node beside a
broker edgebed does not run itself); here sends are paced on absolute times so the rate does
not drift, and a time-varying rate (a trace) is followed in the run's time.
"""

from __future__ import annotations

import time
from typing import Mapping, Optional

import numpy as np

from testbed.data.streaming.broker import BrokerError, BrokerWatch, producer_config
from testbed.data.streaming.rates import RateSchedule, paced
from testbed.data.streaming.sample_wire import encode_sample


def produce_stream(bootstrap: str, topic: str, x: np.ndarray, y: np.ndarray,
                   schedule: RateSchedule | Mapping | float, stop_event, seed: int = 0,
                   t0: Optional[float] = None) -> int:
    """Publish samples of (x, y), reshuffled each pass, on `schedule` until stopped.

    `schedule` is a RateSchedule, its dict form {times, rates}, or a constant rate. Its time 0
    is the wall-clock `t0` (the run's start, as in the records; default: now); sends that fell
    before this producer started are skipped, not burst. Fails (BrokerError) when the broker
    stays unreachable. Returns the number of samples sent.
    """
    from confluent_kafka import Producer

    from testbed.kernel.parent_death import die_with_parent

    die_with_parent()  # a forked producer goes when its node's role goes (a crash, a killed runner)

    if isinstance(schedule, Mapping):
        schedule = RateSchedule(schedule["times"], schedule["rates"])
    elif not isinstance(schedule, RateSchedule):
        schedule = RateSchedule.constant(float(schedule))
    watch = BrokerWatch(bootstrap)
    prod = Producer({**producer_config(bootstrap), "error_cb": watch})

    def delivered(err, _msg) -> None:
        if err is None:
            watch.alive()

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    pos = sent = 0
    elapsed = 0.0 if t0 is None else max(0.0, time.time() - t0)
    origin = time.monotonic() - elapsed
    for _ in paced(schedule, origin, skip_until=elapsed):
        if stop_event.is_set():
            break
        if pos == len(order):
            order, pos = rng.permutation(len(x)), 0
        i = order[pos]
        pos += 1
        key, value = encode_sample(x[i], int(y[i]))
        while True:
            try:
                prod.produce(topic, key=key, value=value, on_delivery=delivered)
                break
            except BufferError:  # the broker is not keeping up: wait rather than drop
                prod.poll(0.01)
                if stop_event.is_set() or watch.failed():
                    break
        prod.poll(0)
        problem = watch.failed()
        if problem:
            raise BrokerError(f"producer of {topic}: {problem}")
        sent += 1
    prod.flush(5)
    return sent
