"""A node's records travel to the runner over the run's control network, not into the run directory.

Each node process has one PUSH socket to the runner's collector (RoleConfig.records,
"tcp://ADDRESS:PORT" on the control network, apart from the node's shaped link: records never
count as traffic); a row is one message, [table name, its CSV line]. ZeroMQ's I/O thread sends it
at once, so a node killed with -9 loses at most its last milliseconds of rows, and `flush()`, run
when a role ends, lets the last rows leave before the process exits. Without a records address
(a role started outside a runner's run, as in some tests) it appends to the run directory's tables.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import zmq

from testbed.records import metrics

LINGER_MS = 3000  # how long a role's exit waits for its last rows to leave
QUEUE = 100_000  # rows held while the runner is slow to take them (then a write waits)

_lock = threading.Lock()  # tables are written from the role's threads too (the stream buffer's)
_open: dict[str, Any] = {}  # this process's socket: pid, context, socket


def _socket(address: str) -> zmq.Socket:
    if _open.get("pid") != os.getpid():  # a forked child makes its own
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        sock.setsockopt(zmq.SNDHWM, QUEUE)
        sock.connect(address)
        _open.update(pid=os.getpid(), ctx=ctx, sock=sock)
    return _open["sock"]


class RemoteTable:
    """One of the run's tables, written through the runner (same interface as metrics.CsvLog)."""

    def __init__(self, address: str, name: str):
        self.name, self.columns = name, metrics.TABLES[name]
        self._topic = name.encode()
        with _lock:
            self._sock = _socket(address)

    def write(self, **row: Any) -> None:
        line = metrics.format_row(self.columns, row)
        with _lock:
            self._sock.send_multipart([self._topic, line])

    def close(self) -> None:
        pass  # the process's socket outlives its tables: flush() closes it


def open_table(cfg, name: str):
    """Table `name` for a role: through the runner when the run has a control network."""
    if cfg.records:
        return RemoteTable(cfg.records, name)
    return metrics.open_table(Path(cfg.run_dir), name)


def flush() -> None:
    """Let this process's last rows leave (up to LINGER_MS), then close its socket."""
    with _lock:
        if _open.get("pid") == os.getpid():
            _open["sock"].close(linger=LINGER_MS)
            _open["ctx"].term()
        _open.clear()
