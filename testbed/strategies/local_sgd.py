"""Local SGD with periodic averaging: FedAvg with equal shards, ADSP's "Fixed ADACOMM".

Every worker takes `period` (H) plain SGD steps on its own copy of the model, then all
synchronize: each pushes the sum of its H gradients, the PS averages them (a barrier, as in
BSP) and applies W <- W - lr * (1/N) sum_i sum_h g_i,h, which is exactly the average of the
N local models for plain SGD (McMahan et al. 2017, FedAvg with E local steps and equal
weights; Wang & Joshi's ADACOMM with a constant tau, the ADSP paper's Fixed ADACOMM
baseline). H = 1 is BSP.
"""

from __future__ import annotations

from typing import Optional

import torch
from pydantic import Field

from .base import StrategyParams, Tensors, WorkerContext
from .bsp import BSP


class LocalSGDParams(StrategyParams):
    period: int = Field(8, ge=1, le=100_000, description="local steps H between synchronizations")


class LocalSGD(BSP):
    name = "local_sgd"
    summary = "H local SGD steps, then all workers average (FedAvg with equal shards; Fixed ADACOMM)"
    paper = "FedAvg (McMahan et al. 2017); Fixed ADACOMM baseline of ADSP"
    synchronous = True
    Params = LocalSGDParams

    def __init__(self, params=None):
        super().__init__(params)
        self._acc: Optional[Tensors] = None

    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Optional[Tensors]:
        if self._acc is None:
            self._acc = {n: torch.zeros_like(g, dtype=torch.float32) for n, g in grads.items()}
        for n, g in grads.items():
            self._acc[n].add_(g.detach().to(torch.float32))
        if ctx.step % self.params.period != 0:
            return None  # the worker applies g itself: W_i <- W_i - lr g
        out, self._acc = self._acc, None
        return out
