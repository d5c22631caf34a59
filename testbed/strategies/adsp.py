"""ADSP (Wang et al., adsp.txt): heterogeneous workers never wait, and commit equally often.

Time is cut into check periods of Gamma seconds. Worker i trains mini-batch after mini-batch
on its own copy (W_i <- W_i - eta' g, the local lr eta' = workload.lr) and accumulates
U_i = sum eta' g since its last commit. It commits U_i every Gamma / dC_i seconds, less the
time its last commit and pull took (O_i); the PS applies W <- W - eta U_i (eta = global_lr,
default 1/M for M workers, NOTES.md) and returns W, which the worker continues from (Sec. 4).

At each checkpoint the scheduler sets the target total commits C_target, and every worker's
commit rate for the next period is dC_i = C_target - c_i (c_i: its commits so far), so a
worker that fell short catches up and all commit about equally often over time, whatever
their speed. Alg. 1 read literally collapses after the first period (NOTES.md); edgebed's
reading (the default and, for now, the only one): C_target grows by `commits_per_period`
(k) at every checkpoint. Alg. 1's online search for k (reward from a fitted loss curve,
1-minute trials) is not implemented yet: k is a parameter.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch
from pydantic import Field

from .base import ServerState, Strategy, StrategyParams, Tensors, WorkerContext


class ADSPParams(StrategyParams):
    check_period: float = Field(60.0, gt=0, description="Gamma: seconds between checkpoints")
    commits_per_period: int = Field(1, ge=1, description="k: C_target grows by k every checkpoint")
    global_lr: Optional[float] = Field(None, gt=0, description="eta at the PS (default 1/M for M workers)")


class ADSP(Strategy):
    name = "adsp"
    summary = "no waiting: workers train locally and commit accumulated updates at rates that equalize commits"
    paper = "ADSP Sec. 4, Alg. 1 (fixed commit target growth; no online search yet)"
    Params = ADSPParams

    def __init__(self, params=None, clock: Callable[[], float] = time.monotonic):
        super().__init__(params)
        self.clock = clock
        # worker side
        self._acc: Optional[Tensors] = None
        self._interval = self.params.check_period / self.params.commits_per_period
        self._last_commit: Optional[float] = None
        self._overhead = 0.0  # O_i: how long the last commit + pull took
        self._commit_started: Optional[float] = None
        # server side
        self._start: Optional[float] = None
        self.commits: dict[str, int] = {}

    # -- scheduler (at the PS) -----------------------------------------------------------
    def checkpoint(self) -> int:
        """Index of the current check period (0 until the first checkpoint)."""
        if self._start is None:
            self._start = self.clock()
        return int((self.clock() - self._start) // self.params.check_period)

    def c_target(self) -> int:
        """Total commits every worker should have made by the end of the current period."""
        return self.params.commits_per_period * (self.checkpoint() + 1)

    def commit_rate(self, worker: str) -> int:
        """dC_i = C_target - c_i, at least one commit per period."""
        return max(1, self.c_target() - self.commits.get(worker, 0))

    def server_reply_meta(self, server: ServerState, worker: str) -> dict:
        period_left = self.params.check_period - ((self.clock() - self._start) % self.params.check_period) \
            if self._start is not None else self.params.check_period
        rate = self.commit_rate(worker)
        # the remaining commits of this period, spread over what is left of it
        return {"commit_interval": period_left / rate, "commit_rate": rate}

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        self.checkpoint()
        self.commits[worker] = self.commits.get(worker, 0) + 1
        eta = self.params.global_lr or 1.0 / max(1, server.n_workers)
        server.apply(payload, eta)
        server.log.append((worker, server.version - 1 - base_version, eta))
        return [worker]

    # -- worker --------------------------------------------------------------------------
    def worker_on_model(self, meta: dict) -> None:
        now = self.clock()
        if self._commit_started is not None:
            self._overhead = now - self._commit_started
            self._commit_started = None
        if "commit_interval" in meta:
            self._interval = float(meta["commit_interval"])
        self._last_commit = now

    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Optional[Tensors]:
        if self._acc is None:
            self._acc = {n: torch.zeros_like(g, dtype=torch.float32) for n, g in grads.items()}
        for n, g in grads.items():
            self._acc[n].add_(g.detach().to(torch.float32), alpha=ctx.lr)  # U_i = sum eta' g
        now = self.clock()
        if self._last_commit is None:
            self._last_commit = now
        if now - self._last_commit < self._interval - self._overhead:
            return None  # keep training: the worker applies eta' g to its own copy
        out, self._acc = self._acc, None
        self._commit_started = now
        return out
