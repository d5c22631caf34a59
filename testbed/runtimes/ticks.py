"""How far a fleet's bring-up or teardown has got: a runtime calls its `progress(stage, done,
total)` as it makes or removes each node's part; the runner shows it (run/progress.FleetProgress).
Stages are named as a person reads them ("namespaces", "links", "control links", "removing")."""

from __future__ import annotations

from typing import Callable

Tick = Callable[[str, int, int], None]


def no_ticks(stage: str, done: int, total: int) -> None:
    """Nobody is watching (the default)."""
