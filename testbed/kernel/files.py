"""Files the runner writes, as root, in folders a node's code might once have written into: never
through a symbolic link planted at the file's name.

A link at `RUN/.ps.json.tmp` or `RUN/events.csv` would otherwise have the runner write a node's
report into any file, sysctl or cgroup knob of the host. Each name is opened relative to its
folder's descriptor with O_NOFOLLOW (a link there fails with ELOOP); a whole file is written to a
fresh temporary name (O_EXCL: never one that exists) and renamed over its name, which replaces a
link there instead of following it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _folder(path: Path) -> int:
    return os.open(path, os.O_DIRECTORY | os.O_CLOEXEC)


def _name(path: Path) -> str:
    name = path.name
    if name in ("", ".", ".."):
        raise ValueError(f"{path}: not a file's name")
    return name


def open_nofollow(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """A descriptor of `path` opened with `flags`, failing (ELOOP) where `path` is a link."""
    path = Path(path)
    folder = _folder(path.parent)
    try:
        return os.open(_name(path), flags | NOFOLLOW, mode, dir_fd=folder)
    finally:
        os.close(folder)


def replace_text(path: Path | str, text: str, mode: int = 0o644) -> None:
    """`path` holds `text`, written whole: a reader sees the old file or the new one, and a link
    at `path` is replaced, not followed."""
    path = Path(path)
    name = _name(path)
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    folder = _folder(path.parent)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=folder)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder)
            except OSError:
                pass
            raise
    finally:
        os.close(folder)
