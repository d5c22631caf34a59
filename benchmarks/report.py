"""Print the Markdown tables of BENCHMARKS.md from benchmarks/results/*.json."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
rows = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]

def rt(r):
    return r.get("runtime", "netns")


print("| runtime | link | flows | direction | goodput Mbit/s | goodput / rate | wire Mbit/s | wire / rate |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "link"), key=lambda r: (rt(r), r["configured_bps"], r["flows"])):
    for d in r["results"]:
        print(f"| {rt(r)} | {r['configured_bps'] / 1e6:g} Mbit/s | {r['flows']} | {d['direction']} | {d['goodput_bps'] / 1e6:.3f} | "
              f"{100 * d['goodput_ratio']:.1f}% | {d.get('wire_bps', float('nan')) / 1e6:.3f} | "
              f"{100 * d.get('wire_ratio', float('nan')):.1f}% |")
print()
print("| runtime | CPU quota (cores) | achieved (cores) | error | busy loops |")
print("|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "cpu"), key=lambda r: (rt(r), r["quota_cores"])):
    print(f"| {rt(r)} | {r['quota_cores']:g} | {r['achieved_cores']:.3f} | {r['achieved_cores'] - r['quota_cores']:+.3f} | {r['busy_loops']} |")
print()
print("| loss configured | measured | datagrams | mechanism |")
print("|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "loss"), key=lambda r: r["configured"]):
    print(f"| {100 * r['configured']:g}% | {100 * r['measured']:.2f}% | {r['packets']} | {r['mechanism']} |")
print()
print("| latency each way | jitter | expected RTT | median RTT | p10 / p90 | stdev | mechanism |")
print("|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "delay"), key=lambda r: (r["latency_s"], r["jitter_s"])):
    rtts = sorted(r["rtts_s"])
    n = len(rtts)
    print(f"| {r['latency_s'] * 1000:g} ms | {r['jitter_s'] * 1000:g} ms | {r['expected_rtt_s'] * 1000:g} ms | "
          f"{r['median_rtt_s'] * 1000:.2f} ms | {rtts[n // 10] * 1000:.1f} / {rtts[9 * n // 10] * 1000:.1f} ms | "
          f"{r['stdev_rtt_s'] * 1000:.2f} ms | {r['mechanism']} |")
print()
print("| runtime | workers | up -> first training step | teardown | whole command |")
print("|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "startup"), key=lambda r: (rt(r), r["workers"])):
    print(f"| {rt(r)} | {r['workers']} | {r['startup_seconds']:.1f} s | {r['teardown_seconds']:.1f} s | "
          f"{r['total_seconds']:.1f} s |")
print()
print("| topics | target samples/s per topic | aggregate samples/s | per topic min / median | topics holding the rate | broker node CPU |")
print("|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "stream"), key=lambda r: (r["rate"], r["topics"])):
    a = sorted(t["achieved"] for t in r["per_topic"])
    cores = r["broker_node_cpu_seconds"] / (r["seconds"] + r["warmup"])
    print(f"| {r['topics']} | {r['rate']:g} | {r['aggregate_samples_per_s']:.0f} | {a[0]:.1f} / {a[len(a) // 2]:.1f} | "
          f"{r['topics_holding_rate']}/{r['topics']} | {cores:.2f} cores |")
print()
print("| runtime | LAN | WAN | path | direction | goodput | of configured | bytes on the WAN |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "topology"), key=lambda r: (rt(r), -r["lan_bps"])):
    for x in r["results"]:
        print(f"| {rt(r)} | {r['lan_bps'] / 1e6:g} Mbit/s | {r['wan_bps'] / 1e6:g} Mbit/s | {x['path']} | "
              f"{x['direction']} | {x['goodput_bps'] / 1e6:.2f} Mbit/s | {100 * x['goodput_ratio']:.1f}% | "
              f"{x['wan_bytes'] / 1e6:.2f} MB |")
dates = sorted(r["date"] for r in rows)
if dates:
    print(f"\nkernel {rows[0]['kernel']}, {dates[0]} to {dates[-1]}")
