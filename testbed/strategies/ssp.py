"""SSP: stale synchronous parallel (Ho et al., NIPS'13), a baseline of SelSync and ADSP.

Workers push gradients asynchronously and the PS applies each one at once (W <- W - lr g),
but a worker may not run more than `staleness` clocks (its own push count) ahead of the
slowest worker still training: a push that would put it further ahead is applied, and the
worker is answered only once the slowest catches up. staleness 0 is BSP-like lock-step
(without averaging); a large bound is ASGD without the staleness-scaled lr. With a compressor
(`compressor: {name: adacomp, c: 0.01}`, compressors.py) each push carries only what the
compressor keeps (AdaComp's per-layer top-c, say) and the PS applies the decoded update.
"""

from __future__ import annotations

from pydantic import Field

from testbed.strategies.base import ServerState, Strategy, Tensors
from testbed.strategies.compressors import Compressible, Compressing


class SSPParams(Compressible):
    staleness: int = Field(3, ge=0, le=10_000, description="clocks a worker may run ahead of the slowest")


class SSP(Compressing, Strategy):
    name = "ssp"
    summary = "stale synchronous: apply each push at once; block a worker more than s clocks ahead of the slowest"
    paper = "Ho et al. 2013; baseline in SelSync and ADSP"
    Params = SSPParams
    synchronous = True  # the bound waits for the slowest worker

    def __init__(self, params=None):
        super().__init__(params)
        self.clock: dict[str, int] = {}
        self.blocked: set[str] = set()
        self.left: set[str] = set()

    def _slowest(self) -> int:
        active = [c for w, c in self.clock.items() if w not in self.left]
        return min(active) if active else 0

    def _release(self) -> list[str]:
        """Blocked workers now within the bound."""
        slowest = self._slowest()
        free = sorted(w for w in self.blocked if self.clock[w] - slowest <= self.params.staleness)
        self.blocked.difference_update(free)
        return free

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        for w in server.workers:  # every worker starts at clock 0, even before its first push
            self.clock.setdefault(w, 0)
        self.clock[worker] = self.clock.get(worker, 0) + 1
        server.apply(self.dense_update(server, payload), server.lr)
        server.log.append((worker, server.version - 1 - base_version, server.lr))
        self.blocked.add(worker)
        return self._release()

    def server_on_leave(self, server: ServerState, worker: str) -> list[str]:
        self.left.add(worker)
        self.blocked.discard(worker)
        return self._release()

    def server_on_join(self, server: ServerState, worker: str) -> None:
        # back at the slowest active clock: a rejoined worker neither blocks the others nor is blocked
        self.clock[worker] = self._slowest()
        self.left.discard(worker)
