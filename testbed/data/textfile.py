"""Reading a user's text file (a trace) without trusting it: a size cap, strict UTF-8, and
errors that name the file and never quote it (a trace path may point anywhere)."""

from __future__ import annotations

from pathlib import Path

MAX_TRACE_BYTES = 16 << 20  # a week of Mahimahi deliveries at 100 Mbit/s is about 4 MB


def read_capped_text(path: str | Path, limit: int = MAX_TRACE_BYTES) -> str:
    """The file's text, or ValueError with one line, `PATH: why`."""
    try:
        return capped_text(path, limit)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def capped_text(path: str | Path, limit: int) -> str:
    """The file's text, or ValueError saying why not (without the path)."""
    p = Path(path)
    if not p.is_file():  # a device (/dev/zero) or a folder would never end or mislead
        raise ValueError("not a regular file" if p.exists() else "no such file")
    try:
        with open(p, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"cannot read ({e.strerror or e})") from None
    if len(raw) > limit:
        raise ValueError(f"larger than {limit / 2**20:g} MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text (byte {e.start})") from None
