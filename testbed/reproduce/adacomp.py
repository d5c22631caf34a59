"""AdaComp (Hardy, Le Merrer, Sericola, NCA 2017: "Distributed deep learning on edge-devices:
feasibility via adaptive compression"): Fig. 3 and Table II."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.reproduce import Experiment, Panel, Series, register
from testbed.reproduce.common import accuracy_curve, bytes_at, cumulative_bytes, final_accuracy, fmt, ratio
from testbed.reproduce.verdict import Criterion

# the fixed accuracy the ingress is compared at (paper: 97%; paper-200 runs a fraction of its updates)
FIG3_TARGET = {"ci": 0.90, "paper": 0.97, "paper-200": 0.95}


def _payload_at(rec, versions) -> list:
    """Update payload bytes the PS had received by each model version (server.csv, one row per update)."""
    try:
        srv = pd.read_csv(Path(rec.run_dir) / "server.csv")
    except (OSError, ValueError):
        return [float("nan")] * len(versions)
    srv = srv.sort_values("version")
    cum = pd.to_numeric(srv.payload_bytes, errors="coerce").fillna(0).cumsum().to_numpy()
    ver = srv.version.to_numpy()
    return [float(cum[(ver <= v)].max()) if (ver <= v).any() else 0.0 for v in versions]


def _fig3(pairs, out: Path, scale: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = FIG3_TARGET.get(scale, FIG3_TARGET["ci"])
    rows, table = [], []
    fig, (ax_u, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for s, rec in pairs:
        curve = accuracy_curve(rec)
        ingress = bytes_at(cumulative_bytes(rec, "ps", "down"), curve.time)
        curve = curve.assign(ps_ingress_bytes=ingress, payload_bytes=_payload_at(rec, curve.step), series=s.label)
        rows.append(curve)
        ax_u.plot(curve.updates, curve.accuracy, label=s.label)
        ax_b.plot(curve.ps_ingress_bytes / 1e6, curve.accuracy, label=s.label)
        # every crossing on the same 3-evaluation moving average that the final accuracy reads (one
        # raw evaluation that reaches the target by luck does not decide it)
        reach = curve[curve.accuracy.rolling(3, min_periods=1).mean() >= target]
        table.append({
            "series": s.label,
            # The paper's final accuracy (Sec. V-C): "the mean of the maximal accuracy reached by each
            # run", of the moving-average curves it plots. Per seed: the moving average's maximum.
            "final_accuracy": float(curve.accuracy.rolling(3).mean().max()) if len(curve) >= 3 else None,
            "end_of_run_accuracy": final_accuracy(curve),  # the last 3 evaluations' mean, beside it
            "best_accuracy": float(curve.accuracy.max()) if len(curve) else None,
            "updates": int(curve.updates.max()) if len(curve) else 0,
            "updates_to_target": int(reach.updates.iloc[0]) if len(reach) else None,
            "ps_ingress_MB_to_target": float(reach.ps_ingress_bytes.iloc[0]) / 1e6 if len(reach) else None,
            "ps_ingress_MB_total": float(ingress[-1]) / 1e6 if len(ingress) else None,
            "payload_MB_to_target": float(reach.payload_bytes.iloc[0]) / 1e6 if len(reach) else None,
            "seconds": float(reach.time.iloc[0]) if len(reach) else None,
        })
    for ax in (ax_u, ax_b):
        ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
    ax_u.set_xlabel("updates at the PS")
    ax_b.set_xlabel("PS ingress (MB, log)")
    ax_b.set_xscale("log")
    ax_u.legend(fontsize=8)
    fig.suptitle(f"AdaComp Fig. 3 ({scale} scale): accuracy vs updates (left) and vs PS ingress (right)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    pd.concat(rows).to_csv(out.with_suffix(".csv"), index=False)

    by = {r["series"]: r for r in table}
    asgd, best = by.get("ASGD"), by.get("AdaComp c=0.01")
    traffic_ratio = ratio(asgd and asgd["ps_ingress_MB_to_target"], best and best["ps_ingress_MB_to_target"])
    payload_ratio = ratio(asgd and asgd["payload_MB_to_target"], best and best["payload_MB_to_target"])
    gap = None if not (asgd and best) or None in (asgd["final_accuracy"], best["final_accuracy"]) else \
        asgd["final_accuracy"] - best["final_accuracy"]
    lines = [f"target accuracy {target}, reached on the 3-evaluation moving average; final = its maximum (the "
             f"paper's Sec. V-C), end of run = the mean of the last 3 evaluations"] + [
        f"{r['series']:16s} final {fmt(r['final_accuracy'])} (end of run {fmt(r['end_of_run_accuracy'])}, "
        f"best single {fmt(r['best_accuracy'])})  "
        f"to {target}: {fmt(r['updates_to_target'], 'd')} updates, {fmt(r['ps_ingress_MB_to_target'], '.1f')} MB; "
        f"total {fmt(r['ps_ingress_MB_total'], '.1f')} MB over {r['updates']} updates" for r in table]
    lines.append(f"ASGD / AdaComp c=0.01 PS ingress to {target}: {fmt(traffic_ratio, '.1f')}x; final accuracy "
                 f"gap {fmt(gap, '+.3f')}")
    lines.append(f"the same in update payload (server.csv, no TCP/IP headers or the ACKs of the dense pulls): "
                 f"{fmt(payload_ratio, '.1f')}x")
    return {"target_accuracy": target, "series": table, "ingress_ratio_asgd_over_adacomp_0.01": traffic_ratio,
            "payload_ratio_asgd_over_adacomp_0.01": payload_ratio,
            "final_accuracy_gap": gap, "lines": lines}


# The paper's own points (Sec. V-C): final accuracies after 250,000 updates, and the PS ingress at 97%
# (AdaComp c=0.01 1.33 GB, ASGD 191x that). Drawn beside ours at the paper's scales.
PAPER_POINTS_UPDATES = ((250_000, 0.9785, "paper ASGD"), (250_000, 0.9859, "paper AdaComp c=0.01"))
PAPER_POINTS_INGRESS_MB = ((1_330, 0.97, "paper AdaComp c=0.01"), (191 * 1_330, 0.97, "paper ASGD"))


def _fig3_panels(scale: str) -> tuple:
    paper = scale != "ci"
    return (Panel(x="updates", xlabel="updates at the PS" + (" (log)" if paper else ""), title="accuracy vs updates",
                  xscale="log" if paper else "linear", reference=PAPER_POINTS_UPDATES if paper else ()),
            Panel(x="ps_ingress_bytes", x_factor=1e-6, xlabel="PS ingress (MB, log)", xscale="log",
                  title="accuracy vs PS ingress", reference=PAPER_POINTS_INGRESS_MB if paper else ()))


FIG3_CRITERIA = (
    Criterion("ingress_ratio", "PS ingress to the target accuracy, ASGD / AdaComp c=0.01", "higher",
              neutral=1.0, bar=20.0, tie=0.1, ratio=True),
    Criterion("final_accuracy_gap", "final accuracy, ASGD minus AdaComp c=0.01 (at most 1 point)", "lower",
              neutral=0.01, bar=0.01),
)


def _fig3_metrics(result: dict, scale: str) -> dict:
    return {"ingress_ratio": result.get("ingress_ratio_asgd_over_adacomp_0.01"),
            "final_accuracy_gap": result.get("final_accuracy_gap")}


register(Experiment(
    name="fig-adacomp-3", paper="adacomp", title="accuracy vs updates and vs PS ingress traffic",
    claim="final accuracy ASGD 97.85%, Comp-ASGD 96.07%/95.11% (c=0.1/0.01), AdaComp 98.7%/98.59%; at 97% "
          "accuracy AdaComp c=0.01 used 1.33 GB of PS ingress, 191x less than ASGD (200 workers, MNIST, b=10)",
    expect="AdaComp reaches the fixed accuracy with >= 20x less PS ingress than ASGD, at most 1 point lower accuracy",
    scenario="scenarios/adacomp/fig3.{scale}.yaml",
    criteria=FIG3_CRITERIA, metrics=_fig3_metrics,
    panels=_fig3_panels,
    series=[Series("ASGD", {"algorithm": {"name": "asgd"}}),
            Series("Comp-ASGD c=0.1", {"algorithm": {"name": "comp_asgd", "params": {"c": 0.1}}}),
            Series("Comp-ASGD c=0.01", {"algorithm": {"name": "comp_asgd", "params": {"c": 0.01}}}),
            Series("AdaComp c=0.1", {"algorithm": {"name": "adacomp", "params": {"c": 0.1}}}),
            Series("AdaComp c=0.01", {"algorithm": {"name": "adacomp", "params": {"c": 0.01}}})],
    analyze=_fig3,
))


# per push; at ci scale 0.0007 over the 6,000 updates of one epoch of full MNIST at b = 10 crashes
# a median 4 of the 8 workers (a simulation of the draws: 78% of runs crash 2-6), the paper's "half"
CRASH_P = {"ci": 0.0007, "paper": 0.004}


def _table2_series(scale: str) -> list[Series]:
    crash = {"faults": {"crash_per_push": CRASH_P[scale]}}
    workers = 4 if scale == "ci" else 100
    return [Series("100% data, no crash", {}),
            Series("100% data, crashes", crash),
            Series("20% data, no crash", {"workload": {"train_fraction": 0.2}}),
            Series("20% data, crashes", {"workload": {"train_fraction": 0.2}, **crash}),
            Series("half the workers, 10% data, no crash",
                   {"workload": {"train_fraction": 0.1}, "workers": [{"count": workers, "profile": "device"}]})]


def _table2(pairs, out: Path, scale: str) -> dict:
    rows = []
    curves = []
    for s, rec in pairs:
        curve = accuracy_curve(rec, window=3)  # the paper reports the moving average's maximum
        curves.append(curve.assign(series=s.label))
        crashed = rec.events[rec.events.detail.str.contains("crash after push", na=False)]
        rows.append({"series": s.label, "max accuracy": float(curve.accuracy.max()) if len(curve) else None,
                     "crashed workers": int(crashed.target.nunique()),
                     "workers": len([n for n in rec.meta.get("nodes", {}) if n.startswith("w")]),
                     "updates": int(curve.updates.max()) if len(curve) else 0})
    table = pd.DataFrame(rows)
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    pd.concat(curves).to_csv(out.with_suffix(".csv"), index=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for c in curves:
        ax.plot(c.updates, c.accuracy, label=c.series.iloc[0] if len(c) else "")
    ax.set_xlabel("updates at the PS")
    ax.set_ylabel("accuracy (moving average of 3)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"AdaComp Table II ({scale} scale): crashes, c = 0.01, MLP")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    by = {r["series"]: r["max accuracy"] for r in rows}
    losses = {f: None if by.get(f"{f} data, no crash") is None or by.get(f"{f} data, crashes") is None
              else by[f"{f} data, no crash"] - by[f"{f} data, crashes"] for f in ("100%", "20%")}
    crashed = {r["series"]: r["crashed workers"] for r in rows if "crashes" in r["series"]}
    control = by.get("half the workers, 10% data, no crash")
    # the paper's control: crashes on 20% of the data still beat half the workers on 10% without any
    over_control = None if control is None or by.get("20% data, crashes") is None else by["20% data, crashes"] - control
    lines = [f"{r['series']:38s} max accuracy {fmt(r['max accuracy'])}  crashed {r['crashed workers']}/{r['workers']}"
             for r in rows] + ["accuracy lost to crashes: " + ", ".join(f"{k} data {fmt(v, '+.4f')}" for k, v in
                                                                         losses.items())]
    lines.append(f"20% data with crashes minus the control (half the workers, 10% data): {fmt(over_control, '+.4f')}")
    return {"series": rows, "accuracy_lost_to_crashes": losses, "crashed_workers": crashed,
            "crashes_over_control": over_control, "lines": lines}


TABLE2_CRITERIA = (
    Criterion("lost_100", "accuracy lost to crashes, full training set (at most 1 point)", "lower",
              neutral=0.01, bar=0.01),
    Criterion("lost_20", "accuracy lost to crashes, 20% of it (at most 1 point)", "lower", neutral=0.01, bar=0.01),
    Criterion("fewest_crashed", "workers crashed in the crash run with the fewest (crashes happened)", "higher",
              neutral=0.0, bar=1.0),
    # the paper's control (95.24% with crashes on 20% against 94.35% for 100 workers on 10%
    # without), at least half a point; within 0.2 points a tie
    Criterion("over_control", "max accuracy, 20% data with crashes minus half the workers on 10% without",
              "higher", neutral=0.0, bar=0.005, tie=0.002),
)


def _table2_metrics(result: dict, scale: str) -> dict:
    lost, crashed = result.get("accuracy_lost_to_crashes", {}), result.get("crashed_workers", {})
    over = result.get("crashes_over_control")
    if over is None:  # a figure drawn before the control was judged: its rows have the numbers
        by = {r["series"]: r.get("max accuracy") for r in result.get("series", [])}
        a, b = by.get("20% data, crashes"), by.get("half the workers, 10% data, no crash")
        over = None if a is None or b is None else a - b
    return {"lost_100": lost.get("100%"), "lost_20": lost.get("20%"),
            "fewest_crashed": min(crashed.values()) if crashed else None, "over_control": over}


register(Experiment(
    name="table-adacomp-2", paper="adacomp", title="max accuracy of AdaComp with half the workers crashing",
    claim="MLP, c=0.01, 200 workers, p=0.004: crashes cost 0.27% accuracy with the full training set (97.17%) and "
          "0.23% with 20% of it; 100 workers on 10% without crashes: 94.35% vs 95.24% with crashes on 20%",
    expect="crashes cost at most about a point of accuracy at each data fraction",
    scenario="scenarios/adacomp/table2.{scale}.yaml", series=_table2_series, analyze=_table2,
    criteria=TABLE2_CRITERIA, metrics=_table2_metrics,
    panels=(Panel(x="updates", xlabel="updates at the PS", ylabel="accuracy (moving average of 3)"),)))
