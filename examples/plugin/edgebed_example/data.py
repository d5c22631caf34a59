"""A generated dataset: an edgebed dataset is a function (arg, *, seed, test_size) returning an
edgebed Dataset or (train_x, train_y, test_x, test_y) arrays (images N,C,H,W or N,H,W, labels
0..K-1). `stripes` or `stripes:N` (N training samples)."""

from __future__ import annotations

import numpy as np


def stripes(arg: str | None = None, *, seed: int = 0, test_size: int | None = None):
    """4 classes of 1x12x12 noisy stripes (horizontal, vertical, two diagonals); stripes:N for N train samples (default 2,000)"""  # noqa: E501  (one line: `edgebed datasets` shows it)
    rng = np.random.default_rng(seed)
    n_train, n_test = int(arg or 2000), test_size or 400
    yy, xx = np.mgrid[0:12, 0:12]
    patterns = np.stack([np.sin(yy), np.sin(xx), np.sin(xx + yy), np.sin(xx - yy)]).astype(np.float32)

    def draw(n: int):
        y = rng.integers(0, 4, n)
        x = patterns[y] + rng.normal(0, 0.8, (n, 12, 12)).astype(np.float32)
        return x, y

    return (*draw(n_train), *draw(n_test))
