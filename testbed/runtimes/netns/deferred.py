"""Arguments a node process unpacks only when it asks: after it has given up its powers.

Unpickling imports the modules that define what arrives (a role's RoleConfig brings torch), and
importing torch starts a native thread. Capabilities are per thread, so a node process must drop
them while it still has one: the netns runtime hands a node's arguments over as `Deferred`, pickled
by multiprocessing's own pickler while it starts the process (events and locks may only be pickled
then), and opened by the node after `drop_privileges`.

Whether the forkserver had torch loaded already (its preload) then no longer matters: a second run
in one process (`edgebed bench all`) reuses the first run's forkserver and preload.
"""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any


class Deferred:
    def __init__(self, value: Any):
        self._value = value

    def __reduce__(self):
        return (_Sealed, (bytes(ForkingPickler.dumps(self._value)),))


class _Sealed:
    """What a Deferred is in the process that received it: bytes until `open()`."""

    def __init__(self, payload: bytes):
        self._payload = payload

    def open(self) -> Any:
        return pickle.loads(self._payload)
