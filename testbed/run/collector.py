"""The runner's side of the nodes' records: it takes each row off the control network and
appends it to its table, so the runner is the one writer of the run's tables.

A row is [table name, one CSV line] (testbed.node.channel). Each is written as it arrives, one
write per line: a node's rows up to its crash are kept, and a crash of the runner leaves every
line written so far readable. Rows are checked first: a known table, one line of that table's
column count, a bounded size; anything else is counted and dropped (a node's bytes never end
the run or corrupt a table).
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from typing import Optional

import zmq

from testbed.kernel.netlink import entered_netns
from testbed.records import metrics

MAX_ROW = 64 * 1024  # bytes; a record row is a few hundred


class RecordCollector:
    def __init__(self, netns: Optional[str], address: str, port: int, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.rows = 0
        self.dropped = 0
        self._tables: dict[bytes, metrics.CsvLog] = {}
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_ROW)
        self._sock.setsockopt(zmq.LINGER, 0)
        with entered_netns(netns):  # the listening socket is made inside the control network
            self._sock.bind(f"tcp://{address}:{port}")
        self._thread = threading.Thread(target=self._loop, name="edgebed-records", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(100):
                continue
            while True:
                try:
                    frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._take(frames)
                self._last = time.monotonic()

    def _take(self, frames: list[bytes]) -> None:
        table = self._table(frames[0]) if len(frames) == 2 else None
        if table is None or not _one_row(frames[1], len(table.columns)):
            self.dropped += 1
            return
        table.append(frames[1])
        self.rows += 1

    def _table(self, name: bytes) -> Optional[metrics.CsvLog]:
        if name not in self._tables:
            text = name.decode("ascii", "replace")
            if text not in metrics.TABLES:
                return None
            self._tables[name] = metrics.open_table(self.run_dir, text)
        return self._tables[name]

    def drain(self, quiet: float = 0.5, limit: float = 10.0) -> None:
        """Wait until no row has arrived for `quiet` seconds (at most `limit`): the nodes' last rows
        are in before the runner reads the tables."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and time.monotonic() - self._last < quiet:
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()
        for t in self._tables.values():
            t.close()


def _one_row(line: bytes, columns: int) -> bool:
    if not line.endswith(b"\n") or (line.count(b"\n") != 1 and b'"' not in line):
        return False  # a newline inside a row only within a quoted field (csv decides below)
    try:
        rows = list(csv.reader([line.decode()]))
    except (UnicodeDecodeError, csv.Error):
        return False
    return len(rows) == 1 and len(rows[0]) == columns
