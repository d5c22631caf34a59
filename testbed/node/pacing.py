"""A device's step time held in user space (a device profile's default, `pace_steps: false` turns it off).

A CFS quota alone sets a device's speed only on average: under a small quota a step's wall time
comes in whole 100-ms periods, and what a step costs moves by 5-28% between windows (caches
refilled after each throttled stretch; BENCHMARKS.md, "The noise floor"). Paced, the node gets a
quota with headroom (its step takes well under the device's time) and each training step is then
held to the device's own time, `target_s` for a batch of `batch` samples, in proportion for
others (a CPU's step: its FLOPs grow with its batch), or, given the device's step-time `shape`
(an accelerator's roofline: scenario/devices/step_time.py), as that shape says: a fixed cost
plus a part that grows with the batch. `target_s` alone carries the time's scale (a dilated run's
factor included): the shape only says how a step of another batch compares with it.

A step that overran (a throttled stretch) is made up by shorter pauses after it, at most `carry`
steps' worth, so the mean step time stays the device's without letting the device run ahead of
it afterwards.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from testbed.scenario.devices.step_time import StepTime


class DevicePace:
    def __init__(self, target_s: float, batch: int, carry: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep, shape: Optional[StepTime] = None):
        if target_s <= 0 or batch <= 0:
            raise ValueError(f"a paced step needs a positive time and batch, not {target_s} s for {batch}")
        if shape is not None and shape.seconds(batch) <= 0:
            raise ValueError("a paced step's shape needs a positive time at its batch")
        self.target_s, self.batch, self.carry, self.sleep, self.shape = target_s, batch, carry, sleep, shape
        self.owed = 0.0  # s: overruns not yet made up
        self.paused_seconds = 0.0

    def want(self, samples: int) -> float:
        """The device's time for a step of `samples`."""
        if self.shape is None:
            return self.target_s * samples / self.batch
        return self.target_s * self.shape.seconds(samples) / self.shape.seconds(self.batch)

    def after(self, busy_seconds: float, samples: int) -> float:
        """Pause after a step that took `busy_seconds`; the pause (s)."""
        want = self.want(samples)
        if busy_seconds >= want:
            self.owed = min(self.owed + busy_seconds - want, self.carry * want)
            return 0.0
        spare = want - busy_seconds
        repaid = min(spare, self.owed)
        self.owed -= repaid
        pause = spare - repaid
        self.paused_seconds += pause
        self.sleep(pause)
        return pause
