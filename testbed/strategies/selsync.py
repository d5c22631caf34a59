"""SelSync (Tyagi & Sharma, selsync.txt): synchronize only the steps that matter.

Each worker measures how much its gradient changes (Eq. 2),

    Delta(g_i) = | E||g_i||^2 - E||g_{i-1}||^2 | / E||g_{i-1}||^2,

with E an exponentially weighted moving average of the squared gradient norm (window 25,
smoothing factor N/100, NOTES.md). Every step (Alg. 1) it first updates its own model
(line 9), raises its flag when Delta >= delta (lines 10-11), and the flags are all-gathered
(line 12: here, a vote through the PS, a few bytes each way). If any flag is up, every worker
pushes and all pull the average (lines 13-16): parameter aggregation (PA, the default:
w <- mean_n w_n) or gradient aggregation (GA: the PS applies the mean gradient to its own
model, so replicas that drifted apart are reset to it). Otherwise the step stays local.
delta = 0 synchronizes every step (BSP with PA); a huge delta is local SGD that never syncs.

SelDP partitioning is `workload.partition: seldp` (partition.py) and data injection with
Eq. 3's local batch is `workload.injection` (injection.py): both work with any algorithm.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field

from testbed.strategies.base import ServerState, StrategyParams, Tensors, WorkerContext
from testbed.strategies.bsp import BSP, average


class SelSyncParams(StrategyParams):
    delta: float = Field(0.3, ge=0, description="synchronize when the relative gradient change >= delta")
    window: int = Field(25, ge=1, description="EWMA window (steps) of the squared gradient norm")
    smoothing: Optional[float] = Field(None, gt=0, le=1, description="EWMA factor (default N/100, at least 0.01)")
    mode: Literal["pa", "ga"] = Field("pa", description="pa: average parameters; ga: average gradients")


class RelativeGradChange:
    """Alg. 1's RelativeGradChange: EWMA of |g|^2, then Eq. 2 between consecutive steps."""

    def __init__(self, smoothing: float, window: int):
        self.smoothing, self.window = smoothing, window
        self.history: list[float] = []  # last `window` squared norms
        self.ewma: Optional[float] = None

    def update(self, sq_norm: float) -> float:
        self.history = (self.history + [sq_norm])[-self.window:]
        previous = self.ewma
        # EWMA over the window: the value k steps back weighs (1 - smoothing)^k, normalized
        # (a factor of N/100 = 0.03 for 3 workers is close to the window's plain mean)
        weights = [(1 - self.smoothing) ** k for k in range(len(self.history))]
        self.ewma = sum(w * v for w, v in zip(weights, reversed(self.history))) / sum(weights)
        e = self.ewma
        if previous is None or previous == 0:
            return float("inf")  # the first step: nothing to compare with, synchronize
        return abs(e - previous) / previous


class SelSync(BSP):
    name = "selsync"
    summary = "local SGD steps; all workers synchronize (average) when any one's gradient change >= delta"
    paper = "SelSync Alg. 1, Eq. 2"
    synchronous = True
    Params = SelSyncParams

    def __init__(self, params=None):
        super().__init__(params)
        self.change: Optional[RelativeGradChange] = None
        self.last_change: Optional[float] = None
        self._votes: dict[str, bool] = {}
        self._sync_round = False
        self.syncs = 0

    # -- worker --------------------------------------------------------------------------
    def worker_vote(self, grads: Tensors, ctx: WorkerContext) -> bool:
        if self.change is None:
            self.change = RelativeGradChange(self.params.smoothing or max(0.01, ctx.n_workers / 100),
                                             self.params.window)
        sq = sum(float(g.detach().to(torch.float32).pow(2).sum()) for g in grads.values())
        self.last_change = self.change.update(sq)
        return self.last_change >= self.params.delta

    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Optional[Tensors]:
        if not ctx.sync:
            return None  # a local step: the worker applies g to its own model
        if self.params.mode == "ga":
            return grads
        # PA: the model after this step's local update (Alg. 1 line 9 comes before the sync)
        return {n: (w.detach().to(torch.float32) - ctx.lr * grads[n].detach().to(torch.float32))
                for n, w in ctx.model_params.items() if n in grads}

    # -- server --------------------------------------------------------------------------
    def server_on_vote(self, server: ServerState, worker: Optional[str],
                       flag: bool) -> Optional[tuple[list[str], bool]]:
        if worker is not None:
            self._votes[worker] = flag
        expected = server.n_workers - len(self._left)
        if not self._votes or len(self._votes) < expected:
            return None
        outcome = any(self._votes.values())
        told = sorted(self._votes)
        self._votes.clear()
        self._sync_round = outcome  # the voters now push: a barrier round is open until it completes
        self.syncs += outcome
        return told, outcome

    def aggregate(self, server: ServerState) -> tuple[Tensors, float]:
        if self.params.mode == "ga":
            return super().aggregate(server)
        mean = average(list(self._pending.values()))
        # apply() does W <- W - lr * u: choose u so that the result is the mean of the models
        return {n: (server.params[n].to(torch.float32) - mean[n]) for n in mean}, 1.0

    def server_on_leave(self, server: ServerState, worker: str) -> list[str]:
        self._votes.pop(worker, None)
        return super().server_on_leave(server, worker)

    def _complete(self, server: ServerState) -> list[str]:
        answered = super()._complete(server)
        if answered:
            self._sync_round = False
        return answered

    def round_open(self) -> bool:
        return bool(self._votes) or bool(self._pending) or self._sync_round
