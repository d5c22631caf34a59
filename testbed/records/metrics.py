"""The writer side of a run's records (the reader is records.py).

Whoever writes a table (the runner, for the rows the nodes send it over the control network;
a docker node, into its mounted run directory) appends whole lines to shared CSV files opened
with O_APPEND, one write(2) per line: lines from different writers never interleave, and each
line is on disk (page cache) as soon as it is written, so a crash of any process, the runner
included, keeps every record up to the crash.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Iterable

from testbed.kernel.files import open_nofollow, replace_text
from testbed.records.columns import (
    BUFFER_COLUMNS,
    EVAL_COLUMNS,
    EVENT_COLUMNS,
    PEER_COLUMNS,
    REPORT_COLUMNS,
    RESOURCE_COLUMNS,
    ROUND_COLUMNS,
    SERVER_COLUMNS,
    SHAPING_COLUMNS,
    STEP_COLUMNS,
    STREAM_STEP_COLUMNS,
    TRAFFIC_COLUMNS,
)
from testbed.records.virtual import world_row

TABLES: dict[str, list[str]] = {
    "steps.csv": STEP_COLUMNS,
    "eval.csv": EVAL_COLUMNS,
    "traffic.csv": TRAFFIC_COLUMNS,
    "events.csv": EVENT_COLUMNS,
    "server.csv": SERVER_COLUMNS,
    "rounds.csv": ROUND_COLUMNS,  # strategies with client selection: one row per round
    "resources.csv": RESOURCE_COLUMNS,
    "stream.csv": STREAM_STEP_COLUMNS,  # per streaming step: how long the batch took to arrive
    "buffer.csv": BUFFER_COLUMNS,  # ~1 s per device: its stream buffer's counters
    "peers.csv": PEER_COLUMNS,  # decentralized strategies: what each worker sent on each link
    "report.csv": REPORT_COLUMNS,  # command workloads: what their programs reported (edgebed.report)
    "shaping.csv": SHAPING_COLUMNS,  # ~1 s per shaped link direction: its HTB class's rate and counters
}


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e5 else f"{v:.3f}"
    s = str(v)
    if any(c in s for c in ',"\n'):
        s = '"' + s.replace('"', '""') + '"'
    return s


def format_row(columns: list[str], row: dict[str, Any]) -> bytes:
    """A record's CSV line, newline included."""
    return (",".join(_fmt(row.get(c)) for c in columns) + "\n").encode()


class CsvLog:
    """A table on disk. `dilation`: the run's k (records.virtual); `write` takes a row measured on
    the wall and writes it in the world's units."""

    def __init__(self, path: Path, columns: Iterable[str], dilation: float = 1.0):
        self.path = Path(path)
        self.columns = list(columns)
        self.dilation = dilation
        self._fd = open_nofollow(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # a planted link: ELOOP

    def write(self, **row: Any) -> None:
        self.append(format_row(self.columns, world_row(self.path.name, row, self.dilation)))

    def append(self, data: bytes) -> None:
        """One whole line, as format_row makes it (one write: lines never interleave)."""
        written = os.write(self._fd, data)
        if written != len(data):  # a full disk: say so (the rest cannot follow without interleaving)
            raise OSError(errno.ENOSPC, f"{self.path}: wrote {written} of a line's {len(data)} bytes")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_whole(path: Path, columns: list[str], rows: Iterable[dict[str, Any]]) -> Path:
    """A table written whole at a run's end (fidelity.csv, energy.csv): its header and rows at
    once, a link planted at `path` replaced, not followed (kernel.files.replace_text)."""
    lines = "".join(format_row(columns, row).decode() for row in rows)
    replace_text(path, ",".join(columns) + "\n" + lines)
    return Path(path)


def init_tables(run_dir: Path) -> None:
    """Create each table with its header (the runner does this before any node starts)."""
    for name, cols in TABLES.items():
        replace_text(run_dir / name, ",".join(cols) + "\n")


def open_table(run_dir: Path, name: str, dilation: float = 1.0) -> CsvLog:
    return CsvLog(Path(run_dir) / name, TABLES[name], dilation)
