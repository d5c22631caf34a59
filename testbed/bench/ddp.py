"""`edgebed bench ddp`: an unmodified DDP program (examples/ddp/train.py, gloo, torchrun) on
emulated workers, its all-reduce time per step against the ring all-reduce bound

    2 (N - 1) / N x model bytes / link rate

at each link rate (every worker's access link, both directions). The program times each step's
all-reduce itself (a DDP communication hook) and reports it (edgebed.report -> report.csv). The
first steps (connections, warm-up) are left out; the median of the rest is compared. The bound
counts gradient bytes; the wire also carries TCP/IP and Ethernet headers (~4.5% at 1500-byte
frames), so a faithful link reads ~1.05 of it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import run_from_repo, save_result
from testbed.scenario import units

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "byo" / "ddp.yaml"
WARMUP_STEPS = 3


def ring_bound_seconds(model_bytes: float, workers: int, rate_bps: float) -> float:
    return 2 * (workers - 1) / workers * model_bytes * 8 / rate_bps


def ddp_run(rate: str, *, workers: int = 2, steps: int = 20, cpus: float = 0.8, out: Path | None = None) -> dict:
    """One run at `rate`: median all-reduce seconds (after the warm-up), the bound, their ratio."""
    from testbed.run import api

    sc = api.scenario(SCENARIO, {"profiles.edge": {"bandwidth": rate, "cpus": cpus}, "workers": [
        {"count": workers, "profile": "edge"}], "name": f"ddp-{rate}"})
    cmd = sc.workload.command["worker"].replace("--steps 20", f"--steps {steps}")
    sc = api.vary(sc, {"workload.command": {"worker": cmd}})
    summary, rep = run_from_repo(sc, "ddp", out, lambda result: result.table("report.csv"))
    ar = rep[(rep.key == "allreduce_seconds") & (rep.step > WARMUP_STEPS)] if len(rep) else rep
    model_bytes = float(rep[rep.key == "model_bytes"].value.iloc[0]) if len(rep) else float("nan")
    measured = float(ar.value.median()) if len(ar) else float("nan")
    bound = ring_bound_seconds(model_bytes, workers, units.parse_rate(rate))
    return {"rate": rate, "workers": workers, "status": summary["status"], "steps_measured": len(ar),
            "model_bytes": model_bytes, "allreduce_median_s": measured, "ring_bound_s": bound,
            "ratio": measured / bound, "allreduce_p10_s": float(ar.value.quantile(0.1)) if len(ar) else None,
            "allreduce_p90_s": float(ar.value.quantile(0.9)) if len(ar) else None}


def ddp_benchmark(rates: list[str], *, workers: int = 2, steps: int = 20, tolerance: float = 0.15,
                  out_dir: Path | None = None, say: Callable[[str], None] = print) -> dict:
    rows = []
    for rate in rates:
        row = ddp_run(rate, workers=workers, steps=steps)
        row["ok"] = row["status"] == "completed" and abs(row["ratio"] - 1) <= tolerance
        say(f"ddp {workers} workers at {rate}: all-reduce median {row['allreduce_median_s']:.3f} s over "
            f"{row['steps_measured']} steps, ring bound {row['ring_bound_s']:.3f} s "
            f"({row['model_bytes'] / 1e6:.2f} MB), "
            f"ratio {row['ratio']:.3f} {'ok' if row['ok'] else 'OFF'}")
        rows.append(row)
    out = {"benchmark": "ddp", "workers": workers, "tolerance": tolerance, "rows": rows,
           "ok": all(r["ok"] for r in rows), "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return save_result(out, out_dir, f"ddp-{workers}.json", say)
