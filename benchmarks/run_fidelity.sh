#!/usr/bin/env bash
# Rerun the fidelity benchmarks of the netns runtime (needs root) and print the table
# that BENCHMARKS.md keeps. Results: benchmarks/results/*.json
set -euo pipefail
cd "$(dirname "$0")/.."
EB=${EB:-.venv/bin/edgebed}
OUT=benchmarks/results
for r in 1mbit 10mbit 100mbit 1gbit; do $EB bench link --rate $r --out $OUT; done
$EB bench link --rate 10mbit --flows 4 --out $OUT
for c in 0.1 0.25 0.5 1.0 1.5; do $EB bench cpu --cpus $c --seconds 8 --out $OUT; done
for l in 1% 10%; do $EB bench loss --loss $l --out $OUT; done
$EB bench delay --latency 0ms --count 200 --out $OUT
$EB bench delay --latency 20ms --count 200 --out $OUT
$EB bench delay --latency 20ms --jitter 5ms --count 200 --out $OUT
$EB bench delay --latency 50ms --count 100 --out $OUT
# The docker runtime (needs a running engine; `edgebed build` first or it builds on demand).
if docker info >/dev/null 2>&1; then
  $EB bench link --rate 10mbit --runtime docker --out $OUT
  $EB bench link --rate 100mbit --runtime docker --out $OUT
  for c in 0.25 0.5 1.0; do $EB bench cpu --cpus $c --seconds 8 --runtime docker --out $OUT; done
fi
for r in netns docker; do
  [ $r = docker ] && ! docker info >/dev/null 2>&1 && continue
  for n in 4 16; do $EB bench startup --workers $n --runtime $r --out $OUT; done
done
# Topologies: inside a site at the LAN rate, across sites at the WAN rate (both runtimes).
$EB bench topology --lan 1gbit --wan 100mbit --out $OUT
$EB bench topology --lan 100mbit --wan 10mbit --out $OUT
docker info >/dev/null 2>&1 && $EB bench topology --lan 1gbit --wan 100mbit --runtime docker --out $OUT
# ScaDLES Fig. 5: embedded broker + one producer process per topic, 3 KB samples.
for t in 4 16 32; do for r in 100 600; do $EB bench stream --topics $t --rate $r --out $OUT; done; done
.venv/bin/python benchmarks/report.py $OUT
