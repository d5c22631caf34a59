"""Tests for testbed.data.partition."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.data.partition import PartitionSpec, parse_partition, partition_indices

# 10 classes, unequal sizes (100..190 samples), shuffled like a real label vector.
LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), np.arange(100, 200, 10)))


def _check_disjoint_nonempty(parts: list[np.ndarray], n_workers: int) -> np.ndarray:
    assert len(parts) == n_workers
    assert all(len(p) > 0 for p in parts)
    assert all(p.dtype == np.int64 for p in parts)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "workers share samples"
    return allidx


def _max_class_share(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean over workers of the share of their most common class."""
    return float(np.mean([np.bincount(labels[p]).max() / len(p) for p in parts]))


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("spec, want", [
    ("iid", PartitionSpec("iid")),
    (" iid ", PartitionSpec("iid")),
    ("labels:1", PartitionSpec("labels", k=1)),
    ("labels:3", PartitionSpec("labels", k=3)),
    ("dirichlet:0.5", PartitionSpec("dirichlet", alpha=0.5)),
    ("dirichlet:10", PartitionSpec("dirichlet", alpha=10.0)),
])
def test_parse_valid(spec: str, want: PartitionSpec) -> None:
    got = parse_partition(spec)
    assert got == want
    assert parse_partition(str(got)) == got  # str() round-trips


@pytest.mark.parametrize("spec, msg", [
    ("labels:0", "partition 'labels:0': K must be an integer >= 1"),
    ("labels:-2", "K must be an integer >= 1"),
    ("labels:x", "K must be an integer >= 1"),
    ("labels:1.5", "K must be an integer >= 1"),
    ("labels", "K must be an integer >= 1"),
    ("dirichlet:0", "ALPHA must be a finite number > 0"),
    ("dirichlet:-1", "ALPHA must be a finite number > 0"),
    ("dirichlet:nan", "ALPHA must be a finite number > 0"),
    ("dirichlet:inf", "ALPHA must be a finite number > 0"),
    ("dirichlet:", "ALPHA must be a finite number > 0"),
    ("iid:2", "'iid' takes no argument"),
    ("shards:2", "unknown partition 'shards:2'"),
    ("", "unknown partition ''"),
])
def test_parse_errors(spec: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg) as info:
        parse_partition(spec)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- iid


def test_iid_covers_everything_evenly() -> None:
    parts = partition_indices(LABELS, 7, "iid", seed=1)
    allidx = _check_disjoint_nonempty(parts, 7)
    assert np.array_equal(np.sort(allidx), np.arange(len(LABELS)))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    # Random, so each shard sees every class in roughly global proportions.
    assert _max_class_share(parts, LABELS) < 0.2


def test_single_worker_gets_everything() -> None:
    for spec in ("iid", "labels:10", "dirichlet:0.1"):
        (only,) = partition_indices(LABELS, 1, spec, seed=0)
        assert np.array_equal(only, np.arange(len(LABELS)))


# --------------------------------------------------------------------------- labels:K


@pytest.mark.parametrize("n_workers, k", [(10, 1), (10, 2), (5, 2), (8, 3), (20, 2), (4, 10)])
def test_labels_k_classes_per_worker_full_coverage(n_workers: int, k: int) -> None:
    parts = partition_indices(LABELS, n_workers, f"labels:{k}", seed=3)
    allidx = _check_disjoint_nonempty(parts, n_workers)
    for p in parts:
        assert len(np.unique(LABELS[p])) == k
    # n_workers * k >= 10: every class held by someone, so every index is used.
    assert np.array_equal(np.sort(allidx), np.arange(len(LABELS)))


def test_labels_k_splits_a_class_evenly_among_holders() -> None:
    parts = partition_indices(LABELS, 20, "labels:1", seed=0)  # each class held by 2 workers
    for c in range(10):
        sizes = sorted(int((LABELS[p] == c).sum()) for p in parts if (LABELS[p] == c).any())
        assert len(sizes) == 2 and sizes[1] - sizes[0] <= 1


def test_labels_k_fewer_slots_than_classes() -> None:
    parts = partition_indices(LABELS, 3, "labels:2", seed=0)
    allidx = _check_disjoint_nonempty(parts, 3)
    held = set(np.unique(LABELS[allidx]).tolist())
    assert len(held) == 6 and all(len(np.unique(LABELS[p])) == 2 for p in parts)
    # Held classes are used in full; the rest are left out.
    assert len(allidx) == sum(int((LABELS == c).sum()) for c in held)


def test_labels_k_errors() -> None:
    with pytest.raises(ValueError, match="only 10 classes"):
        partition_indices(LABELS, 4, "labels:11", seed=0)
    tiny = np.array([0, 0, 0, 0, 1], dtype=np.int64)  # 4 workers, K=1: 2 holders per class
    with pytest.raises(ValueError, match="class 1 has 1 samples for 2 workers"):
        partition_indices(tiny, 4, "labels:1", seed=0)


# --------------------------------------------------------------------------- dirichlet


def test_dirichlet_covers_everything() -> None:
    parts = partition_indices(LABELS, 10, "dirichlet:0.5", seed=0)
    allidx = _check_disjoint_nonempty(parts, 10)
    assert np.array_equal(np.sort(allidx), np.arange(len(LABELS)))


def test_dirichlet_small_alpha_is_skewed() -> None:
    skewed = _max_class_share(partition_indices(LABELS, 10, "dirichlet:0.05", seed=0), LABELS)
    mild = _max_class_share(partition_indices(LABELS, 10, "dirichlet:1", seed=0), LABELS)
    near_iid = _max_class_share(partition_indices(LABELS, 10, "dirichlet:1000", seed=0), LABELS)
    iid = _max_class_share(partition_indices(LABELS, 10, "iid", seed=0), LABELS)
    assert skewed > 0.6, skewed
    assert skewed > mild > near_iid
    assert near_iid < 0.2 and abs(near_iid - iid) < 0.05


def test_dirichlet_extreme_alpha_keeps_every_worker_nonempty() -> None:
    for seed in range(3):
        parts = partition_indices(LABELS, 60, "dirichlet:0.001", seed=seed)
        allidx = _check_disjoint_nonempty(parts, 60)
        assert np.array_equal(np.sort(allidx), np.arange(len(LABELS)))


# --------------------------------------------------------------------------- common


@pytest.mark.parametrize("spec", ["iid", "labels:2", "dirichlet:0.3"])
def test_deterministic_for_seed(spec: str) -> None:
    a = partition_indices(LABELS, 6, spec, seed=11)
    b = partition_indices(LABELS, 6, parse_partition(spec), seed=11)
    c = partition_indices(LABELS, 6, spec, seed=12)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, c))
    assert all(np.all(np.diff(p) > 0) for p in a)  # sorted


def test_argument_errors() -> None:
    with pytest.raises(ValueError, match="n_workers must be an integer >= 1"):
        partition_indices(LABELS, 0, "iid", seed=0)
    with pytest.raises(ValueError, match="cannot give 5 workers"):
        partition_indices(np.arange(3), 5, "iid", seed=0)
    with pytest.raises(ValueError, match="1-D integer"):
        partition_indices(LABELS.astype(np.float32), 2, "iid", seed=0)
    with pytest.raises(ValueError, match="unknown partition"):
        partition_indices(LABELS, 2, "bogus", seed=0)


def test_seldp_walks_every_chunk_from_its_own() -> None:
    """SelSync's SelDP (Fig. 7b): worker n walks DP_n, DP_n+1, ..., DP_n-1."""
    from testbed.data.partition import worker_chunks

    y = np.arange(103) % 10
    iid = partition_indices(y, 4, "iid", seed=3)
    assert [c.tolist() for c in partition_indices(y, 4, "seldp", seed=3)] == [c.tolist() for c in iid]
    for rank in range(4):
        chunks = worker_chunks(y, 4, "seldp", 3, rank)
        assert [c.tolist() for c in chunks] == [iid[(rank + i) % 4].tolist() for i in range(4)]
        assert sorted(np.concatenate(chunks).tolist()) == list(range(103))  # every worker sees all data
    assert [c.tolist() for c in worker_chunks(y, 4, "iid", 3, 2)] == [iid[2].tolist()]
    assert str(parse_partition("seldp")) == "seldp"
    with pytest.raises(ValueError, match="takes no argument"):
        parse_partition("seldp:2")


def test_batches_keep_seldp_chunk_order() -> None:
    from testbed.node.roles.common import Batches

    b = Batches(10, 3, seed=0, chunks=[4, 6])
    first = np.concatenate([b.next() for _ in range(4)])[:10]  # one epoch
    assert sorted(first[:4].tolist()) == [0, 1, 2, 3] and sorted(first[4:].tolist()) == list(range(4, 10))
    # an unchunked shard draws the same batches as before chunks existed
    a, c = Batches(10, 3, seed=5), np.random.default_rng(5).permutation(10)
    assert a.next().tolist() == c[:3].tolist()
