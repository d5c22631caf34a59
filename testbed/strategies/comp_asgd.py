"""Comp-ASGD: ASGD with compressed pushes, AdaComp's baseline (Sec. III-B a, Fig. 3).

Each worker sends only the fraction c of its update's entries largest in absolute value,
chosen over the whole model at once (Shokri & Shmatikov's selective SGD, "solely the largest
ones across the whole model"), as indices + values. The PS applies them with the whole
update's staleness: W <- W - (alpha / sigma) * g~ with sigma = i - j (alpha when 0), as ASGD.
No error feedback: dropped entries are lost, as in the paper.
"""

from __future__ import annotations

import torch
from pydantic import Field

from testbed.strategies import sparse
from testbed.strategies.asgd import staleness_lr
from testbed.strategies.base import ServerState, Strategy, StrategyParams, Tensors, WorkerContext


class CompASGDParams(StrategyParams):
    c: float = Field(0.01, gt=0, le=1, description="fraction of the update's entries sent (largest |g|, whole model)")


def top_c_whole_model(grads: Tensors, c: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The ceil(c * total) largest |entries| over all tensors, split back per tensor."""
    total = sum(g.numel() for g in grads.values())
    return sparse.top_k_whole(grads, sparse.top_k_count(total, c))


class CompASGD(Strategy):
    name = "comp_asgd"
    summary = "ASGD pushing only the fraction c largest |g| of the whole model (indices + values)"
    paper = "AdaComp Sec. III-B (Shokri & Shmatikov's selective SGD)"
    Params = CompASGDParams

    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Tensors:
        return sparse.encode(top_c_whole_model(grads, self.params.c))

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        staleness = server.version - base_version
        lr = staleness_lr(server.lr, staleness)
        server.apply(sparse.densify(payload, {n: p.shape for n, p in server.params.items()}), lr)
        server.log.append((worker, staleness, lr))
        return [worker]
