"""Per-round trainers kept between their rounds (fedavg's `parked`): a trainer that a
round did not select waits, idle, with its process, model, data and connection, for a round that
selects its device again; the PS then hands it that round's model instead of asking the runner
for a new trainer, as Flower keeps its actors and hands each a client. A parked trainer costs its
memory (about 20-40 MiB of its own) and no CPU, so at most `capacity` wait, the one that parked
longest ago ended first when another would pass it."""

from __future__ import annotations

from collections import OrderedDict


class ParkedTrainers:
    """Which trainers wait parked at the PS, oldest first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.waiting: OrderedDict[str, None] = OrderedDict()
        self.counts = {"parked": 0, "handed a round": 0, "ended to make room": 0, "gone when handed": 0}

    def park(self, worker: str) -> list[str]:
        """`worker` was not selected: it waits if there is room. The trainers to end (the oldest
        past the capacity; `worker` itself when the capacity is 0)."""
        if self.capacity <= 0:
            return [worker]
        self.waiting.pop(worker, None)
        self.waiting[worker] = None
        self.counts["parked"] += 1
        ended = []
        while len(self.waiting) > self.capacity:
            ended.append(self.waiting.popitem(last=False)[0])
        self.counts["ended to make room"] += len(ended)
        return ended

    def take(self, worker: str) -> bool:
        """Whether `worker`'s trainer waits parked (it no longer does once taken)."""
        if worker not in self.waiting:
            return False
        del self.waiting[worker]
        return True

    def report(self) -> dict:
        return {**self.counts, "capacity": self.capacity, "waiting at the end": len(self.waiting)}
