"""Wire format: a small JSON header frame plus one raw buffer frame per tensor. No pickle.

    frame 0   b"EB1" + JSON {"kind", "tensors": [{"name", "dtype", "shape"}...], ...}
    frame 1.. the tensors' bytes, C-contiguous, native little-endian

Receivers rebuild tensors with `torch.frombuffer` over one copy of each frame. The header is
read with node.untrusted's strict loader (no NaN/Infinity, int64 at most, bounded depth); a meta
float that is not a number is sent as null.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from testbed.errors import MessageRefused
from testbed.node import untrusted

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


class WireError(MessageRefused):
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
    return [MAGIC + untrusted.dumps(header, separators=(",", ":")).encode()] + bufs


def decode(frames: Sequence[Any]) -> Message:
    """Frames may be bytes or zmq.Frame objects. Anything that is not a well-formed message
    raises WireError, and nothing else: a receiver drops it and goes on."""
    if not frames:
        raise WireError("empty message")
    raw = [f.buffer if hasattr(f, "buffer") else f for f in frames]
    header = _header(bytes(raw[0]))
    specs = header["tensors"]
    if len(specs) != len(raw) - 1:
        raise WireError(f"header names {len(specs)} tensors but {len(raw) - 1} buffers arrived")
    tensors: dict[str, torch.Tensor] = {}
    for spec, buf in zip(specs, raw[1:]):
        name, dtype, shape = _spec(spec)
        if name in tensors:
            raise WireError(f"tensor {name[:40]!r} twice")
        tensors[name] = _tensor(name, dtype, shape, buf)
    return Message(kind=header["kind"], tensors=tensors, meta=header["meta"])


MAX_HEADER = 1 << 20  # a header lists names, dtypes and shapes: kilobytes


def _header(head: bytes) -> dict:
    if not head.startswith(MAGIC):
        raise WireError("not an edgebed message (bad magic)")
    if len(head) > MAX_HEADER:
        raise WireError(f"header of {len(head)} bytes")
    try:  # no NaN or Infinity, no int beyond int64, nothing nested deeper than a header needs
        header = untrusted.loads(head[len(MAGIC):], max_bytes=MAX_HEADER)
    except untrusted.Refused as e:
        raise WireError(f"bad header: {e.reason}") from None
    if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
        raise WireError("bad header: no kind")
    header.setdefault("tensors", [])
    header.setdefault("meta", {})
    if not isinstance(header["tensors"], list) or not isinstance(header["meta"], dict):
        raise WireError("bad header: tensors must be a list, meta a mapping")
    return header


def _spec(spec: Any) -> tuple[str, torch.dtype, tuple[int, ...]]:
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("shape"), list):
        raise WireError("bad tensor spec")
    dtype = _DTYPES.get(spec.get("dtype")) if isinstance(spec.get("dtype"), str) else None
    if dtype is None:
        raise WireError(f"tensor {spec['name'][:40]!r}: unknown dtype {str(spec.get('dtype'))[:20]}")
    shape = spec["shape"]
    if len(shape) > 8 or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40 for s in shape):
        raise WireError(f"tensor {spec['name'][:40]!r}: bad shape")
    return spec["name"], dtype, tuple(shape)


def _tensor(name: str, dtype: torch.dtype, shape: tuple[int, ...], buf: Any) -> torch.Tensor:
    numel = 1
    for s in shape:
        numel *= s
    size = len(memoryview(buf))
    if size != numel * torch.empty((), dtype=dtype).element_size():
        raise WireError(f"tensor {name[:40]!r}: {size} bytes for shape {list(shape)} {_NAMES[dtype]}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if dtype == torch.bfloat16:
        return torch.frombuffer(bytearray(buf), dtype=torch.int16).view(torch.bfloat16).reshape(shape)
    # frombuffer warns on read-only buffers; a copy keeps tensors writable and
    # independent of the frame (the PS mutates what it receives).
    return torch.frombuffer(bytearray(buf), dtype=dtype).reshape(shape)


def message_bytes(frames: Sequence[Any]) -> int:
    """Bytes a message occupies on the wire (payload, before TCP/IP framing)."""
    total = 0
    for f in frames:
        b = f.buffer if hasattr(f, "buffer") else f
        total += len(memoryview(b))
    return total
