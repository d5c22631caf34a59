"""Gaia (Hsieh et al., NSDI'17), DLion's first baseline (dlion.txt Sec. 4, NOTES.md).

Gaia runs a parameter server per micro-cloud: inside a site, workers train synchronously on
full gradients; across the WAN, a site sends only *significant* updates, those whose
accumulated change is large against the parameter's value, |Delta w / w| > `threshold`
(Gaia's default significance is 1%), and the sites run at most `mirror_clock` steps apart
(Gaia's ASP barrier bound).

edgebed runs it without a PS process, as DLion's authors did ("for Gaia, workers exchange
significant partial gradients"): every worker holds its site's model, so sending full
gradients to each LAN peer and applying all of them (each 1/k, synchronously) is what the
site's PS would do; each WAN link keeps its own accumulated update Delta = lr * g / k (the
change this worker's gradients make on the far side) and carries the entries that became
significant, as indices + values, then forgets them. With a single site Gaia is BSP among
peers. `lan: significant` filters LAN links too (the DLion prototype's reading).
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from testbed.strategies.base import StrategyParams, Tensors
from testbed.strategies.peer import PeerContext, PeerInfo, PeerStrategy, select_by_mask


class GaiaParams(StrategyParams):
    threshold: float = Field(0.01, gt=0, description="significance: |accumulated update / weight| above this")
    mirror_clock: int = Field(2, ge=0, description="steps a site may run ahead of another (WAN bound)")
    lan: Literal["full", "significant"] = Field("full", description="what LAN peers exchange")


class Gaia(PeerStrategy):
    name = "gaia"
    summary = "decentralized baseline: full gradients within a site, only significant updates across the WAN"
    paper = "DLion Sec. 4 baseline (Gaia, NSDI'17: significance filter, ASP barrier)"
    Params = GaiaParams

    def _significant(self, peer: PeerInfo) -> bool:
        return not peer.same_site or self.params.lan == "significant"

    def outgoing(self, grads: Tensors, ctx: PeerContext) -> dict[str, Tensors]:
        out = {}
        scale = self.learning_rate(ctx) / ctx.n_workers
        params = ctx.model_params
        thr = self.params.threshold
        for name, peer in ctx.peers.items():
            acc = self.residuals.add(name, grads)
            if not self._significant(peer):
                out[name] = self.send_dense(name, acc, None)
                continue
            chosen = select_by_mask(
                acc, lambda n, t: (t * scale).abs() > thr * params[n].detach().abs().clamp_min(1e-8))
            out[name] = self.send_selected(name, acc, chosen, thr)
        return out

    def wait_bound(self, peer: PeerInfo) -> Optional[int]:
        return 0 if peer.same_site else self.params.mirror_clock
