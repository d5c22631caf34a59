"""BSP: bulk-synchronous parallel SGD through a parameter server.

Every step the PS waits for one gradient from each worker, averages them and applies
W <- W - lr * (1/N) sum_i g_i (the synchronous baseline of AdaComp Sec. II, SelSync Eq. 1,
ADSP Sec. II-A), then sends the new model to all workers. With a compressor (compressors.py)
each push is decoded to its dense update (zeros where it sent nothing) before the mean.
"""

from __future__ import annotations

from typing import Optional

import torch

from testbed.errors import RunFailed
from testbed.strategies.base import ServerState, Strategy, Tensors
from testbed.strategies.compressors import Compressible, Compressing


def average(payloads: list[Tensors], weights: Optional[list[float]] = None) -> Tensors:
    """Element-wise mean of equally-keyed tensor dicts, or their weighted sum with `weights`."""
    n = len(payloads)
    out: Tensors = {}
    for name in payloads[0]:
        acc = torch.zeros_like(payloads[0][name], dtype=torch.float32)
        for i, p in enumerate(payloads):
            acc.add_(p[name].to(torch.float32), alpha=1.0 if weights is None else weights[i])
        out[name] = acc.div_(n) if weights is None else acc
    return out


class BSP(Compressing, Strategy):
    name = "bsp"
    summary = "bulk-synchronous: PS waits for all workers each step, averages gradients, broadcasts"
    synchronous = True
    Params = Compressible

    def __init__(self, params=None):
        super().__init__(params)
        self._pending: dict[str, Tensors] = {}
        self._left: set[str] = set()

    def aggregate(self, server: ServerState) -> tuple[Tensors, float]:
        """The step's update and learning rate from the pending pushes (BSP: the plain mean)."""
        return average(list(self._pending.values())), server.lr

    def _ready(self, server: ServerState) -> bool:
        """Whether the barrier is complete: every worker still in the run has pushed."""
        return bool(self._pending) and len(self._pending) >= server.n_workers - len(self._left)

    def _complete(self, server: ServerState) -> list[str]:
        if not self._ready(server):
            return []
        update, lr = self.aggregate(server)
        server.apply(update, lr)
        for w in self._pending:
            server.log.append((w, 0, lr))
        answered = sorted(self._pending)
        self._pending.clear()
        return answered

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        if worker in self._pending:
            raise RunFailed(f"BSP: {worker} pushed twice in step {server.version}")
        self._pending[worker] = self.dense_update(server, payload, fill_missing=True)
        return self._complete(server)

    def server_on_leave(self, server: ServerState, worker: str) -> list[str]:
        self._left.add(worker)
        self._pending.pop(worker, None)
        return self._complete(server)

    def server_on_join(self, server: ServerState, worker: str) -> None:
        self._left.discard(worker)

    def round_open(self) -> bool:
        return bool(self._pending)
