#!/usr/bin/env python3
"""What the fidelity monitor says about real runs (records.fidelity's rule): the smoke scenario
(its quotas add up to 2 cores, this machine's all) several times, and a run that promises more
CPU than the machine has (4 workers at 0.8 core, each also running a busy loop in its own cgroup
so that it always wants its quota; a PS and an evaluator at 0.1: 3.4 cores).

Each run is `edgebed up SCENARIO --runtime netns` (or `--runtime docker`); per node it reports the quota, the intervals
judged, the starved seconds, the mean CPU got and the mean share of time waiting for a CPU, and
whether `up` warned before the start. Needs root; run it alone on the machine (under
`flock /tmp/edgebed-heavy.lock`), since anything else running competes for the same cores.

    flock /tmp/edgebed-heavy.lock .venv/bin/python benchmarks/fidelity_smoke.py --reps 3
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

REPO = Path(__file__).resolve().parent.parent
EB = str(Path(sys.executable).with_name("edgebed"))

OVERSUBSCRIBED = """name: oversubscribed
seed: 1
runtime: netns
workload: {model: adacomp_cnn, dataset: mnist5k, batch_size: 32, lr: 0.05, eval_interval: 1000}
stop: {seconds: 30}
algorithm: {name: asgd}
profiles:
  small: {cpus: 0.1}
  device: {cpus: 0.8, uplink: 20mbit, stress: {cpu: 1.0}}  # always wants its 0.8 core
ps: {profile: small}
evaluator: {profile: small}
workers: [{count: 4, profile: device}]
"""


def node_table(run_dir: Path) -> dict:
    """Per node: its quota, intervals judged, starved seconds, mean cores got and mean waiting share."""
    sys.path.insert(0, str(REPO))
    from testbed.records import fidelity as F

    out: dict = {}
    for iv in F.assess_run(run_dir):
        if iv.kind != "node":
            continue
        e = out.setdefault(iv.name, {"promised": iv.promised, "got": [], "wait": [], "starved_s": 0.0,
                                     "verdicts": {}, "flagged": []})
        e["got"].append(iv.got)
        e["wait"].append(iv.wait or 0.0)
        e["verdicts"][iv.verdict] = e["verdicts"].get(iv.verdict, 0) + 1
        if iv.flagged:
            e["starved_s"] += iv.end - iv.start
            e["flagged"].append([round(iv.start, 1), round(iv.end, 1), round(iv.got, 3), round(iv.wait or 0, 3)])
    for e in out.values():
        e["judged"] = len(e["got"])
        e["mean_got"] = round(statistics.fmean(e.pop("got")), 3)
        e["mean_wait"] = round(statistics.fmean(e.pop("wait")), 3)
        e["starved_s"] = round(e["starved_s"], 1)
    return out


def link_table(run_dir: Path) -> dict:
    """Per shaped link direction: its rate, intervals judged, saturated, and short of the rate."""
    from testbed.records import fidelity as F

    out: dict = {}
    for iv in F.assess_run(run_dir):
        if iv.kind == "link" and iv.promised is not None:
            e = out.setdefault(iv.name, {"rate_bps": iv.promised, "judged": 0, "saturated": 0, "shortfall": []})
            e["judged"] += 1
            e["saturated"] += iv.verdict in ("faithful", "shortfall")
            if iv.flagged:
                e["shortfall"].append([round(iv.start, 1), round(iv.got / iv.promised, 3)])
    return out


def one_run(scenario: Path, out: Path, runtime: str) -> dict:
    started = time.time()
    r = subprocess.run([EB, "up", str(scenario), "--runtime", runtime, "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    return {"scenario": scenario.name, "runtime": runtime, "exit": r.returncode, "status": summary.get("status"),
            "wall_s": round(time.time() - started, 1), "steps": summary.get("steps"),
            "faithful": summary["fidelity"]["faithful"],
            "warning": next((ln for ln in r.stdout.splitlines() if "promised" in ln), None),
            "verdict_line": next((ln for ln in r.stdout.splitlines() if ln.startswith("fidelity:")), None),
            "nodes": node_table(out), "links": link_table(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="smoke runs")
    ap.add_argument("--oversubscribed", type=int, default=1, help="runs of the 3.4-core scenario")
    ap.add_argument("--runtime", default="netns", help="netns | docker")
    ap.add_argument("--keep", default=None, help="keep the runs' directories here")
    ap.add_argument("--out", default=None, help="default benchmarks/results/fidelity-smoke-RUNTIME.json")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="eb-fidelity-", dir=args.keep) as tmp:
        over = Path(tmp) / "oversubscribed.yaml"
        over.write_text(OVERSUBSCRIBED)
        plan = [REPO / "scenarios/smoke.yaml"] * args.reps + [over] * args.oversubscribed
        for i, sc in enumerate(plan):
            res = one_run(sc, Path(tmp) / f"run{i}", args.runtime)
            runs.append(res)
            print(f"{res['scenario']}: {res['status']}, {res['wall_s']} s, {res['verdict_line']}", flush=True)
            for node, e in sorted(res["nodes"].items()):
                print(f"  {node:10s} quota {e['promised']}  judged {e['judged']:3d}  starved {e['starved_s']:5.1f} s  "
                      f"got {e['mean_got']:.3f}  wait {e['mean_wait']:.3f}  {e['verdicts']}  {e['flagged'][:6]}",
                      flush=True)
            for link, e in sorted(res["links"].items()):
                print(f"  {link:10s} rate {e['rate_bps'] / 1e6:g} Mbit/s  judged {e['judged']}  saturated "
                      f"{e['saturated']}  short {e['shortfall'][:6]}", flush=True)
            if args.keep:
                import shutil
                shutil.copytree(Path(tmp) / f"run{i}", Path(args.keep) / f"{res['scenario']}-{i}", dirs_exist_ok=True)
    out = args.out or str(REPO / f"benchmarks/results/fidelity-smoke-{args.runtime}.json")
    Path(out).write_text(json.dumps({"benchmark": "fidelity-smoke", "date": time.strftime("%Y-%m-%d"),
                                     "runtime": args.runtime, "runs": runs}, indent=1))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
