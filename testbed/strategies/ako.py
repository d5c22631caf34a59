"""Ako (Watcharapichat et al., SoCC'16), DLion's second baseline (dlion.txt Sec. 4, NOTES.md).

Decentralized and asynchronous: the model's flattened gradient is cut into P equal
partitions; at every step each worker adds its gradient to its accumulator and sends
partition (step mod P) of it to every peer, then clears that partition. Every entry thus
travels once per P steps, carrying everything accumulated since. P is set by the slowest
link: the smallest P such that one partition (4 bytes an entry, a contiguous slice) to each
peer behind that rate fits `link_share` * rate * (this worker's smoothed compute time per
step) -- peers at the same slowest rate are taken to share it (a site's WAN link). P is
re-chosen every `resize_every` steps as the compute time settles (what a partition change
leaves unsent stays accumulated); unshaped links give P = 1. `partitions` fixes P instead.
Workers apply whatever partitions have arrived (each 1/k) and never wait, except that edgebed
bounds how far a worker may run ahead of a peer (`max_lead` steps) so queues stay finite.
"""

from __future__ import annotations

import math
from typing import Optional

from pydantic import Field

from testbed.strategies import sparse
from testbed.strategies.base import StrategyParams, Tensors
from testbed.strategies.peer import PeerContext, PeerInfo, PeerStrategy, numel


class AkoParams(StrategyParams):
    partitions: Optional[int] = Field(None, ge=1, description="P (default: from the slowest link)")
    link_share: float = Field(1.0, gt=0, le=1, description="share of the slowest link a partition may use")
    max_lead: Optional[int] = Field(50, ge=0, description="steps a worker may run ahead of a peer")
    resize_every: int = Field(10, ge=1, description="steps between choices of P (when not fixed)")


def partition_bounds(total: int, parts: int, p: int) -> tuple[int, int]:
    """[lo, hi) of partition p of `total` flat entries cut into `parts` near-equal runs."""
    return total * p // parts, total * (p + 1) // parts


class Ako(PeerStrategy):
    name = "ako"
    summary = "decentralized baseline: each step, partition (step mod P) of accumulated gradients to all peers"
    paper = "DLion Sec. 4 baseline (Ako, SoCC'16: partial gradient accumulation)"
    Params = AkoParams

    def __init__(self, params=None):
        super().__init__(params)
        self.parts: Optional[int] = self.params.partitions

    def choose_partitions(self, total_entries: int, ctx: PeerContext) -> int:
        rates = [p.rate_bps for p in ctx.peers.values() if p.rate_bps is not None]
        if not rates or ctx.compute_seconds <= 0:
            return 1
        slowest = min(rates)
        sharing = sum(1 for r in rates if r == slowest)
        per_step = self.params.link_share * slowest / 8 * ctx.compute_seconds / sharing
        return max(1, math.ceil(total_entries * 4 / per_step))

    def outgoing(self, grads: Tensors, ctx: PeerContext) -> dict[str, Tensors]:
        acc = self.residuals.add("*", grads)  # one accumulator: every peer gets the same partition
        total = numel(acc)
        if self.params.partitions is None and ctx.compute_seconds > 0 and \
                (self.parts is None or ctx.step % self.params.resize_every == 0):
            self.parts = self.choose_partitions(total, ctx)
        parts = self.parts or 1
        lo, hi = partition_bounds(total, parts, (ctx.step - 1) % parts)
        slices, start = {}, 0
        for n, t in acc.items():
            a, b = max(lo, start), min(hi, start + t.numel())
            if a < b:
                flat = t.view(-1)
                slices[n] = (a - start, flat[a - start:b - start].clone())
                flat[a - start:b - start] = 0.0
            start += t.numel()
        payload = sparse.encode_slices(slices)
        self.link_log = {p: (hi - lo, None) for p in ctx.peers}
        return {p: payload for p in ctx.peers}

    def wait_bound(self, peer: PeerInfo) -> Optional[int]:
        return self.params.max_lead
