#!/usr/bin/env bash
# What the CFS period does to slow workers (netns runtime, needs root): DLion's P-compute at ci
# scale (scenarios/dlion/p-compute.ci.yaml, 0.6 + 3 x 0.2 CPU) with and without capacity-aware
# batching, over 10 ms periods (the scenario's) and over the 100 ms default. Four 90 s runs
# (about 7 minutes); they land in runs/cpu-period/, and a table is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
EB=${EB:-.venv/bin/edgebed}
PY=${PY:-.venv/bin/python}
OUT=runs/cpu-period
mkdir -p $OUT
for period in 10ms 100ms; do
  # The same scenario with every profile's cpu_period set to $period.
  $PY - "$period" > $OUT/p-compute-$period.yaml <<'PY'
import sys, yaml
d = yaml.safe_load(open("scenarios/dlion/p-compute.ci.yaml"))
for p in d["profiles"].values():
    p["cpu_period"] = sys.argv[1]
d["name"] = "cpu-period-" + sys.argv[1]
print(yaml.safe_dump(d, sort_keys=False))
PY
  for cab in true false; do
    rm -rf $OUT/$period-cab-$cab
    $EB up $OUT/p-compute-$period.yaml --param capacity_aware=$cab --out $OUT/$period-cab-$cab -q
  done
done
$PY - "$OUT" <<'PY'
import sys
from pathlib import Path
import pandas as pd
print("| CFS period | capacity-aware | steps | batch high / low | compute + exchange a step (low) | to 0.7 | to 0.8 |")
print("|---|---|---|---|---|---|---|")
for period in ("10ms", "100ms"):
    for cab in ("true", "false"):
        d = Path(sys.argv[1]) / f"{period}-cab-{cab}"
        st, ev = pd.read_csv(d / "steps.csv"), pd.read_csv(d / "eval.csv")
        by = st.groupby("node")
        low = st[st.node.str.startswith("low")]
        hit = {a: ev[ev.accuracy >= a].time.min() for a in (0.7, 0.8)}
        print(f"| {period} | {'yes' if cab == 'true' else 'no'} | {by.size().max()} | "
              f"{st[st.node == 'high0'].batch_size.mean():.0f} / {low.batch_size.mean():.0f} | "
              f"{1000 * low.compute_seconds.mean():.0f} + {1000 * low.comm_seconds.mean():.0f} ms | "
              f"{hit[0.7]:.1f} s | {hit[0.8]:.1f} s |")
PY
