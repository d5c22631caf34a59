"""How steady is a small CFS quota? Training steps timed in fresh processes, each in a cgroup of
its own with a fixed quota, pinned to CPU 0: the wall and CPU time of a step per repetition.

A `device:` node's quota is calibrated to make its step take the device's time (testbed/run/
devices.py); if the CPU a step costs under the quota moves between windows of a few seconds, no
check under the quota can pin the step time closer than that spread. This measures the spread:
per process and per repetition, at each quota, beside the unthrottled step.

    sudo .venv/bin/python benchmarks/quota_noise.py [--model resnet_small] [--quotas 0.052,0.10,1]
        [--processes 3] [--repetitions 4] [--rep-s 3.0] [--out benchmarks/results/quota-noise.json]

Root only (it makes cgroups); run it alone (`flock /tmp/edgebed-heavy.lock`). Results: BENCHMARKS.md,
"Device profiles".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, os, sys
from testbed.node.calibrate import measure_steps
os.sched_setaffinity(0, {0})
r = measure_steps(sys.argv[1], "mnist5k", repetitions=int(sys.argv[2]), min_rep_s=float(sys.argv[3]))
print(json.dumps({"step_s": r["step_s"], "cpu_s": r["cpu_s"]}))
"""


def _cgroup(name: str) -> tuple[Path, str]:
    """A fresh CPU cgroup (v2 unified, else v1's cpu controller) and its kind."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists():
        (Path("/sys/fs/cgroup") / "cgroup.subtree_control").write_text("+cpu")
        path, kind = Path("/sys/fs/cgroup") / name, "v2"
    else:
        path, kind = Path("/sys/fs/cgroup/cpu") / name, "v1"
    path.mkdir(exist_ok=True)
    return path, kind


def _set_quota(path: Path, kind: str, cores: float, period_us: int = 100_000) -> None:
    quota = -1 if cores >= 1 else int(cores * period_us)
    if kind == "v2":
        (path / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {period_us}")
    else:
        (path / "cpu.cfs_period_us").write_text(str(period_us))
        (path / "cpu.cfs_quota_us").write_text(str(quota))


def _one(path: Path, model: str, reps: int, rep_s: float) -> dict:
    def enter() -> None:
        (path / "cgroup.procs").write_text(str(os.getpid()))

    out = subprocess.run([sys.executable, "-c", CHILD, model, str(reps), str(rep_s)], preexec_fn=enter,
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet_small")
    ap.add_argument("--quotas", default="0.052,0.10,1")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--repetitions", type=int, default=4)
    ap.add_argument("--rep-s", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/quota-noise.json"))
    a = ap.parse_args()
    path, kind = _cgroup(f"eb-quota-noise-{os.getpid()}")
    rows = []
    try:
        for cores in (float(q) for q in a.quotas.split(",")):
            _set_quota(path, kind, cores)
            for p in range(a.processes):
                r = _one(path, a.model, a.repetitions, a.rep_s)
                rows.append({"quota_cores": cores, "process": p, **r})
                print(f"quota {cores:5.3f} process {p}: step ms {[round(x * 1e3, 1) for x in r['step_s']]} "
                      f"CPU ms {[round(x * 1e3, 1) for x in r['cpu_s']]}", flush=True)
    finally:
        path.rmdir()
    summary = {}
    for cores in dict.fromkeys(r["quota_cores"] for r in rows):
        mine = [r for r in rows if r["quota_cores"] == cores]
        cpu = [x for r in mine for x in r["cpu_s"]]
        wall = [x for r in mine for x in r["step_s"]]
        summary[str(cores)] = {"cpu_ms_median": statistics.median(cpu) * 1e3, "cpu_spread": spread(cpu),
                               "step_ms_median": statistics.median(wall) * 1e3, "step_spread": spread(wall),
                               "process_means_cpu_ms": [statistics.mean(r["cpu_s"]) * 1e3 for r in mine]}
        s = summary[str(cores)]
        print(f"quota {cores:5.3f}: CPU/step median {s['cpu_ms_median']:.1f} ms, spread {s['cpu_spread']:.0%}; "
              f"step median {s['step_ms_median']:.1f} ms, spread {s['step_spread']:.0%}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"benchmark": "quota-noise", "model": a.model, "cgroup": kind,
                                 "repetitions": a.repetitions, "rep_s": a.rep_s, "kernel": os.uname().release,
                                 "date": time.strftime("%Y-%m-%d %H:%M:%S"), "summary": summary, "rows": rows},
                                indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
