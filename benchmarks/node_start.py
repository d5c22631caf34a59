"""How long a node's process takes to start, read from a run's own records (no instrumentation):
fedavg with per-round trainers (`trainers: per_round`), N devices, K drawn a round, every link
100 Mbit/s, no CPU caps. A trainer drawn again for the next round runs already (it parked): its
first step comes at about the round's opening plus the model's transfer. One started for the
round (cold) adds its process's start: the fork, its bootstrap (namespace, cgroup, privileges),
its role's setup, its connection. The difference of the two medians is what a start costs.

    .venv/bin/python benchmarks/node_start.py [--devices 20] [--per-round 5] [--runs 3] [--out FILE.json]

Needs root (netns runtime); run with nothing else on the machine (it is a timing). Compare two
commits by running it from a worktree of each (`git worktree add /tmp/before COMMIT`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]


def scenario(devices: int, per_round: int, seconds: int, seed: int) -> dict:
    return {"name": "node-start", "seed": seed, "runtime": "netns",
            "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05,
                         "eval_seconds": 5},
            "stop": {"seconds": seconds},
            "algorithm": {"name": "fedavg", "params": {"period": 10, "clients": per_round, "deadline_s": 20,
                                                       "trainers": "per_round"}},
            "profiles": {"edge": {"bandwidth": "100mbit"}},
            "workers": [{"count": devices, "profile": "edge"}]}


def first_steps(rounds: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per round and drawn device: seconds from the round's opening to its first step, and whether
    it was drawn in the round before (then its trainer ran already)."""
    rows, before = [], set()
    for r in rounds.itertuples():
        opened, drawn = r.time - r.open_seconds, set(str(r.selected).split())
        mine = steps[steps.model_version == r.round]
        for node in drawn:
            t = mine[mine.node == node].time
            if len(t):
                rows.append({"round": r.round, "node": node, "warm": node in before, "first_step_s": t.min() - opened})
        before = drawn
    return pd.DataFrame(rows)


def one_run(devices: int, per_round: int, seconds: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    with tempfile.TemporaryDirectory(prefix="edgebed-node-start-") as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_text(yaml.safe_dump(scenario(devices, per_round, seconds, seed)))
        run_dir = Path(tmp) / "run"
        subprocess.run([sys.executable, "-m", "testbed.cli", "up", str(path), "--out", str(run_dir), "-q"],
                       cwd=ROOT, check=True, timeout=seconds + 300)
        rounds = pd.read_csv(run_dir / "rounds.csv", keep_default_na=False)
        return first_steps(rounds, pd.read_csv(run_dir / "steps.csv")), rounds


def summary(values) -> dict:
    v = sorted(float(x) for x in values)
    if not v:
        return {"n": 0}
    return {"n": len(v), "median": round(statistics.median(v), 3), "p90": round(v[int(0.9 * (len(v) - 1))], 3),
            "min": round(v[0], 3), "max": round(v[-1], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    firsts, rounds = [], []
    for k in range(a.runs):
        f, r = one_run(a.devices, a.per_round, a.seconds, seed=1 + k)
        firsts.append(f.assign(run=k))
        rounds.append(r.assign(run=k))
    f, r = pd.concat(firsts), pd.concat(rounds)
    cold, warm = summary(f[~f.warm].first_step_s), summary(f[f.warm].first_step_s)
    out = {"benchmark": "node_start", "devices": a.devices, "per_round": a.per_round, "runs": a.runs,
           "seconds": a.seconds, "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                                          capture_output=True, text=True).stdout.strip(),
           "date": time.strftime("%Y-%m-%d"), "cold_first_step_s": cold, "warm_first_step_s": warm,
           "start_cost_s": round(cold["median"] - warm["median"], 3) if cold["n"] and warm["n"] else None,
           "round_s": summary(r[r["round"] > 0].open_seconds), "rounds": int(len(r))}
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
