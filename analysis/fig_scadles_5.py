#!/usr/bin/env python3
"""ScaDLES Fig. 5 (effective streaming rate vs number of topics) from `edgebed bench stream` results.

    python analysis/fig_scadles_5.py [RESULTS] [--out figures]

RESULTS holds stream-TOPICSxRATE.json files (`make fig-scadles-5` writes them under
runs/reproduce/fig-scadles-5/; benchmarks/results/ keeps BENCHMARKS.md's). Writes
figures/fig-scadles-5.png, .csv (one row per topic) and -table.csv, and .json with the paper's claim.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

CLAIM = ("one Kafka broker container (16 vCPUs), 3 KB samples: 100 samples/s per topic holds up to 32 topics; "
         "600 samples/s drops beyond 16 topics")
HOLD = 0.95  # a topic holds its rate when its consumer gets at least 95% of it


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", type=Path, default=Path("runs/reproduce/fig-scadles-5"))
    ap.add_argument("--out", type=Path, default=Path("figures"))
    a = ap.parse_args(argv)
    runs = sorted((json.loads(p.read_text()) for p in a.results.glob("stream-*.json")),
                  key=lambda r: (r["rate"], r["topics"]))
    if not runs:
        print(f"no stream-*.json under {a.results} (make fig-scadles-5 runs them)", file=sys.stderr)
        return 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    rows, per_topic = [], []
    for r in runs:
        achieved = [t["achieved"] for t in r["per_topic"]]
        per_topic += [{"rate": r["rate"], "topics": r["topics"], "topic": t["topic"], "achieved": t["achieved"]}
                      for t in r["per_topic"]]
        rows.append({"target per topic": r["rate"], "topics": r["topics"],
                     "mean per topic": sum(achieved) / len(achieved), "min per topic": min(achieved),
                     "aggregate": r["aggregate_samples_per_s"], "topics holding": r["topics_holding_rate"],
                     "broker cores": r["broker_node_cpu_seconds"] / (r["seconds"] + r["warmup"])})
    table = pd.DataFrame(rows)
    a.out.mkdir(parents=True, exist_ok=True)
    out = a.out / "fig-scadles-5"
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    pd.DataFrame(per_topic).to_csv(out.with_suffix(".csv"), index=False)
    fig, ax = plt.subplots(figsize=(6, 4))
    for rate, g in table.groupby("target per topic"):
        line, = ax.plot(g["topics"], g["mean per topic"], "o-", label=f"{rate:g} samples/s per topic")
        ax.fill_between(g["topics"], g["min per topic"], g["mean per topic"], color=line.get_color(), alpha=0.15)
        ax.axhline(rate, color=line.get_color(), ls=":", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("topics (one producer and one consumer each)")
    ax.set_ylabel("effective samples/s per topic (mean; band: min)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("ScaDLES Fig. 5 (ci scale): effective streaming rate vs topics")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    holds: dict[float, list[int]] = {}
    for x in rows:
        holds.setdefault(x["target per topic"], []).extend([x["topics"]] if x["topics holding"] == x["topics"] else [])
    lines = [f"{x['target per topic']:g}/s x {x['topics']:2d} topics: mean {x['mean per topic']:.1f}, min "
             f"{x['min per topic']:.1f} per topic, {x['topics holding']}/{x['topics']} hold, broker "
             f"{x['broker cores']:.2f} cores" for x in rows]
    # the paper's shape: the higher rate gives out first; at the most topics it keeps a smaller share
    most = {rate: max(v) if v else 0 for rate, v in holds.items()}
    rates = sorted(most)
    top = max(x["topics"] for x in rows)
    share = {x["target per topic"]: x["mean per topic"] / x["target per topic"] for x in rows if x["topics"] == top}
    shape = len(rates) >= 2 and rates[0] in share and rates[-1] in share and share[rates[-1]] < share[rates[0]]
    lines.append("every topic holds its rate up to: " + ", ".join(f"{r:g}/s: {most[r]} topics" for r in rates)
                 + f"; at {top} topics the mean keeps " + ", ".join(f"{100 * share[r]:.0f}% of {r:g}/s"
                                                                    for r in rates if r in share)
                 + f" -> the higher rate gives out first: {'holds' if shape else 'does NOT hold'}")
    report = {"experiment": "fig-scadles-5", "paper": "scadles", "title": "effective streaming rate vs topics",
              "claim": CLAIM, "expect": "the higher rate gives out first: at the most topics it keeps a smaller share of its rate",
              "scale": "ci", "date": min(r["date"] for r in runs)[:10],
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, runtime netns",
              "command": "make fig-scadles-5", "series": rows, "holds": shape, "lines": lines,
              "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
