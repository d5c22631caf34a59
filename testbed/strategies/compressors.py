"""Compressors: what a worker's push keeps of its update, apart from the protocol that applies it.

As PyTorch DDP's communication hooks keep a compressor's state (error feedback, iteration count)
in an object of its own, so that one compressor serves several protocols, a `Compressor` is the
worker-side selection plus the server-side decoding, with its own state; a synchronisation model
(ASGD, SSP, BSP) takes one as configuration (`algorithm.params.compressor`), never as a new file
per pair. Comp-ASGD is ASGD + `top_c`; AdaComp's per-layer selection is `adacomp`, usable under
SSP or BSP too:

    algorithm: {name: ssp, params: {staleness: 3, compressor: {name: adacomp, c: 0.01}}}

worker   compress(grads)           -> the payload (indices + values, sparse.py's encoding)
server   decompress(payload, shapes) -> the dense update (zero where nothing was sent)
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Literal, Optional

import torch
from pydantic import Field, model_validator

from testbed.strategies import sparse
from testbed.strategies.base import Compressor, StrategyParams, Tensors

Selection = dict[str, tuple[torch.Tensor, torch.Tensor]]  # {tensor: (flat indices int32, values)}


class CompressorConfig(StrategyParams):
    """A compressor as a strategy's parameter: {name, c, error_feedback}, or just its name."""

    name: Literal["top_c", "adacomp"] = Field(description="top_c: whole model (Comp-ASGD); adacomp: per tensor")
    c: float = Field(0.01, gt=0, le=1, description="fraction of the entries sent (largest |g|)")
    error_feedback: bool = Field(False, description="keep what was not sent and add it to the next update")

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value):
        return {"name": value} if isinstance(value, str) else value


class Compressible(StrategyParams):
    """Parameters of a synchronisation model that takes a compressor (None: dense pushes)."""

    compressor: Optional[CompressorConfig] = Field(None, description="compress each push: {name: top_c | adacomp, c}")


class SparseCompressor(Compressor):
    """A selection of the update's entries sent as indices + values (sparse.py). State that
    belongs to the compression (the residual of error feedback) lives here, not in the protocol."""

    def __init__(self, c: float, error_feedback: bool = False):
        self.c = c
        self.error_feedback = error_feedback
        self.residual: Tensors = {}  # error feedback: what earlier pushes left out

    @abstractmethod
    def select(self, grads: Tensors) -> Selection:
        """The entries of `grads` to send."""

    def compress(self, grads: Tensors) -> Tensors:
        """Worker side: the payload of this step's update (with error feedback, update + residual;
        the entries sent leave the residual)."""
        if not self.error_feedback:
            return sparse.encode(self.select(grads))
        acc = {n: g.detach().to(torch.float32) + self.residual[n] if n in self.residual
               else g.detach().to(torch.float32).clone() for n, g in grads.items()}
        chosen = self.select(acc)
        for n, (idx, _) in chosen.items():
            acc[n].view(-1)[idx.to(torch.int64)] = 0.0
        self.residual = acc
        return sparse.encode(chosen)

    def decompress(self, payload: Tensors, shapes: dict[str, torch.Size], fill_missing: bool = False) -> Tensors:
        """Server side: the dense update (a tensor the push left out: absent, or zeros with fill_missing)."""
        return sparse.densify(payload, shapes, fill_missing=fill_missing)


def top_c_whole_model(grads: Tensors, c: float) -> Selection:
    """The ceil(c * total) largest |entries| over all tensors, split back per tensor."""
    total = sum(g.numel() for g in grads.values())
    return sparse.top_k_whole(grads, sparse.top_k_count(total, c))


def select_grad(grads: Tensors, c: float) -> Selection:
    """AdaComp Alg. 1 SELECT_GRAD: per tensor, the ceil(c * numel) largest |entries|."""
    return {n: sparse.top_k_flat(g, sparse.top_k_count(g.numel(), c)) for n, g in grads.items()}


class TopC(SparseCompressor):
    """The fraction c of the update's entries largest in absolute value, chosen over the whole
    model at once (Shokri & Shmatikov's selective SGD; AdaComp Sec. III-B a, Comp-ASGD)."""

    name = "top_c"

    def select(self, grads: Tensors) -> Selection:
        return top_c_whole_model(grads, self.c)


class PerTensorTopC(SparseCompressor):
    """AdaComp's SELECT_GRAD (Hardy et al. 2017, Alg. 1): the (100 c)% largest |entries| of each
    matrix and vector, so every layer keeps learning."""

    name = "adacomp"

    def select(self, grads: Tensors) -> Selection:
        return select_grad(grads, self.c)


def compression_loss(g: Tensors, kept: Selection) -> float:
    """| |g|^2 - |Topk(g)|^2 | / |g|^2 over the whole update (ScaDLES Sec. IV)."""
    total = sum(float(t.detach().to(torch.float32).pow(2).sum()) for t in g.values())
    top = sum(float(v.pow(2).sum()) for _, v in kept.values())
    return abs(total - top) / total if total > 0 else 0.0


class AdaptiveTopC(TopC):
    """ScaDLES' adaptive Top-k (Tyagi & Sharma, Sec. IV): send Topk(g), the fraction c largest
    entries of the whole update, when | |g|^2 - |Topk(g)|^2 | / |g|^2 <= delta, else the dense g
    (`last_compressed` says which, for steps.csv and the CNC ratio)."""

    name = "adaptive_top_c"

    def __init__(self, c: float, delta: float):
        super().__init__(c)
        self.delta = delta

    def compress(self, grads: Tensors) -> Tensors:
        kept = self.select(grads)
        self.last_compressed = compression_loss(grads, kept) <= self.delta
        return sparse.encode(kept) if self.last_compressed else grads


COMPRESSORS: dict[str, type[SparseCompressor]] = {cls.name: cls for cls in (TopC, PerTensorTopC)}


def make_compressor(config: Optional[CompressorConfig]) -> Optional[Compressor]:
    """The compressor a strategy's `compressor` parameter names, or None (dense pushes)."""
    if config is None:
        return None
    return COMPRESSORS[config.name](config.c, config.error_feedback)


class Compressing:
    """Mixin of a synchronisation model that takes a compressor as configuration (its Params a
    `Compressible`): put it before Strategy in the bases."""

    params: StrategyParams

    def make_compressor(self) -> Optional[Compressor]:
        return make_compressor(getattr(self.params, "compressor", None))
