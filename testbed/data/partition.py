"""Splitting a training set among workers (IID and the usual non-IID schemes).

Specs::

    iid             uniform random split into near-equal shards
    labels:K        each worker holds only K classes (pathological non-IID)
    dirichlet:ALPHA per-class proportions across workers ~ Dir(ALPHA); small ALPHA
                    means strongly skewed label histograms
    seldp           SelSync's data partitioning (selsync.txt Sec. III-B, Fig. 7b): the IID
                    split into N chunks, walked by worker n as a circular queue starting at
                    chunk n, so every worker sees all the data, in a different order
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["PartitionSpec", "parse_partition", "partition_indices", "worker_chunks", "PARTITION_HELP"]

PARTITION_HELP = "iid | labels:K (K classes per worker) | dirichlet:ALPHA (ALPHA > 0) | seldp"

# Dirichlet draws that leave a worker with fewer samples than this are redrawn
# (as in NIID-Bench) a bounded number of times before a deterministic repair.
_DIRICHLET_MIN_SIZE = 10
_DIRICHLET_TRIES = 100


@dataclass(frozen=True)
class PartitionSpec:
    kind: Literal["iid", "labels", "dirichlet", "seldp"]
    k: int | None = None  # labels:K
    alpha: float | None = None  # dirichlet:ALPHA

    def __str__(self) -> str:
        if self.kind == "labels":
            return f"labels:{self.k}"
        if self.kind == "dirichlet":
            return f"dirichlet:{self.alpha:g}"
        return self.kind


def parse_partition(spec: str | PartitionSpec) -> PartitionSpec:
    """Parse a partition spec; raise ValueError with a one-line message if invalid."""
    if isinstance(spec, PartitionSpec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"partition spec must be a string, got {type(spec).__name__}")
    kind, sep, arg = spec.strip().partition(":")
    if kind in ("iid", "seldp"):
        if sep:
            raise ValueError(f"partition {spec!r}: '{kind}' takes no argument")
        return PartitionSpec(kind)  # type: ignore[arg-type]
    if kind == "labels":
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError(f"partition {spec!r}: K must be an integer >= 1")
        return PartitionSpec("labels", k=k)
    if kind == "dirichlet":
        try:
            alpha = float(arg)
        except ValueError:
            alpha = float("nan")
        # 'not alpha > 0' also rejects NaN; inf would make every worker identical to iid
        # in expectation but Dir(inf) cannot be sampled.
        if not (alpha > 0 and np.isfinite(alpha)):
            raise ValueError(f"partition {spec!r}: ALPHA must be a finite number > 0")
        return PartitionSpec("dirichlet", alpha=alpha)
    raise ValueError(f"unknown partition {spec!r}; expected {PARTITION_HELP}")


def partition_indices(labels: np.ndarray, n_workers: int, spec: str | PartitionSpec,
                      seed: int) -> list[np.ndarray]:
    """Split ``range(len(labels))`` into ``n_workers`` disjoint, non-empty index arrays.

    Deterministic for a given seed. Each returned array is sorted int64. ``iid`` and
    ``dirichlet`` cover every index; ``labels:K`` leaves out classes no worker holds
    (only when ``n_workers * K < num_classes``).
    """
    p = parse_partition(spec)
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {y.dtype} {y.shape}")
    if isinstance(n_workers, bool) or not isinstance(n_workers, (int, np.integer)) or n_workers < 1:
        raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
    n_workers = int(n_workers)
    if len(y) < n_workers:
        raise ValueError(f"cannot give {n_workers} workers a sample each from {len(y)} samples")
    rng = np.random.default_rng(seed)

    if p.kind in ("iid", "seldp"):  # SelDP's chunks are the IID split (see worker_chunks)
        parts = np.array_split(rng.permutation(len(y)), n_workers)
    elif p.kind == "labels":
        assert p.k is not None
        parts = _by_labels(y, n_workers, p.k, rng)
    else:
        assert p.alpha is not None
        parts = _dirichlet(y, n_workers, p.alpha, rng)
    return [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]


def _by_labels(y: np.ndarray, n_workers: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(y)
    c = len(classes)
    if k > c:
        raise ValueError(f"partition 'labels:{k}': only {c} classes in the data")
    # Worker w takes K consecutive classes of a shuffled cyclic order: its K classes
    # are distinct (K <= C) and every class is held once n_workers * K >= C.
    order = rng.permutation(classes)
    holders: dict[int, list[int]] = {int(cl): [] for cl in classes}
    for w in range(n_workers):
        for j in range(k):
            holders[int(order[(w * k + j) % c])].append(w)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_workers)]
    for cl, ws in holders.items():
        if not ws:
            continue
        idx = rng.permutation(np.flatnonzero(y == cl))
        if len(idx) < len(ws):
            raise ValueError(f"partition 'labels:{k}': class {cl} has {len(idx)} samples "
                             f"for {len(ws)} workers")
        for w, chunk in zip(ws, np.array_split(idx, len(ws))):
            parts[w].append(chunk)
    return [np.concatenate(p) for p in parts]


def _dirichlet(y: np.ndarray, n_workers: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(y)
    by_class = [np.flatnonzero(y == cl) for cl in classes]
    min_size = min(_DIRICHLET_MIN_SIZE, len(y) // n_workers)
    parts: list[np.ndarray] = []
    for _ in range(_DIRICHLET_TRIES):
        buckets: list[list[np.ndarray]] = [[] for _ in range(n_workers)]
        for idx in by_class:
            idx = rng.permutation(idx)
            prop = rng.dirichlet(np.full(n_workers, alpha))
            cuts = (np.cumsum(prop)[:-1] * len(idx)).astype(np.int64)
            for w, chunk in enumerate(np.split(idx, cuts)):
                buckets[w].append(chunk)
        parts = [np.concatenate(b) for b in buckets]
        if min(len(p) for p in parts) >= min_size:
            return parts
    # Very small alpha with many workers can keep starving someone: move single
    # samples from the currently largest worker so that everyone has at least one.
    for w in range(n_workers):
        if len(parts[w]) == 0:
            big = int(np.argmax([len(p) for p in parts]))
            parts[w], parts[big] = parts[big][-1:], parts[big][:-1]
    return parts


def worker_chunks(labels: np.ndarray, n_workers: int, spec: str | PartitionSpec, seed: int,
                  rank: int) -> list[np.ndarray]:
    """The index chunks worker `rank` trains on, in the order it walks them: its own shard for
    every scheme but seldp, where it is all N chunks as a circular queue from chunk `rank`
    (DP_n, DP_n+1, ..., DP_n-1), so that when workers synchronize each update still comes from
    a different chunk."""
    parts = partition_indices(labels, n_workers, spec, seed)
    if parse_partition(spec).kind != "seldp":
        return [parts[rank]]
    return [parts[(rank + i) % n_workers] for i in range(n_workers)]
