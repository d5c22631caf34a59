#!/usr/bin/env bash
# DLion vs its baselines on the two DLion profiles (netns runtime, needs root):
#   P-network (scenarios/topologies/dlion-p-network.yaml): 3 workers in site a, 1 in b, 1 Gbit/s LANs, 100 Mbit/s WAN
#   P-compute (scenarios/dlion-p-compute.yaml): 1 high + 3 low workers (3:1 CPU), one 1 Gbit/s LAN
# Each run as long as its scenario says (40 s, 60 s); prints accuracy, steps and bytes per algorithm. Runs land in runs/decentralized/.
set -euo pipefail
cd "$(dirname "$0")/.."
EB=${EB:-.venv/bin/edgebed}
OUT=runs/decentralized
mkdir -p $OUT
for alg in dlion gaia ako; do
  rm -rf $OUT/p-network-$alg $OUT/p-compute-$alg
  $EB up scenarios/topologies/dlion-p-network.yaml --runtime netns --algorithm $alg --out $OUT/p-network-$alg -q \
    $( [ $alg = dlion ] && echo "--param total_batch=128" ) || true
  $EB up scenarios/dlion-p-compute.yaml --runtime netns --algorithm $alg --out $OUT/p-compute-$alg -q || true
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
import pandas as pd
print("| profile | algorithm | best acc | final acc | time to 0.9 (s) | mean iterations | batch (mean per worker) | MB sent by workers | WAN MB |")
print("|---|---|---|---|---|---|---|---|---|")
for d in sorted(Path(sys.argv[1]).iterdir()):
    s = json.loads((d / "summary.json").read_text())
    ev = pd.read_csv(d / "eval.csv"); st = pd.read_csv(d / "steps.csv"); tr = pd.read_csv(d / "traffic.csv")
    hit = ev[ev.accuracy >= 0.9]
    last = tr.sort_values("time").groupby(["node", "link", "direction"]).bytes.last()
    wan = sum(v for (n, l, _), v in last.items() if str(l).startswith("wan:"))
    bs = st.groupby("node").batch_size.mean().round().astype(int).to_dict()
    prof, alg = d.name.rsplit("-", 1)
    print(f"| {prof} | {alg} | {s['best_accuracy']:.3f} | {s['final_accuracy']:.3f} | "
          f"{hit.time.min() if len(hit) else float('nan'):.1f} | {st.groupby('node').step.max().mean():.0f} | "
          f"{' '.join(f'{k}:{v}' for k, v in bs.items())} | {(s.get('worker_egress_bytes') or 0) / 1e6:.0f} | {wan / 1e6:.1f} |")
PY
