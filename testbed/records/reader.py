"""Reader side of the run-record contract: RUN/ -> DataFrames and dicts.

Column names and order come from columns.py, shared with the writer (metrics.py). Readers must
cope with crashed runs: a CSV may be missing, hold only a header, or end in a half-written line,
so every table is returned with its full set of columns and malformed rows are dropped instead
of raising.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

__all__ = [
    "STEP_COLUMNS",
    "EVAL_COLUMNS",
    "TRAFFIC_COLUMNS",
    "EVENT_COLUMNS",
    "RunNotFound",
    "RunRecords",
    "load_run",
    "finite_float",
    "read_csv_records",
    "traffic_rates",
]

# --- the contract (imported by the writer; keep at module top) ----------------------------

from testbed.errors import BadInput
from testbed.records.columns import EVAL_COLUMNS, EVENT_COLUMNS, ROUND_COLUMNS, STEP_COLUMNS, TRAFFIC_COLUMNS

SCENARIO_FILE = "scenario.yaml"
META_FILE = "meta.json"
STEPS_FILE = "steps.csv"
EVAL_FILE = "eval.csv"
TRAFFIC_FILE = "traffic.csv"
EVENTS_FILE = "events.csv"
ROUNDS_FILE = "rounds.csv"
SUMMARY_FILE = "summary.json"

# A row failing its column's check is dropped. "time": finite float; "int": an integer;
# "count": an integer or empty (what a command workload's program does not report: int64 when
# every row has it, else float64 with NaN); "float": number, or empty/nan (a diverged loss is
# data, not corruption); "name": non-empty string; "str": anything.
Kind = Literal["time", "int", "count", "float", "name", "str"]

STEP_SCHEMA: dict[str, Kind] = {
    "time": "time", "node": "name", "step": "int", "loss": "float", "batch_size": "count",
    "lr": "float", "bytes_sent": "count", "bytes_received": "count", "compute_seconds": "float",
    "comm_seconds": "float", "model_version": "int", "compressed": "float",  # 1/0, empty when not compressing
}  # fmt: skip
EVAL_SCHEMA: dict[str, Kind] = {
    "time": "time", "step": "int", "updates_received": "count", "accuracy": "float",
    "loss": "float", "samples": "count", "evaluated_at": "float",  # empty in records made before it
    "node": "str",  # empty in records made before it
}  # fmt: skip
TRAFFIC_SCHEMA: dict[str, Kind] = {
    "time": "time", "node": "name", "link": "str", "direction": "name", "bytes": "int",
    "delta_bytes": "int", "packets": "int",
}  # fmt: skip
EVENT_SCHEMA: dict[str, Kind] = {
    # scheduled_time is empty for events nobody scheduled (e.g. a crash the runner noticed)
    "time": "time", "scheduled_time": "float", "target": "str", "action": "name", "detail": "str",
}  # fmt: skip

ROUND_SCHEMA: dict[str, Kind] = {
    "time": "time", "round": "int", "reason": "str", "open_seconds": "float", "n_online": "count",
    "n_selected": "count", "n_finished": "count", "n_dropped": "count", "online": "str", "selected": "str",
    "finished": "str", "dropped": "str", "report_seconds": "str",  # empty in records made before it
}  # fmt: skip

assert list(STEP_SCHEMA) == STEP_COLUMNS and list(EVAL_SCHEMA) == EVAL_COLUMNS and list(ROUND_SCHEMA) == ROUND_COLUMNS
assert list(TRAFFIC_SCHEMA) == TRAFFIC_COLUMNS and list(EVENT_SCHEMA) == EVENT_COLUMNS

_NAN_TEXT = frozenset({"", "nan", "-nan", "+nan", "none", "null"})


class RunNotFound(FileNotFoundError, BadInput):
    """The path is not an edgebed run directory."""


@dataclass
class RunRecords:
    run_dir: Path
    steps: pd.DataFrame
    evals: pd.DataFrame
    traffic: pd.DataFrame
    events: pd.DataFrame
    summary: dict[str, Any]
    meta: dict[str, Any]
    # Resolved scenario.yaml; defaulted so the seven contract fields stay positional.
    scenario: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The run directory's name (what users see on disk), plus the run_id if it differs."""
        name = self.run_dir.resolve().name
        run_id = self.meta.get("run_id")
        return f"{name} ({run_id})" if run_id and str(run_id) not in name else name

    @property
    def node_roles(self) -> dict[str, str]:
        """node -> role ("ps" | "worker" | "evaluator") as recorded in meta.json."""
        nodes = self.meta.get("nodes")
        if not isinstance(nodes, dict):
            return {}
        return {str(n): str(info.get("role", "")) for n, info in nodes.items() if isinstance(info, dict)}

    @property
    def ps_nodes(self) -> list[str]:
        """Parameter-server node names; falls back to the reserved name "ps" without meta."""
        roles = self.node_roles
        if roles:
            return [n for n, r in roles.items() if r == "ps"]
        seen = set(self.traffic["node"]) | set(self.steps["node"])
        return ["ps"] if "ps" in seen else []

    @property
    def target_accuracy(self) -> float | None:
        """scenario.yaml stop.target_accuracy, if set."""
        stop = self.scenario.get("stop")
        value = stop.get("target_accuracy") if isinstance(stop, dict) else None
        return finite_float(value)


def load_run(run_dir: str | os.PathLike[str]) -> RunRecords:
    """Read every record of RUN/. Missing or damaged parts come back empty, never raise.

    Raises RunNotFound when ``run_dir`` is not a directory holding meta.json or steps.csv.
    """
    path = Path(run_dir)
    if not path.is_dir() or not ((path / META_FILE).is_file() or (path / STEPS_FILE).is_file()):
        raise RunNotFound(
            f"{path}: not an edgebed run directory (expected {META_FILE} or {STEPS_FILE} inside it)"
        )
    return RunRecords(
        run_dir=path,
        steps=read_csv_records(path / STEPS_FILE, STEP_SCHEMA),
        evals=read_csv_records(path / EVAL_FILE, EVAL_SCHEMA),
        traffic=read_csv_records(path / TRAFFIC_FILE, TRAFFIC_SCHEMA),
        events=read_csv_records(path / EVENTS_FILE, EVENT_SCHEMA),
        summary=_read_json(path / SUMMARY_FILE),
        meta=_read_json(path / META_FILE),
        scenario=_read_yaml(path / SCENARIO_FILE),
    )


def traffic_rates(traffic: pd.DataFrame) -> pd.DataFrame:
    """Bit rate per sample interval for each (node, link, direction) counter.

    Returns one row per input row, sorted by time, with columns time, node, link,
    direction, interval_seconds, delta_bytes, mbps (Mbit/s = delta_bytes*8 / interval / 1e6).
    The first sample of each counter has no interval and so mbps NaN; so do intervals
    with a negative delta (the interface was recreated and its counter restarted).
    """
    columns = ["time", "node", "link", "direction", "interval_seconds", "delta_bytes", "mbps"]
    if traffic.empty:
        return pd.DataFrame(
            {c: pd.Series(dtype=str if c in ("node", "link", "direction") else float) for c in columns}
        )
    df = traffic.sort_values("time", kind="stable").reset_index(drop=True)
    groups = df.groupby(["node", "link", "direction"], sort=False)
    interval = groups["time"].diff()
    delta = df["delta_bytes"].astype(float)
    # A writer that left delta_bytes empty still has the cumulative counter.
    delta = delta.fillna(groups["bytes"].diff().astype(float))
    mbps = (delta * 8.0 / interval / 1e6).where((interval > 0) & (delta >= 0))
    return pd.DataFrame(
        {
            "time": df["time"],
            "node": df["node"],
            "link": df["link"],
            "direction": df["direction"],
            "interval_seconds": interval,
            "delta_bytes": delta,
            "mbps": mbps,
        }
    )


# --- parsing ------------------------------------------------------------------------------


def read_csv_records(path: Path, schema: Mapping[str, Kind]) -> pd.DataFrame:
    """Read one record CSV leniently; see the module docstring for what is tolerated.

    Columns come back in schema order with dtypes float64 ("time"/"float"), int64
    ("int") and str, followed by any extra columns the writer added (as str).
    A schema column absent from the header is filled with NaN (numeric) or "".
    Rows are sorted by time (stable, so file order breaks ties).
    """
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:  # missing (never written) or unreadable: same to a reader
        return _empty(schema)
    # csv writers end every row with a newline, so a last line without one was cut by a
    # crash (or caught mid-flush by a live reader) and even its last field can't be trusted.
    if text and not text.endswith(("\n", "\r")):
        text = text[: max(text.rfind("\n"), text.rfind("\r")) + 1]
    # NULs show up when a crash leaves a preallocated tail; they are never real content.
    text = text.replace("\x00", "")

    raw = _parse_csv(text)
    if raw is None:
        return _empty(schema)
    raw.columns = [str(c).strip().lstrip("\ufeff") for c in raw.columns]
    raw = raw.loc[:, ~raw.columns.duplicated()]

    n = len(raw)
    bad = np.zeros(n, dtype=bool)
    out: dict[str, pd.Series] = {}
    int_columns: list[str] = []
    count_columns: list[str] = []
    for col, kind in schema.items():
        if col not in raw.columns:
            textual = kind in ("str", "name")
            out[col] = pd.Series([""] * n, dtype=str) if textual else pd.Series(np.nan, index=range(n))
            continue
        cells = raw[col].fillna("").astype(str)
        if kind in ("str", "name"):
            cells = cells.str.strip()
            if kind == "name":
                bad |= (cells == "").to_numpy()
            out[col] = cells
            continue
        num = pd.to_numeric(cells, errors="coerce").astype(float)
        if kind == "time":
            bad |= ~np.isfinite(num.to_numpy())
        elif kind == "int":
            bad |= (num.isna() | ~np.isfinite(num) | (num % 1 != 0)).to_numpy()
            int_columns.append(col)
        elif kind == "count":
            given = (cells.str.strip() != "").to_numpy()
            bad |= given & (num.isna() | ~np.isfinite(num) | (num % 1 != 0)).to_numpy()
            count_columns.append(col)
        else:
            failed = num.isna().to_numpy()
            if failed.any():  # only the few non-numbers need the slower text check
                bad[failed] |= ~cells[failed].str.strip().str.lower().isin(_NAN_TEXT).to_numpy()
        out[col] = num
    for col in raw.columns:
        if col not in schema:
            out[col] = raw[col].fillna("").astype(str)

    df = pd.DataFrame(out).loc[~bad]
    for col in int_columns + [c for c in count_columns if not df[c].isna().any()]:
        df[col] = df[col].astype("int64")
    return df.sort_values("time", kind="stable").reset_index(drop=True)


def _parse_csv(text: str) -> pd.DataFrame | None:
    """Cells as strings; None when there is not even a header.

    Rows with too many fields are dropped here. Rows with too few come back padded
    with "" and are caught by the per-column checks (every table has a required
    int or name column towards its end).
    """
    if _first_row_fits(text):
        try:
            return pd.read_csv(
                io.StringIO(text), dtype=str, keep_default_na=False, on_bad_lines="skip",
                index_col=False, engine="c",
            )  # fmt: skip
        except pd.errors.EmptyDataError:
            return None
        except pd.errors.ParserError:
            pass  # e.g. an unterminated quote: the C tokenizer gives up on the whole file
    rows: list[list[str]] = []
    try:
        rows.extend(csv.reader(io.StringIO(text, newline="")))
    except csv.Error:  # keep the rows before the damage
        pass
    if not rows:
        return None
    header = rows[0]
    body = [r for r in rows[1:] if len(r) == len(header)]
    return pd.DataFrame(body, columns=_dedupe(header), dtype=object)


def _first_row_fits(text: str) -> bool:
    # pandas skips over-long rows, except the first data row, which it would truncate
    # (index_col=False) or take as an index (default); send that case to the slow path.
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, [])
        first = next(reader, None)
    except csv.Error:
        return False
    return first is None or len(first) <= len(header)


def _dedupe(names: list[str]) -> list[str]:
    # Same convention as pandas' C reader ("a", "a.1"), so both paths agree.
    seen: dict[str, int] = {}
    out = []
    for name in names:
        k = seen.get(name, 0)
        out.append(name if k == 0 else f"{name}.{k}")
        seen[name] = k + 1
    return out


def _empty(schema: Mapping[str, Kind]) -> pd.DataFrame:
    dtypes = {"time": "float64", "float": "float64", "int": "int64", "count": "int64", "name": str, "str": str}
    return pd.DataFrame({c: pd.Series(dtype=dtypes[k]) for c, k in schema.items()})


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):  # absent, or half-written by a crash
        return {}
    return data if isinstance(data, dict) else {}


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    import yaml  # imported here: only the scenario needs it

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def finite_float(value: Any) -> float | None:
    """A finite float from a JSON/YAML value, else None (bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
