"""Wire format: a small JSON header frame plus one raw buffer frame per tensor. No pickle.

    frame 0   b"EB1" + JSON {"kind", "tensors": [{"name", "dtype", "shape"}...], ...}
    frame 1.. the tensors' bytes, C-contiguous, native little-endian

Receivers rebuild tensors with `torch.frombuffer` over one copy of each frame.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

MAGIC = b"EB1"

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("edgebed's wire format assumes a little-endian host")


class WireError(ValueError):
    pass


@dataclass
class Message:
    kind: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:  # memoryview.cast() refuses shapes with a zero in them
        return memoryview(b"")
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the same 2-byte words
        t = t.view(torch.int16)
    return memoryview(t.numpy()).cast("B")


def encode(msg: Message) -> list[bytes | memoryview]:
    specs = []
    bufs: list[bytes | memoryview] = []
    for name, t in msg.tensors.items():
        if t.dtype not in _NAMES:
            raise WireError(f"tensor '{name}': dtype {t.dtype} cannot travel")
        specs.append({"name": name, "dtype": _NAMES[t.dtype], "shape": list(t.shape)})
        bufs.append(_tensor_bytes(t))
    header = {"kind": msg.kind, "tensors": specs, "meta": msg.meta}
    return [MAGIC + json.dumps(header, separators=(",", ":")).encode()] + bufs


def decode(frames: Sequence[Any]) -> Message:
    """Frames may be bytes or zmq.Frame objects."""
    if not frames:
        raise WireError("empty message")
    raw = [f.buffer if hasattr(f, "buffer") else f for f in frames]
    head = bytes(raw[0])
    if not head.startswith(MAGIC):
        raise WireError("not an edgebed message (bad magic)")
    try:
        header = json.loads(head[len(MAGIC):])
    except ValueError as e:
        raise WireError(f"bad header: {e}") from None
    specs = header.get("tensors", [])
    if len(specs) != len(raw) - 1:
        raise WireError(f"header names {len(specs)} tensors but {len(raw) - 1} buffers arrived")
    tensors: dict[str, torch.Tensor] = {}
    for spec, buf in zip(specs, raw[1:]):
        dtype = _DTYPES.get(spec["dtype"])
        if dtype is None:
            raise WireError(f"tensor '{spec['name']}': unknown dtype {spec['dtype']}")
        shape = tuple(int(s) for s in spec["shape"])
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(memoryview(buf)) != numel * itemsize:
            raise WireError(f"tensor '{spec['name']}': {len(memoryview(buf))} bytes for shape {list(shape)} {spec['dtype']}")
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        elif dtype == torch.bfloat16:
            t = torch.frombuffer(bytearray(buf), dtype=torch.int16).view(torch.bfloat16).reshape(shape)
        else:
            # frombuffer warns on read-only buffers; a copy keeps tensors writable and
            # independent of the frame (the PS mutates what it receives).
            t = torch.frombuffer(bytearray(buf), dtype=dtype).reshape(shape)
        tensors[spec["name"]] = t
    return Message(kind=header["kind"], tensors=tensors, meta=header.get("meta", {}))


def message_bytes(frames: Sequence[Any]) -> int:
    """Bytes a message occupies on the wire (payload, before TCP/IP framing)."""
    total = 0
    for f in frames:
        b = f.buffer if hasattr(f, "buffer") else f
        total += len(memoryview(b))
    return total
