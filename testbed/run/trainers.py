"""Per-round trainers from the runner's side (fedavg's `trainers: per_round`): a
device's node (namespace, link, limits) exists for the whole run, its trainer process only while
it trains. The PS asks for a round's trainers over the control channel (a `train` request per
device, runtimes/control/hub.py); this starts each one unless it runs already (selected again, or late
for a round that closed), the name is not a worker of the run, or the device is offline now (its
availability plan: a device that went offline after it was drawn is a drop-out). A trainer that
is not selected again ends by itself (node/roles/worker.py: parked). One asked for while it is
still ending (it parked on the round before, as the PS drew it again) is watched for a second
and started once it has ended."""

from __future__ import annotations

import threading
import time
from typing import Callable

from testbed.plan.availability import OfflineClock
from testbed.plan.cluster import ClusterSpec, Node

ENDING_S = 1.0  # how long a trainer asked for while it runs is watched for its end (exiting takes less;
# one that goes on and parks on the next round within it is started once for nothing)

class Trainers:
    """Starts the trainers the PS asks for; `counts` says what became of the requests."""

    def __init__(self, spec: ClusterSpec, procs: dict, start: Callable[[Node], None], take: Callable[[], list[str]],
                 offline: dict[str, list[list[float]]], t0: float, poll: float = 0.05):
        self.workers = {n.name: n for n in spec.workers}
        self.procs, self.start_role, self.take = procs, start, take
        self.offline, self.t0, self.poll = OfflineClock(offline), t0, poll
        self.counts = {"started": 0, "running already": 0, "offline": 0, "not a worker": 0, "failed": 0,
                       "cut off by the end": 0}
        self.errors: list[str] = []
        self._ending: dict[str, float] = {}  # running when asked for -> until when to watch it end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edgebed-trainers", daemon=True)

    def run_once(self) -> None:
        now = time.monotonic()
        ended = [n for n, until in self._ending.items() if not self._alive(n) or until < now]
        again = [n for n in ended if not self._alive(n)]  # parked as it was drawn again: start it now
        for n in ended:
            del self._ending[n]
        asked = self.take()
        offline = self.offline.at(time.time() - self.t0)
        for name in again:
            self.counts["running already"] -= 1
            self.counts[self._start(name, offline)] += 1
        for name in asked:
            why = "not a worker" if name not in self.workers else "running already" if self._alive(name) else \
                self._start(name, offline)
            if why == "running already":
                self._ending[name] = now + ENDING_S
            self.counts[why] += 1

    def _alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.is_alive()

    def _start(self, name: str, offline: set[str]) -> str:
        if name in offline:
            return "offline"
        try:
            self.start_role(self.workers[name])
        except Exception as e:  # one trainer that cannot start is a drop-out, not the run's end
            if self._stop.is_set():  # asked for as the run ended (a container's supervisor still
                return "cut off by the end"  # starting its first role when the channel closed)
            self.errors.append(f"{name}: {type(e).__name__}: {e}"[:200])
            return "failed"
        return "started"

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            self.run_once()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
