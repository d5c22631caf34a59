"""A run's energy: each device node's joules per step and per round, from its records only.

A node whose profile names a catalog device with a stated power (meta.json's nodes' `device`
entry, its `power`: idle_w and active_w, scenario/devices/catalog.py) draws active_w while it
computes a step (steps.csv's compute_seconds) and idle_w for the rest of the time since its
previous step (sending, waiting at a barrier, paused between rounds). Its first step counts its
compute alone: the time before it is bring-up, not the device's. Times are the run's own (steps.csv):
in a dilated run, virtual seconds, so the joules are the device's, not the host's.

A node without a device, or whose device states no power, has no rows; the summary names it.

energy.csv (ENERGY_COLUMNS): one row per step of a device node. `round`: the fedavg round the step
ended in (rounds.csv: the first round that closed at or after it), else the model version it trained
from (a BSP round).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # pandas is imported where it is used
    import pandas as pd

ENERGY_FILE = "energy.csv"
ENERGY_COLUMNS: list[str] = ["time", "node", "device", "step", "round", "active_seconds", "idle_seconds",
                             "joules"]


def node_power(meta: dict[str, Any]) -> dict[str, tuple[str, float, float]]:
    """node -> (device, idle W, active W), for the nodes meta.json gives a device with a power."""
    out: dict[str, tuple[str, float, float]] = {}
    nodes = meta.get("nodes")
    for node, info in (nodes.items() if isinstance(nodes, dict) else ()):
        device: Any = info.get("device") if isinstance(info, dict) else None
        power = device.get("power") if isinstance(device, dict) else None
        if not isinstance(power, dict):
            continue
        try:
            idle, active = float(power["idle_w"]), float(power["active_w"])
        except (KeyError, TypeError, ValueError):
            continue
        if 0 <= idle <= active:
            out[str(node)] = (str(device.get("device", "")), idle, active)
    return out


def _rounds_of(steps: "pd.DataFrame", rounds: Optional["pd.DataFrame"]) -> "pd.Series":
    import numpy as np
    import pandas as pd

    if rounds is not None and len(rounds) and "time" in rounds and "round" in rounds:
        r = rounds.dropna(subset=["time", "round"]).sort_values("time")
        if len(r):
            at = np.searchsorted(r["time"].to_numpy(float), steps["time"].to_numpy(float), side="left")
            labels = np.append(r["round"].to_numpy(float), np.nan)  # after the last close: no round
            return pd.Series(labels[at], index=steps.index)
    return steps["model_version"].astype(float)


def energy_table(steps: "pd.DataFrame", meta: dict[str, Any],
                 rounds: Optional["pd.DataFrame"] = None) -> "pd.DataFrame":
    """energy.csv's rows (the module's docstring), in the order of time."""
    import pandas as pd

    power = node_power(meta)
    empty = pd.DataFrame({c: pd.Series(dtype=str if c in ("node", "device") else float) for c in ENERGY_COLUMNS})
    if steps.empty or not power:
        return empty
    mine = steps[steps["node"].isin(list(power))].dropna(subset=["time"]).sort_values(["node", "time"]).copy()
    if mine.empty:
        return empty
    compute = mine["compute_seconds"].fillna(0.0).clip(lower=0.0)
    interval = mine.groupby("node")["time"].diff().fillna(compute)
    active = compute.where(compute <= interval, interval)
    idle = (interval - active).clip(lower=0.0)
    idle_w = mine["node"].map(lambda n: power[n][1])
    active_w = mine["node"].map(lambda n: power[n][2])
    out = pd.DataFrame({"time": mine["time"], "node": mine["node"], "device": mine["node"].map(lambda n: power[n][0]),
                        "step": mine["step"], "round": _rounds_of(mine, rounds), "active_seconds": active,
                        "idle_seconds": idle, "joules": active * active_w + idle * idle_w})
    return out.sort_values("time", kind="stable").reset_index(drop=True)


def summarize(table: "pd.DataFrame", meta: dict[str, Any], steps: "pd.DataFrame") -> dict:
    """summary.json's `energy`: joules per node, per step and per round; the nodes left out."""
    power = node_power(meta)
    nodes: dict[str, dict] = {}
    for node, g in table.groupby("node"):
        joules, n = float(g["joules"].sum()), len(g)
        per_round = g.dropna(subset=["round"]).groupby("round")["joules"].sum()
        device, idle_w, active_w = power[str(node)]
        nodes[str(node)] = {"device": device, "idle_w": idle_w, "active_w": active_w, "joules": round(joules, 6),
                            "steps": n, "joules_per_step": round(joules / n, 6),
                            "active_seconds": round(float(g["active_seconds"].sum()), 6),
                            "idle_seconds": round(float(g["idle_seconds"].sum()), 6), "rounds": len(per_round),
                            "joules_per_round": round(float(per_round.mean()), 6) if len(per_round) else None}
    trained = sorted(set(steps["node"].dropna().astype(str))) if not steps.empty else []
    without = [n for n in trained if n not in nodes]
    return {"unit": "J (active_w x compute seconds + idle_w x the rest between steps, in the run's seconds)",
            "total_joules": round(sum(v["joules"] for v in nodes.values()), 6), "nodes": nodes,
            "without_power": without,
            **({"note": "nodes without a catalog device that states its power have no energy rows"}
               if without else {})}


def write_table(run_dir: Path, table: "pd.DataFrame") -> Path:
    """energy.csv: ENERGY_COLUMNS, a row per step of a device node with a power."""
    from testbed.records.metrics import write_whole

    return write_whole(Path(run_dir) / ENERGY_FILE, ENERGY_COLUMNS, table[ENERGY_COLUMNS].to_dict("records"))


def assess_run(run_dir: Path) -> dict:
    """Compute the run's energy from steps.csv, rounds.csv and meta.json, write energy.csv, and
    return summary.json's `energy`."""
    from testbed.records.reader import ROUNDS_FILE, STEP_SCHEMA, read_csv_records

    run_dir = Path(run_dir)
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        meta = {}
    steps = read_csv_records(run_dir / "steps.csv", STEP_SCHEMA)
    rounds = read_rounds(run_dir / ROUNDS_FILE)
    table = energy_table(steps, meta if isinstance(meta, dict) else {}, rounds)
    write_table(run_dir, table)
    return summarize(table, meta if isinstance(meta, dict) else {}, steps)


def read_rounds(path: Path) -> Optional["pd.DataFrame"]:
    """rounds.csv's time and round columns as numbers; None where there is none."""
    import pandas as pd

    if not path.is_file():
        return None
    try:
        df = pd.read_csv(path, usecols=["time", "round"])
    except (OSError, ValueError):
        return None
    return df.apply(pd.to_numeric, errors="coerce")
