"""One training sample as a Kafka record: key = label, value = tiny header + raw array bytes.

    key    the label as ASCII decimal digits (b"7"), as in the ScaDLES producer (key = label)
    value  b"EBS1"            4 bytes  magic
           dtype code         uint8
           ndim               uint8    0..MAX_NDIM
           shape              uint16 little-endian, ndim of them
           data               the array, C order, little-endian, prod(shape) * itemsize bytes

Overhead per sample: 6 + 2*ndim header bytes in the value (12 for a CHW image such as CIFAR's
3x32x32 or MNIST's 1x28x28, 10 for a 28x28 image) plus the key's 1-3 digits, e.g. 13 bytes on a
3,072-byte uint8 CIFAR image (0.4%) or a 12,288-byte float32 one (0.1%). No pickle: decoding
never runs code, and malformed input raises ValueError.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

MAGIC = b"EBS1"
MAX_NDIM = 8
MAX_LABEL_DIGITS = 9
_FIXED = struct.Struct("<4sBB")  # magic, dtype code, ndim

# code -> little-endian numpy dtype. Codes are part of the wire format: never renumber.
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("u1"),
    2: np.dtype("i1"),
    3: np.dtype("<u2"),
    4: np.dtype("<i2"),
    5: np.dtype("<u4"),
    6: np.dtype("<i4"),
    7: np.dtype("<u8"),
    8: np.dtype("<i8"),
    9: np.dtype("<f2"),
    10: np.dtype("<f4"),
    11: np.dtype("<f8"),
    12: np.dtype("?"),
}
_CODE_OF: dict[tuple[str, int], int] = {(dt.kind, dt.itemsize): code for code, dt in DTYPE_CODES.items()}


def header_size(ndim: int) -> int:
    """Bytes of a value's header for an ndim-dimensional sample: 6 + 2*ndim."""
    return _FIXED.size + 2 * ndim


def sample_overhead(shape: tuple[int, ...], label: int = 0) -> int:
    """Wire bytes beyond the raw array: the value's header plus the key (label digits)."""
    return header_size(len(shape)) + len(str(int(label)))


def _encode_label(label: object) -> bytes:
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
        raise ValueError(f"label must be an integer >= 0, got {label!r}")
    n = int(label)
    if n < 0 or n >= 10**MAX_LABEL_DIGITS:
        raise ValueError(f"label must be an integer in [0, {10**MAX_LABEL_DIGITS}), got {n}")
    return str(n).encode("ascii")


def encode_sample(x: np.ndarray, label: int) -> tuple[bytes, bytes]:
    """(key, value) of one sample. Any byte order or memory layout in, little-endian C order out."""
    if not isinstance(x, np.ndarray):
        raise ValueError(f"sample must be a numpy array, got {type(x).__name__}")
    key = _encode_label(label)
    code = _CODE_OF.get((x.dtype.kind, x.dtype.itemsize))
    if code is None:
        raise ValueError(f"sample dtype {x.dtype} cannot travel "
                         f"(supported: {', '.join(str(d) for d in DTYPE_CODES.values())})")
    if x.ndim > MAX_NDIM:
        raise ValueError(f"sample must have at most {MAX_NDIM} dimensions, got {x.ndim}")
    if any(d > 0xFFFF for d in x.shape):
        raise ValueError(f"sample dimensions must be <= 65535 each, got shape {x.shape}")
    wire = np.ascontiguousarray(x, dtype=DTYPE_CODES[code])
    head = _FIXED.pack(MAGIC, code, x.ndim) + struct.pack(f"<{x.ndim}H", *x.shape)
    return key, head + wire.tobytes()


def _decode_key(key: object) -> int:
    if key is None:
        raise ValueError("sample key missing: expected the label as ASCII digits")
    try:
        k = bytes(key)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"sample key must be bytes, got {type(key).__name__}") from None
    if not k or len(k) > MAX_LABEL_DIGITS or not k.isdigit():
        raise ValueError(f"sample key must be 1-{MAX_LABEL_DIGITS} ASCII digits (the label), got {k[:20]!r}")
    return int(k)


def _parse_header(value: object) -> tuple[np.dtype, tuple[int, ...], memoryview]:
    """dtype, shape and the data bytes of a value; ValueError when malformed."""
    if value is None:
        raise ValueError("sample value missing")
    try:
        mv = memoryview(value).cast("B")  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"sample value must be bytes, got {type(value).__name__}") from None
    if len(mv) < _FIXED.size:
        raise ValueError(f"sample value too short: {len(mv)} bytes, the header alone is at least {_FIXED.size}")
    magic, code, ndim = _FIXED.unpack_from(mv)
    if magic != MAGIC:
        raise ValueError(f"sample value does not start with {MAGIC!r} (got {bytes(magic)!r})")
    dtype = DTYPE_CODES.get(code)
    if dtype is None:
        raise ValueError(f"sample value has unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise ValueError(f"sample value has ndim {ndim} > {MAX_NDIM}")
    hs = header_size(ndim)
    if len(mv) < hs:
        raise ValueError(f"sample value truncated in its header: {len(mv)} bytes, need {hs}")
    shape = struct.unpack_from(f"<{ndim}H", mv, _FIXED.size)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(mv) - hs != expected:
        raise ValueError(
            f"sample value has {len(mv) - hs} data bytes, shape {shape} of {dtype} needs {expected}"
        )
    return dtype, shape, mv[hs:]


def decode_sample(key: bytes, value: bytes) -> tuple[np.ndarray, int]:
    """(array, label) from a record. The array is a fresh, writable, aligned copy."""
    label = _decode_key(key)
    dtype, shape, data = _parse_header(value)
    x = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
    return x, label


def decode_batch(records: Iterable[tuple[bytes, bytes]]) -> tuple[np.ndarray, np.ndarray]:
    """Stack records into (x of shape (N, *sample_shape), labels int64 of shape (N,)).

    All samples must have the first one's dtype and shape; an empty batch is an error (its
    shape would be unknown). Errors name the record's index.
    """
    recs = list(records)
    if not recs:
        raise ValueError("empty batch: nothing to decode")
    labels = np.empty(len(recs), dtype=np.int64)
    out: np.ndarray | None = None
    first: tuple[np.dtype, tuple[int, ...]] | None = None
    for i, rec in enumerate(recs):
        try:
            key, value = rec
        except (TypeError, ValueError):
            raise ValueError(f"record {i}: expected a (key, value) pair") from None
        try:
            labels[i] = _decode_key(key)
            dtype, shape, data = _parse_header(value)
        except ValueError as e:
            raise ValueError(f"record {i}: {e}") from None
        if first is None:
            first = (dtype, shape)
            out = np.empty((len(recs), *shape), dtype=dtype)
        elif (dtype, shape) != first:
            raise ValueError(f"record {i}: {dtype}{list(shape)} differs from record 0's {first[0]}{list(first[1])}")
        assert out is not None
        out[i] = np.frombuffer(data, dtype=dtype).reshape(shape)
    assert out is not None
    return out, labels
