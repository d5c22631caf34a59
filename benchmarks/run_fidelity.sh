#!/usr/bin/env bash
# Rerun the whole benchmark suite (needs root; docker parts when an engine answers; Mininet's
# side by side when Debian's mininet is installed) and print the tables BENCHMARKS.md keeps,
# with a plot per benchmark in benchmarks/plots/. Results: benchmarks/results/*.json
set -uo pipefail
cd "$(dirname "$0")/.."
EB=${EB:-.venv/bin/edgebed}
OUT=benchmarks/results
$EB bench all --out $OUT || echo "some benchmarks were outside their bounds (see above)"
# Two more topologies and ScaDLES Fig. 5 (embedded broker + one producer process per topic).
$EB bench topology --lan 100mbit --wan 10mbit --out $OUT
docker info >/dev/null 2>&1 && $EB bench topology --lan 1gbit --wan 100mbit --runtime docker --out $OUT
for t in 4 16 32; do for r in 100 600; do $EB bench stream --topics $t --rate $r --out $OUT; done; done
.venv/bin/python benchmarks/report.py $OUT --plots benchmarks/plots
