"""AdaComp (Hardy, Le Merrer, Sericola, NCA 2017, adacomp.txt): compressed pushes, per-parameter staleness at the PS.

Worker (Alg. 1, SELECT_GRAD): keep the (100 c)% largest |entries| of *each* matrix and vector
of the update (per tensor, so every layer keeps learning), sent as indices + values.

PS (Alg. 2): a worker pulled the model at timestamp j; its push arrives at timestamp i.
For each parameter k it pushes, the staleness counts the updates applied since the pull
that touched k (Eq. 3):

    sigma_k(i) = sum_{u=j}^{i-1} 1{ dTheta_k(u) != 0 }

and the parameter moves with its own learning rate (Eq. 4, 5):

    Theta_k(i+1) = Theta_k(i) - alpha_k(i) dTheta_k(i),   alpha_k = alpha / sigma_k (alpha if sigma_k = 0)

The PS keeps the indices of the last `history` updates only (d): a push older than
that counts the touches it still has (a lower bound on sigma_k). Pulls are the dense model; no
error feedback (NOTES.md).

Counting: the PS keeps each parameter's touches so far and, when it sends a worker the model,
a copy of them; sigma_k is then the difference at the pushed entries, O(entries) per push
instead of O(entries x staleness) (200 workers make the staleness about 200). The walk over
the kept indices remains for a push whose pull copy is not the one it was based on, or that is
older than `history`; both give the same sigma_k.
"""

from __future__ import annotations

from collections import deque

import torch
from pydantic import Field

from testbed.strategies import sparse
from testbed.strategies.base import ServerState, Strategy, StrategyParams, Tensors
from testbed.strategies.compressors import PerTensorTopC, select_grad

__all__ = ["AdaComp", "AdaCompParams", "select_grad"]


class AdaCompParams(StrategyParams):
    c: float = Field(0.01, gt=0, le=1, description="fraction of each tensor's entries sent (largest |g|)")
    history: int = Field(1000, ge=1, le=1_000_000, description="updates whose indices the PS keeps (d)")


class AdaComp(Strategy):
    name = "adacomp"
    summary = "per-tensor top-c pushes; PS lr per parameter = alpha / (updates that touched it since the pull)"
    paper = "AdaComp (Hardy, Le Merrer, Sericola 2017) Alg. 1-2, Eq. 3-5"
    Params = AdaCompParams

    def __init__(self, params=None):
        super().__init__(params)
        # (timestamp u of the update, {tensor: flat indices it touched})
        self.trace: deque[tuple[int, dict[str, torch.Tensor]]] = deque(maxlen=self.params.history)
        self.touches: dict[str, torch.Tensor] = {}  # per tensor: how often each entry was updated so far
        self.pulled: dict[str, tuple[int, dict[str, torch.Tensor]]] = {}  # worker -> (version, touches then)

    def make_compressor(self) -> PerTensorTopC:
        """Alg. 1 on the worker (compressors.PerTensorTopC, usable under other protocols too)."""
        return PerTensorTopC(self.params.c)

    def staleness(self, name: str, idx: torch.Tensor, numel: int, pulled_at: int) -> torch.Tensor:
        """Eq. 3 for the entries `idx` of tensor `name`: touches by updates u >= pulled_at."""
        counts = torch.zeros(numel, dtype=torch.int64)
        for u, touched in reversed(self.trace):  # newest first: stop at the pull
            if u < pulled_at:
                break
            if name in touched:
                counts[touched[name]] += 1
        return counts[idx]

    def server_reply_meta(self, server: ServerState, worker: str) -> dict:
        """The model leaves for `worker` at this version: remember the touches it saw."""
        self.pulled[worker] = (server.version, {n: t.clone() for n, t in self.touches.items()})
        return {}

    def _sigma(self, name: str, idx: torch.Tensor, numel: int, worker: str, base_version: int, i: int) -> torch.Tensor:
        """Eq. 3 at the entries `idx`: from the worker's pull copy when it is the pull this push
        is based on (and within `history`), else by walking the kept indices."""
        version, seen = self.pulled.get(worker, (None, None))
        if version == base_version and i - base_version <= self.params.history:
            now = self.touches.get(name)
            if now is None:
                return torch.zeros(len(idx), dtype=torch.int64)
            before = seen.get(name)
            return (now[idx] - (before[idx] if before is not None else 0)).to(torch.int64)
        return self.staleness(name, idx, numel, base_version)

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        entries, dense = sparse.decode(payload)
        for name, t in dense.items():  # a dense entry touches every index
            flat = t.reshape(-1)
            entries[name] = (torch.arange(flat.numel()), flat)
        i = server.version
        touched: dict[str, torch.Tensor] = {}
        lr_sum = lr_n = 0.0
        with torch.no_grad():
            for name, (idx, val) in entries.items():
                p = server.params[name].view(-1)
                sigma = self._sigma(name, idx, p.numel(), worker, base_version, i)
                alpha_k = torch.where(sigma > 0, server.lr / sigma.clamp(min=1).to(torch.float32),
                                      torch.tensor(server.lr))  # Eq. 5
                p.index_add_(0, idx, (-alpha_k * val.to(torch.float32)).to(p.dtype))  # Eq. 4
                touched[name] = idx
                lr_sum += float(alpha_k.sum())
                lr_n += len(idx)
        self.trace.append((i, touched))
        for name, idx in touched.items():
            counts = self.touches.setdefault(name, torch.zeros(server.params[name].numel(), dtype=torch.int32))
            counts[idx] += 1  # a push's indices are distinct
        server.version += 1
        server.log.append((worker, i - base_version, lr_sum / lr_n if lr_n else server.lr))
        return [worker]
