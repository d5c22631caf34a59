"""Producers: one process per device topic, publishing the device's own samples at its rate.

As in the ScaDLES paper (and its code: key = label, value = image bytes, sleep 1/rate between
sends), they run beside the broker, on the broker node; here sends are paced on absolute
times so the rate does not drift.
"""

from __future__ import annotations

import time

import numpy as np

from .broker import producer_config
from .rates import RateSchedule, paced
from .sample_wire import encode_sample


def produce_stream(bootstrap: str, topic: str, x: np.ndarray, y: np.ndarray, rate: float, stop_event,
                   seed: int = 0) -> int:
    """Publish samples of (x, y), reshuffled each pass, at `rate` per second until stopped."""
    from confluent_kafka import Producer

    prod = Producer(producer_config(bootstrap))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    pos = sent = 0
    for _ in paced(RateSchedule.constant(rate), time.monotonic()):
        if stop_event.is_set():
            break
        if pos == len(order):
            order, pos = rng.permutation(len(x)), 0
        i = order[pos]
        pos += 1
        key, value = encode_sample(x[i], int(y[i]))
        while True:
            try:
                prod.produce(topic, key=key, value=value)
                break
            except BufferError:  # the broker is not keeping up: wait rather than drop
                prod.poll(0.01)
                if stop_event.is_set():
                    break
        prod.poll(0)
        sent += 1
    prod.flush(5)
    return sent
