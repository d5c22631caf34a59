"""What an idle device costs on runtime swarm: a `bench fleet` scenario on the lab
(`edgebed lab up` first), and when its run starts, the memory in use (MemTotal - MemAvailable)
against before, and each container's supervisor and containerd shim from smaps_rollup (RSS, PSS,
private pages: what one more device adds). The lab's hosts share this machine, so their
processes are seen here. Needs root; run it with nothing else on the machine.

    python benchmarks/swarm_node_cost.py --devices 20 --out benchmarks/results/swarm-node-cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.bench.fleet import mem_used, rollup, scenario  # noqa: E402

MiB = 2**20
KINDS = {"supervisor": "--supervise", "shim": "containerd-shim"}


def processes() -> dict[str, list[dict[str, int]]]:
    """smaps_rollup of every container supervisor and shim on this machine."""
    out: dict[str, list[dict[str, int]]] = {k: [] for k in KINDS}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        except OSError:
            continue
        for kind, mark in KINDS.items():
            if mark in cmd and (r := rollup(int(pid))):
                out[kind].append(r)
    return out


def mean_mib(rows: list[dict[str, int]], key: str) -> float:
    return round(sum(r.get(key, 0) for r in rows) / max(1, len(rows)) / MiB, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="edgebed-swarm-node-cost-"))
    path = scratch / "s.yaml"
    path.write_text(yaml.safe_dump(scenario(args.devices, 5, "per_round", 30, "mlp", "swarm")))
    before = mem_used()
    up = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", str(path), "--out", str(scratch / "run")],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    res: dict = {}
    assert up.stdout is not None
    for line in up.stdout:
        if not res and line.startswith("run "):  # every node is up, no trainer yet
            at_run, procs = mem_used(), processes()
            res = {"benchmark": "swarm-node-cost", "devices": args.devices, "nodes": args.devices + 2,
                   "memory_in_use_before_mib": round(before / MiB), "memory_in_use_at_start_mib": round(at_run / MiB),
                   **{f"{kind}_{key.lower()}_mib": mean_mib(rows, key) for kind, rows in procs.items()
                      for key in ("Rss", "Pss", "Private_Dirty")},
                   "supervisors": len(procs["supervisor"]), "shims": len(procs["shim"])}
    up.wait()
    res.update(ok=up.returncode == 0 and bool(res), date=time.strftime("%Y-%m-%d %H:%M:%S"))
    print(json.dumps(res, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
