"""How late a run's timeline acted (availability on runtime swarm): from a run's
events.csv, each action's lag (time applied - time scheduled), by action, over the whole run and
in windows of its schedule. Reads only the run directory.

    python benchmarks/event_lag.py RUN_DIR [--windows 0,30,120] [--out lag.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
from emit import emit

ACTIONS = ("partition", "heal", "pause", "resume")


def summary(lag: pd.Series) -> dict:
    if lag.empty:
        return {"count": 0}
    return {"count": int(lag.size), "median": round(float(lag.median()), 2), "p90": round(float(lag.quantile(0.9)), 2),
            "max": round(float(lag.max()), 2)}


def event_lag(run_dir: Path, windows: list[float]) -> dict:
    events = pd.read_csv(run_dir / "events.csv")
    events = events[events["action"].isin(ACTIONS) & events["scheduled_time"].notna()]
    events = events.assign(lag=events["time"] - events["scheduled_time"])
    out: dict = {"run": str(run_dir), "by_action": {a: summary(g["lag"]) for a, g in events.groupby("action")}}
    edges = [*windows, float("inf")]
    out["by_window"] = {f"{lo:g}-{hi:g} s": summary(events[(events["scheduled_time"] >= lo) &
                                                        (events["scheduled_time"] < hi)]["lag"])
                        for lo, hi in zip(edges, edges[1:])}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--windows", default="0,30,120", help="the windows' starts, s of the schedule")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = event_lag(args.run_dir, [float(w) for w in args.windows.split(",")])
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
