"""Decentralized strategies: workers exchange with each other directly, no parameter server.

The seam, per step of worker i (testbed/node/roles/peer.py runs it):

  batch_size(ctx)            mini-batch of this step (DLion: compute-capacity-aware, Eq. 5)
  learning_rate(ctx)         lr of this step (DLion's WarmUpLR / DecayLR)
  outgoing(grads, ctx)       {peer: payload}: what each link carries this step (dense, sparse
                             indices + values, or a slice), chosen per link
  wait_bound(peer)           0: the peer's message of this step must arrive before going on
                             (synchronous); s: run at most s steps ahead of it; None: never wait
  weight(meta, ctx)          scale of one worker's gradient in the update (Eq. 5: 1/k)
  weights_to(ctx)            peers to send the full model to now (DLion's weight exchange)
  merge_weights(params, received, ctx)

Every worker applies its own gradient at once and each peer's payload when it arrives:
W_i <- W_i - lr * sum_j weight_j * g_j. What a link does not carry this step stays in that
link's residual and travels later (error feedback per link), so no gradient is lost, only
delayed; the sum over time is the BSP sum.

Payload entries use the sparse.py encodings, so bytes on a link scale with what it carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional

import torch

from testbed.strategies import sparse
from testbed.strategies.base import ServerState, Strategy, StrategyError, Tensors


@dataclass
class PeerInfo:
    """One peer as this worker sees it: the bottleneck rate of the path to it, and whether it
    shares this worker's site (LAN) or is across a WAN."""

    name: str
    rate_bps: Optional[float] = None  # None: nothing on the path is shaped
    same_site: bool = True


@dataclass
class PeerContext:
    worker: str
    step: int
    lr: float  # the scenario's base learning rate (eta)
    n_workers: int
    peers: dict[str, PeerInfo]
    model_params: Tensors
    losses: dict[str, float] = field(default_factory=dict)  # smoothed training loss per worker (self too)
    capacities: dict[str, float] = field(default_factory=dict)  # samples per compute second (self too)
    batch_sizes: dict[str, int] = field(default_factory=dict)  # each worker's latest mini-batch
    compute_seconds: float = 0.0  # this worker's recent compute time per step
    epoch: float = 0.0  # epochs of the training set processed by all workers together
    base_batch: int = 32  # the scenario's workload.batch_size


class Residuals:
    """Per-link error feedback: what each link has not carried yet of this worker's gradients."""

    def __init__(self):
        self.acc: dict[str, Tensors] = {}

    def add(self, peer: str, grads: Tensors) -> Tensors:
        mine = self.acc.setdefault(peer, {})
        for n, g in grads.items():
            g = g.detach().to(torch.float32)
            if n in mine:
                mine[n].add_(g)
            else:
                mine[n] = g.clone()
        return mine

    def sent(self, peer: str, entries: dict[str, torch.Tensor]) -> None:
        """Zero the flat indices {name: idx} that were just sent on the link to `peer`."""
        mine = self.acc[peer]
        for n, idx in entries.items():
            mine[n].view(-1)[idx.to(torch.int64)] = 0.0

    def sent_all(self, peer: str) -> None:
        for t in self.acc[peer].values():
            t.zero_()


def numel(tensors: Tensors) -> int:
    return sum(t.numel() for t in tensors.values())


def sparse_costs_more(entries: int, total: int) -> bool:
    """Whether `entries` as indices + values (8 bytes each) cost at least the dense tensors (4 each)."""
    return entries * 8 >= total * 4


class PeerStrategy(Strategy):
    """Base of the decentralized strategies. Defaults: dense gradients to every peer,
    synchronous, each worker's gradient weighted 1/k."""

    decentralized: ClassVar[bool] = True
    synchronous: ClassVar[bool] = True

    def __init__(self, params=None):
        super().__init__(params)
        self.residuals = Residuals()
        # per link, the last step's selection: (entries sent, contribution threshold); peers.csv
        self.link_log: dict[str, tuple[int, Optional[float]]] = {}

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        raise StrategyError(f"{self.name} is decentralized: workers exchange directly, no PS takes pushes")

    def batch_size(self, ctx: PeerContext) -> int:
        return ctx.base_batch

    def learning_rate(self, ctx: PeerContext) -> float:
        return ctx.lr

    def outgoing(self, grads: Tensors, ctx: PeerContext) -> dict[str, Tensors]:
        self.link_log = {p: (numel(grads), None) for p in ctx.peers}
        return {p: grads for p in ctx.peers}

    def wait_bound(self, peer: PeerInfo) -> Optional[int]:
        return 0

    def weight(self, meta: dict, ctx: PeerContext) -> float:
        return 1.0 / ctx.n_workers

    def weights_to(self, ctx: PeerContext) -> list[str]:
        return []

    def merge_weights(self, params: Tensors, received: Tensors, ctx: PeerContext) -> None:
        with torch.no_grad():
            for n, p in params.items():
                if n in received:
                    p.copy_(received[n])

    # -- helpers for subclasses ------------------------------------------------------------
    def send_dense(self, peer: str, acc: Tensors, threshold: Optional[float] = 0.0) -> Tensors:
        """The link's whole residual, dense; the residual is then empty."""
        payload = {n: t.clone() for n, t in acc.items()}
        self.residuals.sent_all(peer)
        self.link_log[peer] = (numel(acc), threshold)
        return payload

    def send_selected(self, peer: str, acc: Tensors, chosen: dict[str, tuple[torch.Tensor, torch.Tensor]],
                      threshold: Optional[float]) -> Tensors:
        """Encode `chosen` entries of the link's residual; dense when that is fewer bytes."""
        kept = sum(len(i) for i, _ in chosen.values())
        if sparse_costs_more(kept, numel(acc)):
            return self.send_dense(peer, acc, threshold)
        payload = sparse.encode(chosen)
        self.residuals.sent(peer, {n: i for n, (i, _) in chosen.items()})
        self.link_log[peer] = (kept, threshold)
        return payload


def select_by_mask(acc: Tensors, keep: Callable[[str, torch.Tensor], torch.Tensor]
                   ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (idx, values)} of the entries where keep(name, tensor) is True."""
    out = {}
    for n, t in acc.items():
        flat = t.reshape(-1)
        idx = torch.nonzero(keep(n, t).reshape(-1)).reshape(-1)
        if len(idx):
            out[n] = (idx.to(torch.int32), flat[idx].clone())
    return out


def apply_payload(params: Tensors, payload: Tensors, scale: float) -> None:
    """W <- W - scale * g for a payload in any sparse.py encoding (absent entries: 0)."""
    entries, dense = sparse.decode(payload)
    with torch.no_grad():
        for n, g in dense.items():
            params[n].sub_(g.to(params[n].device, params[n].dtype), alpha=scale)
        for n, (idx, val) in entries.items():
            p = params[n]
            flat = p.view(-1)
            flat.index_add_(0, idx.to(p.device), val.to(p.device, p.dtype), alpha=-scale)
