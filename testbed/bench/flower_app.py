"""`edgebed bench flower-app`: an unmodified Flower app (examples/flower-app: FedAvg, 2
SuperNodes) on emulated workers, its round time against the bytes each round moves over the
shaped links, at each link rate.

Per round, each SuperNode pulls the global model and pushes its update: the wire bytes of a
worker's access link between the ends of rounds (traffic.csv, the worker's own interface
counters, interpolated at the round ends the ServerApp reports) over the rounds. The time those
bytes need at the link's rate, the worker's training time (the ClientApp reports it) and what is
left (Flower's own round trips: SuperNodes poll the SuperLink for messages, serialization) are
given side by side. Round 1 (FAB install, first connection) is left out.

The verdict, fixed before the first run: against the fastest rate, the time a round gains at a
slower rate is within 20% of the time its bytes gain at the link rate (where they gain >= 1 s):
the round time follows the bytes over the shaped links, whatever Flower's own costs are."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from testbed.bench.harness import run_from_repo, save_result
from testbed.scenario import units

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "byo" / "flower.yaml"
FLOWER_PYTHON = REPO / ".venv-flower" / "bin" / "python"


def flower_app_run(rate: str, *, rounds: int = 4, cpus: float = 0.8, out: Path | None = None) -> dict:
    """One run at `rate` (every worker's access link, both ways): per-round seconds and bytes."""
    from testbed.run import api

    sc = api.scenario(SCENARIO, {"profiles.edge": {"bandwidth": rate, "cpus": cpus}, "name": f"flower-{rate}"})
    cmd = sc.workload.command["evaluator"].replace("num-server-rounds=5", f"num-server-rounds={rounds}")
    sc = api.vary(sc, {"workload.command": {**sc.workload.command, "evaluator": cmd}})
    rate_bps = units.parse_rate(rate)
    summary, row = run_from_repo(sc, "flower", out,
                                 lambda result: round_costs(result.table("report.csv"), result.traffic, rate_bps))
    return {"rate": rate, "rounds": rounds, "status": summary["status"], "final_accuracy": summary["final_accuracy"],
            **row}


def round_costs(report, traffic, rate_bps: float) -> dict:
    """Round seconds (rounds 2..R: ends of the ServerApp's evaluations), a worker's bytes per
    round each way, their time at `rate_bps`, and the workers' training seconds."""
    ends = report[report.key == "round_end_s"].sort_values("step")
    times = report[report.key == "accuracy"].sort_values("step").time.to_numpy()  # run time of each end
    if len(ends) < 3:
        return {"measured_rounds": 0}
    round_s = np.diff(ends.value.to_numpy())[1:]  # round r = end r - end r-1, r >= 2
    per_way = {}
    for direction in ("down", "up"):
        per_worker = []
        for _node, t in traffic[(traffic.direction == direction) & (traffic.node.str.match(r"w\d+$"))].groupby("node"):
            t = t.sort_values("time")
            at = np.interp([times[1], times[-1]], t.time.to_numpy(), t.bytes.to_numpy().astype(float))
            per_worker.append((at[1] - at[0]) / (len(times) - 2))
        per_way[direction] = float(np.mean(per_worker)) if per_worker else float("nan")
    train = report[(report.key == "train_seconds") & (report.step >= 2)].value
    transfer_s = (per_way["down"] + per_way["up"]) * 8 / rate_bps
    train_s = float(train.median()) if len(train) else float("nan")
    median = float(np.median(round_s))
    return {"measured_rounds": int(len(round_s)), "round_median_s": median,
            "round_min_s": float(round_s.min()), "round_max_s": float(round_s.max()),
            "down_bytes_per_round": per_way["down"], "up_bytes_per_round": per_way["up"],
            "transfer_s": transfer_s, "train_median_s": train_s, "rest_s": median - transfer_s - train_s}


def follows_the_bytes(rows: list[dict], tolerance: float = 0.20, least_s: float = 1.0) -> list[dict]:
    """Each slower rate against the fastest: added round time / added transfer time."""
    measured = [r for r in rows if r.get("measured_rounds")]
    if len(measured) < 2:
        return []
    base = min(measured, key=lambda r: r["transfer_s"])
    out = []
    for r in measured:
        added_transfer = r["transfer_s"] - base["transfer_s"]
        if r is base or added_transfer < least_s:
            continue
        added_round = r["round_median_s"] - base["round_median_s"]
        ratio = added_round / added_transfer
        out.append({"rate": r["rate"], "base": base["rate"], "added_round_s": added_round,
                    "added_transfer_s": added_transfer, "ratio": ratio, "ok": abs(ratio - 1) <= tolerance})
    return out


def flower_app_benchmark(rates: list[str], *, rounds: int = 4, out_dir: Path | None = None,
                         say: Callable[[str], None] = print) -> dict:
    rows = []
    for rate in rates:
        row = flower_app_run(rate, rounds=rounds)
        row["ok"] = row["status"] == "completed" and row.get("measured_rounds", 0) >= rounds - 1
        if row.get("measured_rounds"):
            say(f"flower app at {rate}: round {row['round_median_s']:.2f} s (median of {row['measured_rounds']}; "
                f"{row['round_min_s']:.2f}-{row['round_max_s']:.2f}), a worker moves "
                f"{row['down_bytes_per_round'] / 1e6:.2f} MB down + {row['up_bytes_per_round'] / 1e6:.2f} MB up "
                f"= {row['transfer_s']:.2f} s at the link rate, trains {row['train_median_s']:.2f} s, "
                f"rest {row['rest_s']:.2f} s; accuracy {row['final_accuracy']}")
        else:
            say(f"flower app at {rate}: {row['status']}, no rounds measured")
        rows.append(row)
    follows = follows_the_bytes(rows)
    for r in follows:
        say(f"flower app at {r['rate']}: a round gains {r['added_round_s']:.2f} s over {r['base']}, its bytes "
            f"{r['added_transfer_s']:.2f} s at the link rate: ratio {r['ratio']:.2f} {'ok' if r['ok'] else 'OFF'}")
    out = {"benchmark": "flower-app", "rounds": rounds, "rows": rows, "follows_the_bytes": follows,
           "ok": all(r["ok"] for r in rows + follows),
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return save_result(out, out_dir, "flower-app.json", say)
