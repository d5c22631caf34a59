"""Sparse updates on the wire: the kept entries of a tensor as indices + values.

A payload entry `name` that is sparse travels as two tensors, `name@i` (int32 flat indices,
ascending) and `name@v` (float32 values), so its bytes scale with the kept fraction:
8 bytes per kept entry instead of 4 per entry of the dense tensor. A contiguous run of a
tensor's flat entries (Ako's partitions) travels as `name@r` (int64 [start]) + `name@v`:
4 bytes an entry. The receiver knows every tensor's shape from its own parameters.
"""

from __future__ import annotations

import math

import torch

from testbed.strategies.base import Tensors

IDX, VAL, START = "@i", "@v", "@r"


def top_k_count(numel: int, fraction: float) -> int:
    """Entries kept of `numel` at fraction c: ceil(c * numel), at least 1."""
    return max(1, min(numel, math.ceil(fraction * numel)))


def top_k_flat(t: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices ascending, values) of the k largest |entries| of t, flattened."""
    flat = t.detach().reshape(-1)
    idx = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
    return idx.to(torch.int32), flat[idx].to(torch.float32)


def top_k_whole(acc: Tensors, k: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The k largest |entries| over all tensors of `acc`, as {name: (idx int32, values)}."""
    names = list(acc)
    flat = torch.cat([acc[n].detach().reshape(-1).to(torch.float32) for n in names])
    k = max(1, min(k, flat.numel()))
    idx = torch.topk(flat.abs(), k, sorted=False).indices.sort().values
    out, start = {}, 0
    for n in names:
        size = acc[n].numel()
        lo, hi = torch.searchsorted(idx, torch.tensor([start, start + size]))
        mine = idx[lo:hi]
        if len(mine):
            out[n] = ((mine - start).to(torch.int32), flat[mine])
        start += size
    return out


def encode(sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Tensors:
    out: Tensors = {}
    for name, (idx, val) in sparse.items():
        out[name + IDX] = idx
        out[name + VAL] = val
    return out


def encode_slices(slices: dict[str, tuple[int, torch.Tensor]]) -> Tensors:
    """{name: (first flat index, contiguous values)} as `name@r` + `name@v`."""
    out: Tensors = {}
    for name, (start, val) in slices.items():
        out[name + START] = torch.tensor([start], dtype=torch.int64)
        out[name + VAL] = val.to(torch.float32)
    return out


def decode(payload: Tensors) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], Tensors]:
    """(sparse entries {name: (idx int64, val)}, dense entries) of a payload."""
    sparse, dense = {}, {}
    for key, t in payload.items():
        if key.endswith(IDX):
            name = key[: -len(IDX)]
            sparse[name] = (t.to(torch.int64), payload[name + VAL])
        elif key.endswith(START):
            name = key[: -len(START)]
            val = payload[name + VAL]
            start = int(t[0])
            sparse[name] = (torch.arange(start, start + len(val), dtype=torch.int64), val)
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
