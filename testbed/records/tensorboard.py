"""A run's records as TensorBoard scalars, written while the run goes (`edgebed up --tensorboard
DIR`) or afterwards (`edgebed tensorboard RUN`): `tensorboard --logdir DIR` watches a long run
with the tool people already use.

The follower reads the run's CSV records as they grow (whole lines only) and writes:
eval/accuracy and eval/loss (x: the model's step), train/loss/<node> (x: the worker's step),
rate_bps/<node>/<direction> and wan_rate_bps/<site>-><peer> (x: milliseconds into the run),
buffer/<node> (samples buffered), and the timeline's events as text. Wall times are the run's.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from pathlib import Path
from typing import Any, Optional

from testbed.errors import HostCannot

TABLES = ("eval.csv", "steps.csv", "traffic.csv", "buffer.csv", "events.csv")


def _float(v: str) -> Optional[float]:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class TensorBoardFollower:
    def __init__(self, run_dir: Path, logdir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch's writer needs the tensorboard package
            raise HostCannot(f"--tensorboard needs the tensorboard package (pip install tensorboard): {e}") from None
        self.run_dir, self.logdir = Path(run_dir), Path(logdir)
        self.writer = SummaryWriter(str(self.logdir))
        self._offsets: dict[str, int] = {}
        self._headers: dict[str, list[str]] = {}
        self._t0: Optional[float] = None
        self._last_time: dict[tuple, float] = {}  # (node, link, direction) -> its previous traffic sample

    def t0(self) -> float:
        """The run's start on the wall clock (record times count from it)."""
        if self._t0 is None:
            try:
                self._t0 = float(json.loads((self.run_dir / "meta.json").read_text())["started"])
            except (OSError, ValueError, KeyError, TypeError):
                return 0.0
        return self._t0

    def poll(self) -> int:
        """Write what was added to the records since the last poll; the number of rows read."""
        n = 0
        for table in TABLES:
            for row in self._new_rows(table):
                self._write(table, row)
                n += 1
        self.writer.flush()
        return n

    def _new_rows(self, table: str) -> list[dict[str, str]]:
        path = self.run_dir / table
        try:
            with open(path, "rb") as f:
                f.seek(self._offsets.get(table, 0))
                data = f.read()
        except OSError:
            return []
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self._offsets[table] = self._offsets.get(table, 0) + len(whole)
        lines = list(csv.reader(io.StringIO(whole.decode("utf-8", "replace"))))
        if table not in self._headers and lines:
            self._headers[table] = lines.pop(0)
        header = self._headers.get(table, [])
        return [dict(zip(header, line)) for line in lines if len(line) == len(header)]

    def _write(self, table: str, row: dict[str, Any]) -> None:
        t = _float(row.get("time"))
        if t is None:
            return
        wall, ms = self.t0() + t, int(round(t * 1000))
        add = self.writer.add_scalar
        if table == "eval.csv":
            step = int(_float(row["step"]) or 0)
            for key in ("accuracy", "loss"):
                if _float(row.get(key)) is not None:
                    add(f"eval/{key}", _float(row[key]), step, walltime=wall)
        elif table == "steps.csv" and _float(row.get("loss")) is not None:
            add(f"train/loss/{row['node']}", _float(row["loss"]), int(_float(row["step"]) or 0), walltime=wall)
        elif table == "traffic.csv":
            self._rate(row, ms, wall)
        elif table == "buffer.csv" and _float(row.get("buffered")) is not None:
            add(f"buffer/{row['node']}", _float(row["buffered"]), ms, walltime=wall)
        elif table == "events.csv":
            self.writer.add_text("events", f"{t:.1f} s: {row.get('target')} {row.get('action')} "
                                           f"{row.get('detail', '')}", ms, walltime=wall)

    def _rate(self, row: dict[str, str], ms: int, wall: float) -> None:
        """bit/s over the sampling interval (delta_bytes since the node's previous sample)."""
        key = (row["node"], row["link"], row["direction"])
        prev, t = self._last_time.get(key), _float(row["time"])
        self._last_time[key] = t
        delta = _float(row.get("delta_bytes"))
        if prev is None or delta is None or t is None or t <= prev:
            return
        name = (f"rate_bps/{row['node']}/{row['direction']}" if row["link"] == "access"
                else f"wan_rate_bps/{row['node']}->{row['link'][4:]}")
        self.writer.add_scalar(name, delta * 8 / (t - prev), ms, walltime=wall)

    def close(self) -> None:
        self.poll()
        self.writer.close()


class BackgroundFollower:
    """A follower polled by a thread of its own every `every` seconds, until stop()."""

    def __init__(self, run_dir: Path, logdir: Path, every: float = 1.0):
        self.follower = TensorBoardFollower(run_dir, logdir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every,), name="tensorboard", daemon=True)
        self._thread.start()

    def _loop(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self.follower.poll()
            except Exception:  # a record it cannot read now is read at the end, or not at all: never the run's end
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.follower.close()


def write_run(run_dir: Path, logdir: Path) -> int:
    """A finished run's records as TensorBoard scalars (`edgebed tensorboard RUN`); rows read."""
    follower = TensorBoardFollower(run_dir, logdir)
    n = follower.poll()
    follower.close()
    return n
