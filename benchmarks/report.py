"""Print the Markdown tables of BENCHMARKS.md from benchmarks/results/*.json, and with
--plots DIR draw a figure per benchmark (DIR/bench-*.png).

    python benchmarks/report.py [RESULTS_DIR] [--plots benchmarks/plots]
"""

import json
import sys
from pathlib import Path

args = sys.argv[1:]
plots = None
if "--plots" in args:
    i = args.index("--plots")
    plots = Path(args[i + 1])
    del args[i:i + 2]
out = Path(args[0] if args else "benchmarks/results")
rows = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
# results of other scripts (gpu_check, quota_noise, ...) carry no "benchmark" key: not these tables'
rows = [r for r in rows if isinstance(r, dict) and r.get("benchmark") not in (None, "suite", "soak")]

def rt(r):
    return r.get("runtime", "netns")


print("| runtime | link | flows | direction | goodput Mbit/s | goodput / rate | wire Mbit/s | wire / rate |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "link"), key=lambda r: (rt(r), r["configured_bps"], r["flows"])):
    for d in r["results"]:
        print(f"| {rt(r)} | {r['configured_bps'] / 1e6:g} Mbit/s | {r['flows']} | {d['direction']} | "
              f"{d['goodput_bps'] / 1e6:.3f} | "
              f"{100 * d['goodput_ratio']:.1f}% | {d.get('wire_bps', float('nan')) / 1e6:.3f} | "
              f"{100 * d.get('wire_ratio', float('nan')):.1f}% |")
print()
print("| runtime | CPU quota (cores) | CFS period | another node busy | achieved (cores) | error | busy loops |")
print("|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "cpu"),
                key=lambda r: (rt(r), r.get("others_busy", False), r["quota_cores"], r.get("cpu_period_s", 0.1))):
    print(f"| {rt(r)} | {r['quota_cores']:g} | {1000 * r.get('cpu_period_s', 0.1):g} ms | "
          f"{'yes' if r.get('others_busy') else 'no'} | {r['achieved_cores']:.3f} | "
          f"{r['achieved_cores'] - r['quota_cores']:+.3f} | {r['busy_loops']} |")
print()
print("| model | CPU quota | stress | mean compute step calm | with stress | slowdown | bound C/(C-s) |")
print("|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "stress"), key=lambda r: (r["cpus"], r["stress"])):
    print(f"| {r['model']} | {r['cpus']:g} | {r['stress']:g} | {1000 * r['calm_mean_s']:.1f} ms | "
          f"{1000 * r['stressed_mean_s']:.1f} ms | {r['slowdown']:.2f}x | {r['expected_slowdown']:.2f}x |")
print()
print("| hosts | link | CPU each | tool | up | stop | memory in use | goodput "
      "| edgebed / Mininet (up, stop, goodput) |")
print("|---|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "mininet"), key=lambda r: (r["configured_bps"], r["hosts"])):
    for tool in ("mininet", "edgebed"):
        d = r[tool]
        q = r["ratios"]
        last = (f"{q['up_seconds']:.2f}x, {q['stop_seconds']:.2f}x, {q['goodput_bps']:.3f}x" if tool == "edgebed"
                else "")
        print(f"| {r['hosts']} | {r['configured_bps'] / 1e6:g} Mbit/s | {r['cpus']:g} | {tool} | "
              f"{d['up_seconds']:.2f} s | "
              f"{d['stop_seconds']:.2f} s | {d['memory_used_bytes'] / 2**20:.0f} MiB | "
              f"{(d['goodput_bps'] or 0) / 1e6:.3f} Mbit/s | {last} |")
print()
print("| clients | steps a round | tool | round | ideal round | overhead a round | whole run "
      "| edgebed / Flower (round, overhead, whole run) |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "flower"), key=lambda r: r["clients"]):
    for tool in ("flower", "edgebed"):
        d, q = r[tool], r["ratios"]
        last = ", ".join("-" if q.get(k) is None else f"{q[k]:.2f}x" for k in ("round_s", "overhead_s", "total_s")) \
            if tool == "edgebed" else ""
        name = f"Flower {r.get('flwr_version', '')} (Ray)" if tool == "flower" else "edgebed (netns)"
        print(f"| {r['clients']} | {r['local_steps']} x {r['batch_size']} | {name} | {d['round_s']:.2f} s | "
              f"{r['ideal_round_s']:.2f} s | {d['overhead_s']:+.2f} s | {d['total_s']:.1f} s | {last} |")
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
def gib(v):
    return "-" if v is None else f"{v / 2**30:.2f} GiB"


def mib(v):
    return "-" if v is None else f"{v / 2**20:.0f} MiB"


print("| runtime | workers | up -> first training step | up -> every worker stepping | teardown | workers trained "
      "| host memory in use | a worker's peak |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "startup"), key=lambda r: (rt(r), r["workers"])):
    every = r.get("all_workers_stepping_seconds")
    print(f"| {rt(r)} | {r['workers']} | {r['startup_seconds']:.1f} s | {'-' if every is None else f'{every:.1f} s'} | "
          f"{r['teardown_seconds']:.1f} s | {r.get('workers_trained', '-')} | {gib(r.get('host_memory_used_bytes'))} | "
          f"{mib(r.get('worker_peak_memory_bytes'))} |")
print()
print("| runtime | parameters | message | link | measured | ideal 32P/B + RTT | vs ideal "
      "| vs ideal with TCP/IP/Ethernet framing |")
print("|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "update"),
                key=lambda r: (rt(r), r["configured_bps"], r["params"])):
    print(f"| {rt(r)} | {r['params'] / 1e6:g}M | {r['message_bytes'] / 1e6:.2f} MB | "
          f"{r['configured_bps'] / 1e6:g} Mbit/s | "
          f"{r['median_s']:.3f} s | {r['ideal_s']:.3f} s | {100 * (r['ratio'] - 1):+.1f}% | "
          f"{100 * (r['ratio_to_framed'] - 1):+.1f}% |")
print()
print("| model | batch | CPU quota | threads | compute step in edgebed | bare PyTorch loop | overhead |")
print("|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "overhead"), key=lambda r: (r["model"], r["cpus"])):
    print(f"| {r['model']} | {r['batch_size']} | {r['cpus']:g} | {r['threads']} | "
          f"{1000 * r['edgebed_median_s']:.1f} ms | "
          f"{1000 * r['bare_median_s']:.1f} ms | {100 * r['overhead']:+.1f}% |")
print()
print("| topics | target samples/s per topic | aggregate samples/s | per topic min / median | topics holding the rate "
      "| broker node CPU |")
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
print()
print("| strategy | params | steps | payload sent a step | wire beyond it a step | up: payload | up: wire "
      "| wire / payload | down: payload | down: wire | wire / payload |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in sorted((r for r in rows if r["benchmark"] == "wire"), key=lambda r: r["algorithm"]):
    params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
    print(f"| {r['algorithm']} | {params} | {r['steps']} | {r['payload_up_per_step_bytes'] / 1e3:.1f} KB | "
          f"{r['wire_overhead_up_per_step_bytes'] / 1e3:.1f} KB | "
          f"{r['payload_up_bytes'] / 1e6:.2f} MB | {r['wire_up_bytes'] / 1e6:.2f} MB | "
          f"{r['wire_over_payload_up']:.3f} | "
          f"{r['payload_down_bytes'] / 1e6:.2f} MB | {r['wire_down_bytes'] / 1e6:.2f} MB | "
          f"{r['wire_over_payload_down']:.3f} |")
dates = sorted(r["date"] for r in rows if r.get("date"))
if dates:
    print(f"\nkernel {rows[0]['kernel']}, {dates[0]} to {dates[-1]}")


def draw(rows, where: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where.mkdir(parents=True, exist_ok=True)

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(where / f"bench-{name}.png", dpi=110)
        plt.close(fig)
        print(f"wrote {where / f'bench-{name}.png'}")

    def of(kind):
        return [r for r in rows if r["benchmark"] == kind]

    if of("link"):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for (runtime, flows), marker in zip(sorted({(rt(r), r["flows"]) for r in of("link")}), "osd^v"):
            pts = [(r["configured_bps"] / 1e6, d["wire_ratio"], d["goodput_ratio"]) for r in of("link")
                   if rt(r) == runtime and r["flows"] == flows for d in r["results"]]
            ax.scatter([p[0] for p in pts], [100 * p[1] for p in pts], marker=marker,
                       label=f"{runtime}, {flows} flow(s): wire")
            ax.scatter([p[0] for p in pts], [100 * p[2] for p in pts], marker=marker, facecolors="none",
                       edgecolors="0.4", label=f"{runtime}, {flows} flow(s): TCP goodput")
        ax.axhspan(97, 103, color="tab:green", alpha=0.1, label="goal: within 3%")
        ax.set_xscale("log")
        ax.set_xlabel("configured rate (Mbit/s)")
        ax.set_ylabel("achieved / configured (%)")
        ax.set_ylim(85, 105)
        ax.legend(fontsize=6)
        ax.set_title("link fidelity")
        save(fig, "link")
    if of("cpu"):
        fig, ax = plt.subplots(figsize=(5, 4))
        for runtime in sorted({rt(r) for r in of("cpu")}):
            pts = sorted((r["quota_cores"], r["achieved_cores"]) for r in of("cpu") if rt(r) == runtime)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=runtime)
        top = max(r["quota_cores"] for r in of("cpu"))
        ax.plot([0, top], [0, top], "k:", lw=0.8, label="quota")
        ax.set_xlabel("CPU quota (cores)")
        ax.set_ylabel("achieved (cores)")
        ax.legend()
        ax.set_title("compute fidelity")
        save(fig, "cpu")
    if of("delay"):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        data = sorted(of("delay"), key=lambda r: (r["latency_s"], r["jitter_s"]))
        ax.boxplot([[1000 * x for x in r["rtts_s"]] for r in data], showfliers=False)
        ax.scatter(range(1, len(data) + 1), [1000 * r["expected_rtt_s"] for r in data], color="tab:red", zorder=3,
                   label="configured RTT")
        ax.set_xticks(range(1, len(data) + 1),
                      [f"{1000 * r['latency_s']:g}+-{1000 * r['jitter_s']:g} ms" for r in data], fontsize=8)
        ax.set_ylabel("round trip (ms)")
        ax.legend()
        ax.set_title("latency (" + data[0]["mechanism"].split(" (")[0] + ")")
        save(fig, "delay")
    if of("startup"):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
        for runtime in sorted({rt(r) for r in of("startup")}):
            pts = sorted((r["workers"], r["startup_seconds"], r.get("host_memory_used_bytes")) for r in of("startup")
                         if rt(r) == runtime)
            a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=runtime)
            mem = [(p[0], p[2] / 2**30) for p in pts if p[2] is not None]
            if mem:
                a2.plot([m[0] for m in mem], [m[1] for m in mem], "o-", label=runtime)
        a1.set_xlabel("workers")
        a1.set_ylabel("seconds from up to the first step")
        a2.set_xlabel("workers")
        a2.set_ylabel("host memory in use (GiB)")
        for a in (a1, a2):
            a.grid(alpha=0.3)
            if a.get_lines():
                a.legend()
        fig.suptitle("scale and start-up")
        save(fig, "startup")
    if of("update"):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for rate in sorted({r["configured_bps"] for r in of("update")}):
            pts = sorted((r["params"], r["median_s"], r["ideal_s"]) for r in of("update")
                         if r["configured_bps"] == rate)
            line, = ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], "o-",
                            label=f"{rate / 1e6:g} Mbit/s measured")
            ax.plot([p[0] / 1e6 for p in pts], [p[2] for p in pts], ":", color=line.get_color(),
                    label="ideal 32P/B + RTT")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters (millions)")
        ax.set_ylabel("seconds for one update to reach the PS")
        ax.legend(fontsize=7)
        ax.set_title("communication efficiency")
        save(fig, "update")
    if of("overhead"):
        fig, ax = plt.subplots(figsize=(5, 4))
        data = sorted(of("overhead"), key=lambda r: r["cpus"])
        x = range(len(data))
        ax.bar([i - 0.2 for i in x], [1000 * r["bare_median_s"] for r in data], 0.4, label="bare PyTorch loop")
        ax.bar([i + 0.2 for i in x], [1000 * r["edgebed_median_s"] for r in data], 0.4, label="inside edgebed")
        ax.set_xticks(list(x), [f"{r['model']}\n{r['cpus']:g} CPU" for r in data], fontsize=8)
        ax.set_ylabel("compute step (ms, median)")
        ax.legend()
        ax.set_title("overhead on a worker's compute step")
        save(fig, "overhead")
    if of("flower"):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        data = sorted(of("flower"), key=lambda r: r["clients"])
        x = range(len(data))
        ax.bar([i - 0.27 for i in x], [r["ideal_round_s"] for r in data], 0.27, label="ideal (the local steps alone)")
        ax.bar(list(x), [r["flower"]["round_s"] for r in data], 0.27, label="Flower simulation (Ray)")
        ax.bar([i + 0.27 for i in x], [r["edgebed"]["round_s"] for r in data], 0.27, label="edgebed (netns)")
        ax.set_xticks(list(x), [f"{r['clients']} clients\n{r['local_steps']} x {r['batch_size']}" for r in data])
        ax.set_ylabel("seconds a FedAvg round (median)")
        ax.legend(fontsize=7)
        ax.set_title("FedAvg rounds: edgebed vs Flower's simulation engine")
        save(fig, "flower")
    if of("wire"):
        fig, ax = plt.subplots(figsize=(7, 4))
        data = sorted(of("wire"), key=lambda r: r["algorithm"])
        x = range(len(data))
        ax.bar([i - 0.2 for i in x], [r["wire_over_payload_up"] for r in data], 0.4, label="up (pushes)")
        ax.bar([i + 0.2 for i in x], [r["wire_over_payload_down"] for r in data], 0.4, label="down (pulls)")
        ax.axhline(1514 / 1448, color="k", ls=":", lw=0.8, label="TCP/IP/Ethernet headers alone (1514/1448)")
        ax.set_xticks(list(x), [r["algorithm"] for r in data], rotation=30, fontsize=8)
        ax.set_ylim(0.95, max(1.3, max(max(r["wire_over_payload_up"], r["wire_over_payload_down"])
                                       for r in data) + 0.05))
        ax.set_ylabel("wire bytes / payload bytes (workers' links)")
        ax.legend(fontsize=7)
        ax.set_title("what each strategy puts on the wire beyond its payload")
        save(fig, "wire")


if plots is not None:
    draw(rows, plots)
