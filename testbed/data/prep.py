"""Array preparation shared by the dataset loaders: per-channel normalization, training-split
statistics, and a seeded stratified train/test split."""

from __future__ import annotations

import numpy as np

from testbed.data.formats import DatasetError


def normalize(x: np.ndarray, mean: tuple[float, ...] | np.ndarray,
               std: tuple[float, ...] | np.ndarray, scale: float) -> np.ndarray:
    """float32 ``(x / scale - mean) / std`` per channel of an N,C,H,W array."""
    mean_a = np.asarray(mean, dtype=np.float64).reshape(1, -1, 1, 1)
    std_a = np.asarray(std, dtype=np.float64).reshape(1, -1, 1, 1)
    # One float32 copy, then two in-place passes: no float64 temporaries even for
    # CIFAR-10's 150M values.
    out = x.astype(np.float32)
    out *= (1.0 / (scale * std_a)).astype(np.float32)
    out -= (mean_a / std_a).astype(np.float32)
    return out


def train_stats(x: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of ``x / scale`` over an N,C,H,W array."""
    if x.dtype == np.uint8:
        # Exact and cheap from a 256-bin histogram per channel.
        values = np.arange(256, dtype=np.float64) / scale
        hist = np.stack([np.bincount(x[:, c].ravel(), minlength=256) for c in range(x.shape[1])])
        n = hist.sum(axis=1)
        mean = hist @ values / n
        var = hist @ values**2 / n - mean**2
    else:
        mean = x.mean(axis=(0, 2, 3), dtype=np.float64) / scale
        var = x.var(axis=(0, 2, 3), dtype=np.float64) / scale**2
    std = np.sqrt(np.maximum(var, 0.0))
    return mean, np.where(std > 0, std, 1.0)


def stratified_split(y: np.ndarray, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split; returns (train_idx, test_idx), each in shuffled order.

    Per-class test counts are proportional to class sizes (largest remainder), so
    500-per-class MNIST-5k with test_size=1000 gives exactly 100 per class.
    """
    n = len(y)
    if not 0 < test_size < n:
        raise DatasetError(f"test_size must be between 1 and {n - 1}, got {test_size}")
    classes, counts = np.unique(y, return_counts=True)
    quota = counts * test_size / n
    take = np.floor(quota).astype(np.int64)
    extra = test_size - int(take.sum())
    # Stable sort so ties go to the lower class id: deterministic regardless of seed.
    order = np.argsort(-(quota - take), kind="stable")
    take[order[:extra]] += 1
    rng = np.random.default_rng(seed)
    test_parts, train_parts = [], []
    for c, k in zip(classes, take):
        idx = rng.permutation(np.flatnonzero(y == c))
        test_parts.append(idx[:k])
        train_parts.append(idx[k:])
    # Source files are often class-sorted; shuffle so slicing never yields one class.
    train = rng.permutation(np.concatenate(train_parts))
    test = rng.permutation(np.concatenate(test_parts))
    return train, test
