"""BENCHMARKS.md's device tables and plot from `edgebed bench device`'s JSON.

    python benchmarks/device_report.py [benchmarks/results/device-netns.json] [benchmarks/plots/bench-device.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def tables(res: dict) -> str:
    rows = [r for r in res["rows"] if "error" in r]
    models = res["models"]
    out = ["Own model (calibrated on the model it runs), median of "
           f"{res['repetitions']} repetitions, spread = (max-min)/median:", "",
           "| host | device | model | quota (cores) | target ms | measured ms | error | spread |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["calibration_model"] == r["run_model"]:
            out.append(f"| {r['condition']} | {r['device']} | {r['run_model']} | {r['quota_cores']:.3f} | "
                       f"{_ms(r['target_step_s'])} | {_ms(r['step_s_median'])} | {r['error']:+.1%} | "
                       f"{r['step_s_spread']:.1%} |")
    cross = [r for r in rows if r["calibration_model"] != r["run_model"]]
    if cross:
        out += ["", "Calibrated on one model, run on another (idle host): error of the step time against the "
                "run model's target", "",
                "| device | calibrated on | " + " | ".join(f"run {m}" for m in models) + " |",
                "|---|---|" + "---|" * len(models)]
        for dev in res["devices"]:
            for cal in models:
                cells = []
                for m in models:
                    r = next((x for x in rows if x["device"] == dev and x["calibration_model"] == cal
                              and x["run_model"] == m and x["condition"] == "idle"), None)
                    cells.append("" if r is None else f"{r['error']:+.1%}")
                out.append(f"| {dev} | {cal} | " + " | ".join(cells) + " |")
    host = [r for r in res["rows"] if r["device"] == "cpus: 1.0"]
    if host:
        out += ["", "Host-relative `cpus: 1.0` on the same CPU:", "", "| host | model | measured ms | spread |",
                "|---|---|---|---|"]
        out += [f"| {r['condition']} | {r['run_model']} | {_ms(r['step_s_median'])} | "
                f"{'' if 'step_s_spread' not in r else format(r['step_s_spread'], '.1%')} |" for r in host]
    if "device_ratio_slow_over_idle" in res:
        dr, cr = res["device_ratio_slow_over_idle"], res["cpus_ratio_slow_over_idle"]
        out += ["", "Step time, slow host / idle host: `device:` "
                + ", ".join(f"{k} {v:.3f}" for k, v in dr.items()) + "; `cpus: 1.0` "
                + ", ".join(f"{k} {v:.2f}" for k, v in cr.items()) + "."]
    return "\n".join(out)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in res["rows"] if "error" in r and r["calibration_model"] == r["run_model"]]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for cond, marker in (("idle", "o"), ("slow", "s")):
        pts = [r for r in rows if r["condition"] == cond]
        if pts:
            yerr = ([[(r["step_s_median"] - min(r["step_s"])) * 1e3 for r in pts],
                     [(max(r["step_s"]) - r["step_s_median"]) * 1e3 for r in pts]]
                    if all("step_s" in r for r in pts) else None)
            ax.errorbar([r["target_step_s"] * 1e3 for r in pts], [r["step_s_median"] * 1e3 for r in pts],
                        yerr=yerr, fmt=marker, label=f"device nodes, {cond} host", alpha=0.8)
    lim = max(r["target_step_s"] for r in rows) * 1e3 * 1.1
    ax.plot([0, lim], [0, lim], "k-", lw=0.8, label="target")
    ax.fill_between([0, lim], [0, lim * 0.95], [0, lim * 1.05], color="grey", alpha=0.2, label="±5%")
    ax.set_xlabel("device's target step time (ms)")
    ax.set_ylabel("measured step time in the node (ms)")
    ax.set_title("edgebed bench device: 3 devices x 3 models")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/device-netns.json")
    result = json.loads(src.read_text())
    print(tables(result))
    if len(sys.argv) > 2:
        plot(result, Path(sys.argv[2]))
