"""What a person sees while a fleet comes up and goes down: each stage the runtime
reports (runtimes/ticks.py) with done/total, the rate and the time left. On a terminal, rich's
bars, one a stage; in a log (CI, a pipe), a line at every tenth of a stage and one at its end,
so a log of 1,000 nodes holds about a dozen lines a stage and not a thousand."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
from rich.text import Text


class FleetProgress:
    """A runtime's `progress` (stage, done, total), shown; `stages` keeps each stage's seconds."""

    def __init__(self, say: Callable[[str], None], bar: bool = False, clock: Callable[[], float] = time.monotonic,
                 console: Optional[Console] = None):
        self.say, self.clock = say, clock
        self.stages: dict[str, float] = {}  # stage -> seconds it took, once done
        self._stage: Optional[str] = None
        self._t0 = self._last = clock()  # a stage starts when the one before it ended (or when made)
        self._tenth = 0
        self._bar: Optional[Progress] = _rich_bar(console) if bar else None
        self._task: Any = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self._stage:
            self._begin(stage, total)
        self._last = self.clock()
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
        elif total > 0 and done * 10 // total > self._tenth and done < total:
            self._tenth = done * 10 // total
            self.say(self._line(stage, done, total))
        if done >= total:
            self._end(stage, done, total)

    def _begin(self, stage: str, total: int) -> None:
        self._stage, self._t0, self._tenth = stage, self._last, 0
        if self._bar is not None:
            if self._task is None:
                self._bar.start()
            self._task = self._bar.add_task(stage, total=total)

    def _end(self, stage: str, done: int, total: int) -> None:
        if stage in self.stages:  # already ended (a stage reported past its total)
            return
        self.stages[stage] = seconds = self.clock() - self._t0
        if self._bar is None:
            self.say(f"{stage}: {done}/{total} in {seconds:.1f} s ({done / max(seconds, 1e-9):.0f}/s)")

    def _line(self, stage: str, done: int, total: int) -> str:
        seconds = self.clock() - self._t0
        rate = done / seconds if seconds > 0 else 0.0
        left = f", {(total - done) / rate:.0f} s left" if rate > 0 else ""
        return f"{stage}: {done}/{total} ({rate:.0f}/s{left})"

    def close(self) -> None:
        """Leave the terminal as it was (the bars stay on screen, finished)."""
        if self._bar is not None and self._task is not None:
            self._bar.stop()
            self._task = None
        self._stage = None


def _rich_bar(console: Optional[Console] = None) -> Progress:
    return Progress(TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(), _RateColumn(),
                    TimeRemainingColumn(), console=console)


class _RateColumn(ProgressColumn):
    """Nodes a second (rich's own speed column counts bytes)."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:.0f}/s" if task.speed else "", style="progress.data.speed")
