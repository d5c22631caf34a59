"""Sparse updates on the wire: the kept entries of a tensor as indices + values.

A payload entry `name` that is sparse travels as two tensors, `name@i` (int32 flat indices,
ascending) and `name@v` (float32 values), so its bytes scale with the kept fraction:
8 bytes per kept entry instead of 4 per entry of the dense tensor. The PS knows every
tensor's shape from its own parameters.
"""

from __future__ import annotations

import math

import torch

from .base import Tensors

IDX, VAL = "@i", "@v"


def top_k_count(numel: int, fraction: float) -> int:
    """Entries kept of `numel` at fraction c: ceil(c * numel), at least 1."""
    return max(1, min(numel, math.ceil(fraction * numel)))


def top_k_flat(t: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices ascending, values) of the k largest |entries| of t, flattened."""
    flat = t.detach().reshape(-1)
    idx = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
    return idx.to(torch.int32), flat[idx].to(torch.float32)


def encode(sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Tensors:
    out: Tensors = {}
    for name, (idx, val) in sparse.items():
        out[name + IDX] = idx
        out[name + VAL] = val
    return out


def decode(payload: Tensors) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], Tensors]:
    """(sparse entries {name: (idx int64, val)}, dense entries) of a payload."""
    sparse, dense = {}, {}
    for key, t in payload.items():
        if key.endswith(IDX):
            name = key[: -len(IDX)]
            sparse[name] = (t.to(torch.int64), payload[name + VAL])
        elif not key.endswith(VAL):
            dense[key] = t
    return sparse, dense


def densify(payload: Tensors, shapes: dict[str, torch.Size], fill_missing: bool = False) -> Tensors:
    """A payload with its sparse entries scattered into zero tensors of the parameters' shapes
    (and, with fill_missing, a zero tensor for each parameter the payload left out)."""
    sparse, dense = decode(payload)
    out = dict(dense)
    if fill_missing:
        for name, shape in shapes.items():
            if name not in dense and name not in sparse:
                out[name] = torch.zeros(shape, dtype=torch.float32)
    for name, (idx, val) in sparse.items():
        flat = torch.zeros(math.prod(shapes[name]), dtype=torch.float32)
        flat[idx] = val.to(torch.float32)
        out[name] = flat.view(shapes[name])
    return out
