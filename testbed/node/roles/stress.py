"""Background CPU load inside a node's cgroup (a profile's `stress`, a `stress` event)."""

from __future__ import annotations

import time


def run_stress(load: float, stop_event, period: float = 0.1) -> None:
    """Busy-loop `load` of every `period` seconds (load >= 1 means always busy)."""
    busy = min(1.0, load) * period
    while not stop_event.is_set():
        end = time.monotonic() + busy
        while time.monotonic() < end:
            pass
        if load < 1.0:
            time.sleep(period - busy)
