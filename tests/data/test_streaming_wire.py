"""Tests for testbed.data.streaming.sample_wire: one sample as a Kafka (key, value) record."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from testbed.data.streaming.sample_wire import (
    MAGIC,
    decode_batch,
    decode_sample,
    encode_sample,
    header_size,
    sample_overhead,
)

SHAPES = {
    "mnist-hw": (28, 28),
    "mnist-chw": (1, 28, 28),
    "cifar-chw": (3, 32, 32),
    "cifar-hwc": (32, 32, 3),
}


def _array(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
@pytest.mark.parametrize("shape_name", list(SHAPES))
@pytest.mark.parametrize("label", [0, 7, 99])
def test_round_trip(dtype, shape_name, label):
    x = _array(SHAPES[shape_name], dtype)
    key, value = encode_sample(x, label)
    assert key == str(label).encode()
    assert value.startswith(MAGIC)
    assert len(value) == x.nbytes + 6 + 2 * x.ndim
    y, lab = decode_sample(key, value)
    assert lab == label and isinstance(lab, int)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert np.array_equal(y, x)
    assert y.flags.writeable and y.flags.c_contiguous and y.flags.aligned


def test_overhead_bytes():
    assert header_size(3) == 12 and header_size(2) == 10
    x = np.zeros((3, 32, 32), np.uint8)
    key, value = encode_sample(x, 3)
    assert len(key) + len(value) - x.nbytes == 13 == sample_overhead(x.shape, 3)
    assert len(value) == 3084
    assert sample_overhead((1, 28, 28), 42) == 14
    # the exact header of a CIFAR float32 image
    _, value = encode_sample(np.zeros((3, 32, 32), np.float32), 1)
    assert value[:12] == b"EBS1" + bytes([10, 3]) + struct.pack("<3H", 3, 32, 32)
    assert len(value) == 12 + 12288


def test_layout_and_byte_order_are_normalized():
    x = _array((3, 32, 32), np.float32)
    big = x.astype(">f4")
    _, v_big = encode_sample(big, 1)
    _, v = encode_sample(x, 1)
    assert v_big == v
    y, _ = decode_sample(b"1", v_big)
    assert y.dtype == np.dtype("<f4") and np.array_equal(y, x)
    hwc = _array((32, 32, 3), np.uint8)
    chw = hwc.transpose(2, 0, 1)  # not C-contiguous
    y, _ = decode_sample(*encode_sample(chw, 5))
    assert y.shape == (3, 32, 32) and np.array_equal(y, chw)
    # bytearray / memoryview values, numpy integer labels
    key, value = encode_sample(x, np.int64(4))
    y, lab = decode_sample(bytearray(key), memoryview(value))
    assert lab == 4 and np.array_equal(y, x)


def test_other_dtypes_and_scalar():
    for dt in [np.int8, np.int16, np.uint16, np.int32, np.int64, np.float16, np.float64, np.bool_]:
        x = (np.arange(12) % 3).astype(dt).reshape(3, 4)
        y, _ = decode_sample(*encode_sample(x, 2))
        assert y.dtype == x.dtype and np.array_equal(y, x)
    y, lab = decode_sample(*encode_sample(np.array(2.5, np.float32), 0))
    assert y.shape == () and y == 2.5 and lab == 0


def test_decode_batch_stacks():
    xs = [_array((3, 32, 32), np.uint8, seed=i) for i in range(5)]
    recs = [encode_sample(x, i % 10) for i, x in enumerate(xs)]
    x, labels = decode_batch(recs)
    assert x.shape == (5, 3, 32, 32) and x.dtype == np.uint8
    assert np.array_equal(x, np.stack(xs))
    assert labels.dtype == np.int64 and labels.tolist() == [0, 1, 2, 3, 4]
    x1, l1 = decode_batch(iter(recs[:1]))
    assert x1.shape == (1, 3, 32, 32) and l1.tolist() == [0]


def test_decode_batch_errors():
    a = encode_sample(np.zeros((3, 32, 32), np.uint8), 1)
    b = encode_sample(np.zeros((1, 28, 28), np.uint8), 1)
    c = encode_sample(np.zeros((3, 32, 32), np.float32), 1)
    with pytest.raises(ValueError, match="empty batch"):
        decode_batch([])
    with pytest.raises(ValueError, match="record 2: .*differs from record 0"):
        decode_batch([a, a, b])
    with pytest.raises(ValueError, match="record 1: .*differs"):
        decode_batch([a, c])
    with pytest.raises(ValueError, match="record 1: sample value does not start"):
        decode_batch([a, (b"1", b"XXXX" + a[1][4:])])
    with pytest.raises(ValueError, match="record 0: sample key"):
        decode_batch([(b"x", a[1])])
    with pytest.raises(ValueError, match="record 0: expected a \\(key, value\\) pair"):
        decode_batch([b"just-bytes"])


GOOD_KEY, GOOD_VALUE = encode_sample(np.zeros((1, 28, 28), np.float32), 3)


@pytest.mark.parametrize(
    "key, value, message",
    [
        (GOOD_KEY, b"EBS2" + GOOD_VALUE[4:], "does not start with"),
        (GOOD_KEY, b"EB", "too short"),
        (GOOD_KEY, b"", "too short"),
        (GOOD_KEY, GOOD_VALUE[:9], "truncated in its header"),
        (GOOD_KEY, GOOD_VALUE[:-1], "data bytes"),
        (GOOD_KEY, GOOD_VALUE + b"\0", "data bytes"),
        (GOOD_KEY, GOOD_VALUE[:4] + bytes([0]) + GOOD_VALUE[5:], "unknown dtype code 0"),
        (GOOD_KEY, GOOD_VALUE[:4] + bytes([99]) + GOOD_VALUE[5:], "unknown dtype code 99"),
        (GOOD_KEY, GOOD_VALUE[:5] + bytes([9]) + GOOD_VALUE[6:], "ndim 9"),
        (GOOD_KEY, None, "value missing"),
        (GOOD_KEY, "EBS1", "must be bytes"),
        (None, GOOD_VALUE, "key missing"),
        (b"", GOOD_VALUE, "ASCII digits"),
        (b"-1", GOOD_VALUE, "ASCII digits"),
        (b"3a", GOOD_VALUE, "ASCII digits"),
        (b"1234567890", GOOD_VALUE, "ASCII digits"),
        ("3", GOOD_VALUE, "must be bytes"),
    ],
)
def test_decode_malformed(key, value, message):
    with pytest.raises(ValueError, match=message) as ei:
        decode_sample(key, value)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize(
    "x, label, message",
    [
        (np.zeros(3, np.float32), -1, "label must be an integer"),
        (np.zeros(3, np.float32), True, "label must be an integer"),
        (np.zeros(3, np.float32), 1.0, "label must be an integer"),
        (np.zeros(3, np.float32), 10**9, "label must be an integer"),
        (np.zeros(3, np.complex64), 1, "cannot travel"),
        (np.array(["a"], dtype=object), 1, "cannot travel"),
        (np.zeros((1,) * 9, np.uint8), 1, "at most 8 dimensions"),
        (np.zeros((70000,), np.uint8), 1, "<= 65535"),
        ([1, 2, 3], 1, "numpy array"),
    ],
)
def test_encode_errors(x, label, message):
    with pytest.raises(ValueError, match=message):
        encode_sample(x, label)
