"""When the parameter server (or the decentralized coordinator) hands the model to the evaluator.

Two modes, from the workload: every `eval_interval` model versions (the default), or, with
`eval_seconds: T`, every T seconds of wall-clock time since the run's start, whatever the
version. Pure bookkeeping: the caller says which version it has and what time it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class EvalSchedule:
    """Answers "feed the evaluator now?".

    By versions (`seconds` None): when the version reaches the next multiple of `interval`.
    By time: at the first call at or after each multiple of `seconds` (times are seconds since the
    run's start). Ticks missed while the caller was busy are dropped, not made up: one feed, at
    the time it really happens, so eval.csv's time column is when each model was taken.
    """

    interval: int
    seconds: Optional[float] = None
    next_version: int = field(init=False)
    tick: int = field(init=False, default=1)  # time mode: the next feed is at tick * seconds

    def __post_init__(self) -> None:
        self.next_version = self.interval

    @property
    def timed(self) -> bool:
        return self.seconds is not None

    def due(self, version: float, now: float) -> bool:
        if self.seconds is None:
            if version < self.next_version:
                return False
            while self.next_version <= version:
                self.next_version += self.interval
            return True
        if now < self.tick * self.seconds:
            return False
        self.tick = max(self.tick + 1, int(now // self.seconds) + 1)
        return True

    def wait(self, now: float, poll: float) -> float:
        """How long a receive may block at `now`: at most `poll`, and never past the next timed feed."""
        if self.seconds is None:
            return poll
        return min(poll, max(0.0, self.tick * self.seconds - now))
