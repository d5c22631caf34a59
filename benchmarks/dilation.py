#!/usr/bin/env python3
"""Virtual time, measured (scenario.dilation): the same scenario at several dilation factors k
(and `auto`), each run its own `edgebed up SCENARIO --dilation K`; per run, in the world's
seconds, the time to the target accuracy, the median training step (compute) and the median
round (a worker's step to its next: BSP's round), the wall time and the fidelity verdict; per k,
the spread over reruns; and each k's medians against k = 1's.

    consistency: the smoke scenario at k = 1, 2, 4, 8 (`--ks`), `--reps` runs each
    rescue: an oversubscribed BSP world (16 paced workers of half a core each on this host) at
            k = 1 and auto, its round against the analytic one (the slowest device step, plus
            the push and pull at the stated rates, plus the link delays)
    spread: `--reps` reruns of one seed at auto (the smoke under ASGD; `--scenario` another)

Needs root; run it alone on the machine (`flock /tmp/edgebed-heavy.lock`): anything else
running competes for the cores the runs are judged on.

    flock /tmp/edgebed-heavy.lock .venv/bin/python benchmarks/dilation.py consistency --ks 1 2 4 --reps 3
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EB = str(Path(sys.executable).with_name("edgebed"))

RESCUE = """name: rescue
seed: 1
runtime: netns
workload: {model: adacomp_cnn, dataset: mnist5k, batch_size: 32, lr: 0.05, eval_interval: 1000}
stop: {steps: 40}
algorithm: {name: bsp}
devices:
  half-core:
    description: a device of half this host's core (the benchmark's own)
    cores: 1
    memory: 1GiB
    gflops: GFLOPS
    source: "benchmarks/dilation.py: half the GFLOP/s this host's core measured for the model"
    derivation: "measured here at run time"
    estimate: true
profiles:
  server: {cpus: 1.0, bandwidth: 1gbit}
  device: {device: half-core, bandwidth: 100mbit, latency: 5ms}
ps: {profile: server}
evaluator: {profile: {cpus: 0.1}}
workers: [{count: 16, profile: device}]
"""


def world_stats(run_dir: Path) -> dict:
    """From a run's records (the world's seconds): time to target, median step and round."""
    summary = json.loads((run_dir / "summary.json").read_text())
    steps: dict[str, list[tuple[float, float]]] = {}
    payload = []
    with open(run_dir / "steps.csv") as f:
        for row in csv.DictReader(f):
            steps.setdefault(row["node"], []).append((float(row["time"]), float(row["compute_seconds"] or 0)))
            payload.append(float(row["bytes_sent"] or 0))
    compute = [c for rows in steps.values() for _, c in rows[2:]]  # the first steps warm up
    rounds = [b[0] - a[0] for rows in steps.values() for a, b in zip(rows[2:], rows[3:])]
    fid = summary.get("fidelity", {})
    flagged = {n: e["starved_seconds"] for n, e in fid.get("nodes", {}).items() if e.get("starved_seconds")}
    return {"dilation": summary.get("dilation"), "status": summary.get("status"),
            "time_to_target_s": summary.get("time_to_target_seconds"),
            "median_step_s": statistics.median(compute) if compute else None,
            "median_round_s": statistics.median(rounds) if rounds else None,
            "world_s": summary.get("seconds"), "wall_s": summary.get("wall_seconds"),
            "faithful": fid.get("faithful"), "starved_s": flagged, "enough": fid.get("dilation", {}).get("enough"),
            "payload_bytes": statistics.median(payload) if payload else None}


def run_once(scenario: Path, k: str, out_root: Path, tag: str, extra: list[str]) -> dict:
    out = out_root / tag
    done = subprocess.run([EB, "up", str(scenario), "--dilation", k, "-o", str(out), "-q", *extra],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 or not (out / "summary.json").exists():
        return {"dilation": k, "status": "failed", "error": (done.stderr or done.stdout).strip()[-300:]}
    row = world_stats(out)
    row["asked"] = k
    print(json.dumps({"run": tag, **row}), flush=True)
    return row


def spread(values: list) -> dict:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"n": 0}
    mean = statistics.fmean(xs)
    cv = statistics.stdev(xs) / mean if len(xs) > 1 and mean else 0.0
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs), "cv": round(cv, 4)}


def by_k(rows: list[dict]) -> dict:
    out: dict = {}
    for k in sorted({str(r["asked"]) for r in rows}):
        mine = [r for r in rows if str(r["asked"]) == k and r.get("status") != "failed"]
        out[k] = {m: spread([r.get(m) for r in mine]) for m in ("time_to_target_s", "median_step_s",
                                                                  "median_round_s", "wall_s")}
        out[k]["faithful_runs"] = sum(1 for r in mine if r.get("faithful"))
        out[k]["runs"] = len(mine)
    base = out.get("1") or out.get("1.0")
    for stats in out.values():  # each k's medians against k = 1's
        for m in ("time_to_target_s", "median_step_s", "median_round_s"):
            b, x = (base or {}).get(m, {}).get("median"), stats[m].get("median")
            stats[m]["vs_k1"] = round(x / b - 1, 4) if b and x else None
    return out


def consistency(args, out_root: Path) -> dict:
    scenario = Path(args.scenario or REPO / "scenarios" / "smoke.yaml")
    rows = [run_once(scenario, str(k), out_root, f"k{k}-{rep}", ["--runtime", args.runtime])
            for rep in range(args.reps) for k in args.ks]  # reps interleaved: drift spreads over every k
    return {"scenario": str(scenario), "runs": rows, "by_k": by_k(rows)}


def host_step() -> dict:
    """The model's training step on one core of this host, as a device's calibration measures it."""
    sys.path.insert(0, str(REPO))
    from testbed.plan import parse_scenario
    from testbed.run.dilation import host_step as measure

    return measure(parse_scenario({"workload": {"batch_size": 32}}))


def analytic_round(flops: float, device_gflops: float, payload_bytes: float, workers: int = 16) -> float:
    """BSP's round in the rescue world: the slowest device's step, then the pushes in and the
    pulls out, each limited by the slower of a worker's 100 mbit/s link and the PS's 1 gbit/s
    shared by every worker, then the 5 ms delay of each of the two ways."""
    step = flops / (device_gflops * 1e9)
    one_way = max(payload_bytes * 8 / 100e6, workers * payload_bytes * 8 / 1e9)
    return step + 2 * one_way + 2 * 0.005


def rescue(args, out_root: Path) -> dict:
    measured = host_step()
    g = measured["flops_per_step"] / measured["cpu_s_median"] / 1e9
    scenario = out_root / "rescue.yaml"
    scenario.write_text(RESCUE.replace("GFLOPS", f"{g / 2:.4f}"))
    rows = [run_once(scenario, k, out_root, f"rescue-{k}-{rep}", []) for rep in range(args.reps) for k in ("1", "auto")]
    for row in rows:
        if row.get("payload_bytes"):
            row["analytic_round_s"] = analytic_round(measured["flops_per_step"], g / 2, row["payload_bytes"])
            row["round_vs_analytic"] = round(row["median_round_s"] / row["analytic_round_s"] - 1, 4)
    return {"host_gflops_per_core": g, "device_gflops": g / 2, "runs": rows, "by_k": by_k(rows)}


def rerun_spread(args, out_root: Path) -> dict:
    scenario = Path(args.scenario or REPO / "scenarios" / "smoke.yaml")
    extra = ["--runtime", args.runtime] + ([] if args.scenario else ["--algorithm", "asgd"])
    rows = [run_once(scenario, "auto", out_root, f"spread-{rep}", extra) for rep in range(args.reps)]
    return {"scenario": str(scenario), "runs": rows, "spread": by_k(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("consistency", "rescue", "spread"))
    ap.add_argument("--ks", type=float, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", default="netns")
    ap.add_argument("--scenario", default=None)
    ap.add_argument("--out", type=Path, default=None, help="a JSON file for the results")
    args = ap.parse_args()
    args.ks = [int(k) if k == int(k) else k for k in args.ks]
    with tempfile.TemporaryDirectory(prefix="edgebed-dilation-") as tmp:
        result = {"consistency": consistency, "rescue": rescue, "spread": rerun_spread}[args.what](args, Path(tmp))
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
