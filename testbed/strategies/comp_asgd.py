"""Comp-ASGD: ASGD with compressed pushes, AdaComp's baseline (Sec. III-B a, Fig. 3).

Each worker sends only the fraction c of its update's entries largest in absolute value,
chosen over the whole model at once (Shokri & Shmatikov's selective SGD, "solely the largest
ones across the whole model"), as indices + values. The PS applies them with the whole
update's staleness: W <- W - (alpha / sigma) * g~ with sigma = i - j (alpha when 0), as ASGD.
No error feedback: dropped entries are lost, as in the paper.

It is ASGD with the `top_c` compressor (compressors.TopC), kept under its own name and
parameters: `{name: comp_asgd, params: {c: 0.01}}` is `{name: asgd, params: {compressor:
{name: top_c, c: 0.01}}}`.
"""

from __future__ import annotations

from pydantic import Field

from testbed.strategies.asgd import ASGD
from testbed.strategies.base import StrategyParams
from testbed.strategies.compressors import TopC, top_c_whole_model

__all__ = ["CompASGD", "CompASGDParams", "top_c_whole_model"]


class CompASGDParams(StrategyParams):
    c: float = Field(0.01, gt=0, le=1, description="fraction of the update's entries sent (largest |g|, whole model)")


class CompASGD(ASGD):
    name = "comp_asgd"
    summary = "ASGD pushing only the fraction c largest |g| of the whole model (indices + values)"
    paper = "AdaComp Sec. III-B (Shokri & Shmatikov's selective SGD)"
    Params = CompASGDParams

    def make_compressor(self) -> TopC:
        return TopC(self.params.c)
