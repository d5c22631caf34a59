"""DLion (Hong et al., dlion.txt, HotCloud'19): decentralized training across micro-clouds.

No parameter server: every worker keeps a replica and exchanges with its peers directly.

Compute-capacity-aware batching (Sec. 3.1, Eq. 5): worker j gets the mini-batch
m_j = T_bs' * C_j / sum_k C_k, so its compute time T_j = m_j / C_j is the same unit time
T_unit = T_bs' / sum C for every worker, and sum m_j <= T_bs. C_j (samples per compute
second) is profiled online, smoothed, and gossiped with every message; until every peer's
capacity is known the batch is split equally. The update is Eq. 5 as written,
W <- W - eta * (1/k) sum_j mean-gradient_j (`weighting: batch` weights by m_j / sum m instead).

Adaptive tuning (Sec. 3.1; the paper's best combination is the default): WarmUpLR raises the
lr linearly from eta to eta*k over the first `warmup_epochs`; SpeedUpBS trains at
`initial_batch_fraction` of T_bs until `speedup_epoch`, then at T_bs; IncreaseBS grows it
linearly to T_bs by `speedup_epoch`; DecayLR multiplies the lr by `decay_factor` from
`decay_epoch` on. The total never exceeds T_bs.

Network-aware partial gradient exchange (Sec. 3.2): each link carries, per step, the largest
entries of that link's accumulated gradient that fit its byte budget,
budget = `link_share` * rate * T_unit (8 bytes an entry), at least `min_fraction` of the
entries. The smallest |entry| sent is the link's contribution threshold: it rises as the
link gets slower, so WAN links (100 Mbit/s) carry fewer, larger entries than LAN links
(1 Gbit/s). What a link does not carry stays in its residual. Unshaped links, and links
whose budget holds half the entries or more (as index + value pairs they would cost more
bytes than the dense tensor), carry everything, dense.

Weight exchange (Sec. 3.2, Fig. 4-5): early in training (epoch < `we_until_epoch`), every
`we_period` steps, the worker with the lowest smoothed loss sends its full weights,
asynchronously, to the worker with the highest; the receiver averages them into its
replica (`we_merge: replace` takes them instead).

edgebed's choices where the paper is silent (dlion.txt leaves them open, NOTES.md):
C_j is profiled online rather than before training; the gradient exchange is synchronous per
step (Eq. 5 sums every worker's gradient of step t); the contribution metric is |g| of the
accumulated gradient; the schedule's epochs and factors are the parameters below. The
sender/receiver subset scheme (Sec. 3.3) is design-only in the paper and is not implemented.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from pydantic import Field

from testbed.strategies.base import StrategyParams, Tensors
from testbed.strategies.peer import PeerContext, PeerInfo, PeerStrategy, numel, sparse_costs_more
from testbed.strategies.sparse import top_k_whole

Tuning = Literal["warmup_lr", "speedup_bs", "increase_bs", "decay_lr"]


class DLionParams(StrategyParams):
    total_batch: int = Field(640, ge=1, description="T_bs: the most samples per step over all workers")
    min_batch: int = Field(8, ge=1, description="smallest batch a worker is given")
    capacity_aware: bool = Field(True, description="m_j proportional to C_j (False: T_bs / k each)")
    weighting: Literal["equal", "batch"] = Field("equal", description="Eq. 5's 1/k, or m_j / sum m")
    tuning: list[Tuning] = Field(["warmup_lr", "speedup_bs", "decay_lr"], description="adaptive tuning")
    warmup_epochs: float = Field(0.5, ge=0, description="WarmUpLR: lr from eta to eta*k over these epochs")
    warmup_to: Optional[float] = Field(None, gt=0, description="WarmUpLR's final lr (default eta*k)")
    initial_batch_fraction: float = Field(0.5, gt=0, le=1,
                                          description="SpeedUpBS/IncreaseBS start at this share of T_bs")
    speedup_epoch: float = Field(1.0, ge=0, description="SpeedUpBS: T_bs from here (IncreaseBS: reached here)")
    decay_epoch: float = Field(5.0, ge=0, description="DecayLR: from this epoch on")
    decay_factor: float = Field(0.1, gt=0, le=1, description="DecayLR: lr multiplier")
    link_share: float = Field(0.5, gt=0, le=1, description="share of a link's rate per unit time for gradients")
    min_fraction: float = Field(0.001, gt=0, le=1, description="fewest entries a link carries per step")
    max_lead: Optional[int] = Field(0, ge=0, description="steps a worker may run ahead of a peer (0: synchronous)")
    we_period: int = Field(10, ge=1, description="steps between weight exchanges")
    we_until_epoch: float = Field(2.0, ge=0, description="weight exchange only before this epoch (early WE)")
    we_merge: Literal["average", "replace"] = Field("average", description="how received weights enter")


class DLion(PeerStrategy):
    name = "dlion"
    summary = "decentralized: capacity-aware batches, per-link partial gradients, weights to the worst worker"
    paper = "DLion Sec. 3.1 (Eq. 5, adaptive tuning) and 3.2 (network-aware exchange)"
    Params = DLionParams

    # -- compute-capacity-aware batching (Eq. 5) -------------------------------------------
    def total_batch(self, ctx: PeerContext) -> int:
        p = self.params
        t = p.total_batch
        if "speedup_bs" in p.tuning and ctx.epoch < p.speedup_epoch:
            t = p.total_batch * p.initial_batch_fraction
        elif "increase_bs" in p.tuning and ctx.epoch < p.speedup_epoch:
            f = p.initial_batch_fraction + (1 - p.initial_batch_fraction) * ctx.epoch / max(p.speedup_epoch, 1e-9)
            t = p.total_batch * f
        return max(1, int(t))

    def batch_size(self, ctx: PeerContext) -> int:
        t = self.total_batch(ctx)
        k = ctx.n_workers
        caps = ctx.capacities
        everyone = [ctx.worker, *ctx.peers]
        if not self.params.capacity_aware or any(caps.get(w, 0) <= 0 for w in everyone):
            return max(self.params.min_batch, t // k)
        share = caps[ctx.worker] / sum(caps[w] for w in everyone)
        # floor keeps sum m_j <= T_bs; min_batch may lift a very slow worker above its share
        return max(self.params.min_batch, math.floor(t * share))

    def unit_time(self, ctx: PeerContext) -> float:
        """T_unit = m_j / C_j, the common compute time per step (this worker's measured one
        until every capacity is known)."""
        caps = ctx.capacities
        everyone = [ctx.worker, *ctx.peers]
        if all(caps.get(w, 0) > 0 for w in everyone):
            return self.total_batch(ctx) / sum(caps[w] for w in everyone)
        return ctx.compute_seconds

    # -- adaptive tuning -------------------------------------------------------------------
    def learning_rate(self, ctx: PeerContext) -> float:
        p = self.params
        lr = ctx.lr
        if "warmup_lr" in p.tuning:
            top = p.warmup_to if p.warmup_to is not None else ctx.lr * ctx.n_workers
            frac = 1.0 if p.warmup_epochs == 0 else min(1.0, ctx.epoch / p.warmup_epochs)
            lr = ctx.lr + (top - ctx.lr) * frac
        if "decay_lr" in p.tuning and ctx.epoch >= p.decay_epoch:
            lr *= p.decay_factor
        return lr

    def weight(self, meta: dict, ctx: PeerContext) -> float:
        if self.params.weighting == "equal":
            return 1.0 / ctx.n_workers
        sizes = ctx.batch_sizes
        total = sum(sizes.get(w, ctx.base_batch) for w in [ctx.worker, *ctx.peers])
        return float(meta.get("batch_size", ctx.base_batch)) / total

    # -- network-aware partial gradient exchange ------------------------------------------
    def link_entries(self, peer: PeerInfo, total: int, ctx: PeerContext) -> int:
        """Entries the link to `peer` carries this step: its byte budget over 8 bytes an entry."""
        if peer.rate_bps is None:
            return total
        budget = self.params.link_share * peer.rate_bps / 8 * self.unit_time(ctx)
        return min(total, max(math.ceil(self.params.min_fraction * total), int(budget // 8)))

    def outgoing(self, grads: Tensors, ctx: PeerContext) -> dict[str, Tensors]:
        out = {}
        for name, peer in ctx.peers.items():
            acc = self.residuals.add(name, grads)
            total = numel(acc)
            k = self.link_entries(peer, total, ctx)
            if k >= total or sparse_costs_more(k, total):
                # the whole residual costs no more bytes than its top k would: no top-k to pay for
                # (on a 1 Gbit/s LAN it doubled a 0.2-CPU worker's exchange: 0.18 s a step, not 0.09)
                out[name] = self.send_dense(name, acc)
                continue
            chosen = top_k_whole(acc, k)
            threshold = min(float(v.abs().min()) for _, v in chosen.values())
            out[name] = self.send_selected(name, acc, chosen, threshold)
        return out

    def wait_bound(self, peer: PeerInfo) -> Optional[int]:
        return self.params.max_lead

    # -- weight exchange to the worst worker ----------------------------------------------
    def weights_to(self, ctx: PeerContext) -> list[str]:
        p = self.params
        if ctx.epoch >= p.we_until_epoch or ctx.step % p.we_period:
            return []
        everyone = [ctx.worker, *ctx.peers]
        if any(w not in ctx.losses for w in everyone):
            return []
        best = min(everyone, key=lambda w: (ctx.losses[w], w))
        worst = max(everyone, key=lambda w: (ctx.losses[w], w))
        return [worst] if best == ctx.worker and worst != ctx.worker else []

    def merge_weights(self, params: Tensors, received: Tensors, ctx: PeerContext) -> None:
        if self.params.we_merge == "replace":
            return super().merge_weights(params, received, ctx)
        with torch.no_grad():
            for n, p in params.items():
                if n in received:
                    p.add_(received[n]).mul_(0.5)
