#!/usr/bin/env bash
# The control channel's cost on a whole run: scenarios/smoke.yaml on RUNTIME (netns, docker, or
# swarm with a swarm or `edgebed lab up --hosts 2` up), alternating the code at commit BEFORE (in a
# worktree of its own, same venv) and this tree, N runs each after one warm-up of each (image
# builds); prints each run's summary.json startup_seconds (up -> first step) and wall_seconds, and
# the medians. Needs root; run it alone on the machine (flock /tmp/edgebed-heavy.lock ...).
#   benchmarks/channel_cost.sh RUNTIME BEFORE [N]
set -euo pipefail
cd "$(dirname "$0")/.."
RT=$1 BEFORE=$2 N=${3:-3}
HERE=$PWD PY=$PWD/.venv/bin/python OUT=$PWD/runs/channel-cost/$RT
mkdir -p "$OUT"
WT=$(mktemp -d /tmp/edgebed-before-XXXXXX)
git worktree add -q --detach "$WT" "$BEFORE"
trap 'git -C "$HERE" worktree remove --force "$WT"' EXIT
sed "s/^runtime: .*/runtime: $RT/" scenarios/smoke.yaml > "$OUT/smoke.yaml"
run() { (cd "$1" && PYTHONPATH="$1" "$PY" -m testbed.cli up "$OUT/smoke.yaml" -o "$OUT/$2" -q > "$OUT/$2.log" 2>&1); }
rm -rf "$OUT"/before-* "$OUT"/after-*
run "$WT" before-warm && run "$HERE" after-warm
for i in $(seq 1 "$N"); do run "$WT" "before-$i"; run "$HERE" "after-$i"; done
"$PY" - "$OUT" "$N" <<'PY'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
for side in ("before", "after"):
    runs = [json.load(open(f"{out}/{side}-{i}/summary.json")) for i in range(1, n + 1)]
    up, wall = [r["startup_seconds"] for r in runs], [r["wall_seconds"] for r in runs]
    print(f"{side}: up -> first step {up} median {statistics.median(up):.2f} s; "
          f"run {wall} median {statistics.median(wall):.2f} s; reasons {[r['reason'] for r in runs]}")
PY
