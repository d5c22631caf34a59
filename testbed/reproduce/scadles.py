"""ScaDLES (Tyagi & Swany, "ScaDLES: Scalable Deep Learning over Streaming data at the Edge"):
Fig. 6 / Table VI (ScaDLES vs conventional DDL per rate set), Fig. 7 / Table IV (buffer growth,
persistence vs truncation) and Table V (adaptive compression's CNC ratio and volume)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import Experiment, Series, register
from .common import accuracy_curve, final_accuracy, first_reaching, table_markdown

SETS = ("S1", "S2", "S1'", "S2'")
TARGET = {"ci": 0.9, "paper": 0.9}
DDL = {"algorithm": {"name": "bsp"}, "streaming": {"batch": "fixed", "buffer": "persistence"}}


def _buffer(rec) -> pd.DataFrame:
    """buffer.csv summed over devices per second: buffered samples and bytes. Each device's latest
    snapshot counts at every second (devices snapshot at their own times; a second in which only
    one of them wrote a row must not read as the whole buffer)."""
    path = Path(rec.run_dir) / "buffer.csv"
    try:
        b = pd.read_csv(path)
    except (OSError, ValueError):
        b = pd.DataFrame()
    if b.empty:
        return pd.DataFrame(columns=["time", "buffered", "buffered_bytes"])
    b["t"] = b.time.round(0)
    cols = {}
    for column in ("buffered", "buffered_bytes"):
        per_node = b.sort_values("time").groupby(["t", "node"])[column].last().unstack("node")
        cols[column] = per_node.ffill().fillna(0).sum(axis=1)
    return pd.DataFrame(cols).reset_index().rename(columns={"t": "time"})


def _buffered_at(buf: pd.DataFrame, t: float | None, column: str = "buffered") -> float | None:
    if buf.empty:
        return None
    rows = buf[buf.time <= t] if t is not None else buf
    return float((rows if len(rows) else buf)[column].iloc[-1])


def _panels(n: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.4), sharey=True)
    return plt, fig, list(axes) if n > 1 else [axes]


def _table6(pairs, out: Path, scale: str) -> dict:
    target = TARGET[scale]
    by = {s.label: rec for s, rec in pairs}
    plt, fig, axes = _panels(len(SETS))
    rows, curves = [], []
    for ax, rate_set in zip(axes, SETS):
        # time to DDL's accuracy (the paper's convergence): the target, or 95% of DDL's best below it
        ddl = by.get(f"DDL {rate_set}")
        ddl_best = float(accuracy_curve(ddl).accuracy.max()) if ddl is not None and len(ddl.evals) else target
        set_target = target if ddl_best >= target else round(0.95 * ddl_best, 2)
        entry: dict = {"set": rate_set, "target": set_target}
        for who in ("ScaDLES", "DDL"):
            rec = by.get(f"{who} {rate_set}")
            if rec is None:
                continue
            c = accuracy_curve(rec).assign(series=f"{who} {rate_set}")
            curves.append(c)
            ax.plot(c.time, c.accuracy, label=who)
            entry[f"{who} best"] = float(c.accuracy.max()) if len(c) else None
            entry[f"{who} seconds"] = first_reaching(c, set_target)
            t_end = entry[f"{who} seconds"]
            entry[f"{who} buffer GB"] = (_buffered_at(_buffer(rec), t_end, "buffered_bytes") or 0) / 1e9
            entry[f"{who} mean batch"] = float(pd.to_numeric(rec.steps.batch_size, errors="coerce").mean()) \
                if len(rec.steps) else None
        sc, dd = entry.get("ScaDLES seconds"), entry.get("DDL seconds")
        entry["speedup"] = None if sc is None or dd is None else dd / sc
        entry["accuracy drop"] = None if entry.get("ScaDLES best") is None or entry.get("DDL best") is None else \
            entry["ScaDLES best"] - entry["DDL best"]
        entry["buffer reduction GB"] = (entry.get("DDL buffer GB") or 0) - (entry.get("ScaDLES buffer GB") or 0)
        rows.append(entry)
        ax.axhline(set_target, color="grey", lw=0.8, ls=":")
        ax.set_title(f"rates {rate_set}")
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"ScaDLES Fig. 6 ({scale} scale): ScaDLES vs conventional DDL per rate set")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    pd.concat(curves).to_csv(out.with_suffix(".csv"), index=False)
    table = pd.DataFrame([{k: r.get(k) for k in ("set", "target", "accuracy drop", "buffer reduction GB", "speedup",
                                                   "ScaDLES mean batch", "DDL mean batch")} for r in rows])
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    speedups = [r["speedup"] for r in rows]
    holds = all(s is not None and s > 1 for s in speedups) and \
        all(r["accuracy drop"] is not None and r["accuracy drop"] >= -0.01 for r in rows)
    lines = table_markdown(table).splitlines() + [
        f"ScaDLES faster to DDL's accuracy (the target, or 95% of DDL's best) on every set, at most 1 point less "
        f"accuracy: {'holds' if holds else 'does NOT hold'}"]
    return {"target_accuracy": target, "sets": rows, "holds": holds, "lines": lines}


T4_SERIES = ("DDL persistence", "DDL truncation", "ScaDLES persistence")


def _table4(pairs, out: Path, scale: str) -> dict:
    """Table IV: truncation vs persistence under the same (conventional, b = 64 BSP) training, whose
    buffers grow at ci scale: BSP waits on the slowest stream while the fast ones pile up. Fig. 7's
    comparison rides along: ScaDLES (batch = rate) under persistence holds less than DDL."""
    by = {s.label: rec for s, rec in pairs}
    plt, fig, axes = _panels(len(SETS))
    rows, curves = [], []
    for ax, rate_set in zip(axes, SETS):
        entry: dict = {"set": rate_set}
        for who in T4_SERIES:
            rec = by.get(f"{rate_set} {who}")
            if rec is None:
                continue
            buf = _buffer(rec)
            steps = rec.steps.groupby(rec.steps.time.round(0)).step.max().rename("step")
            buf = buf.join(steps, on="time").ffill()
            curves.append(buf.assign(series=f"{rate_set} {who}"))
            ax.plot(buf.time, buf.buffered.clip(lower=1), label=who)
            entry[who] = _buffered_at(buf, None)
        p, t, s = entry.get("DDL persistence"), entry.get("DDL truncation"), entry.get("ScaDLES persistence")
        entry["reduction"] = None if not p or not t else p / t
        entry["DDL / ScaDLES (persistence)"] = None if not p or not s else p / s
        rows.append(entry)
        ax.set_yscale("log")
        ax.set_title(f"rates {rate_set}")
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("samples buffered (all devices, log)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"ScaDLES Fig. 7 / Table IV ({scale} scale): buffer growth, persistence vs truncation")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    pd.concat(curves).to_csv(out.with_suffix(".csv"), index=False)
    table = pd.DataFrame(rows).rename(columns={w: f"{w} (samples)" for w in T4_SERIES})
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    holds = all(r["reduction"] is not None and r["reduction"] > 10 for r in rows)
    fig7 = [r["DDL / ScaDLES (persistence)"] for r in rows]
    fig7_holds = all(x is not None and x > 1 for x in fig7)
    lines = table_markdown(table).splitlines() + [
        f"truncation keeps the buffer over 10x smaller than persistence on every set: "
        f"{'holds' if holds else 'does NOT hold'}",
        f"(Fig. 7) ScaDLES under persistence holds less than DDL on every set: "
        f"{'holds' if fig7_holds else 'does NOT hold'}"]
    return {"sets": rows, "holds": holds, "fig7_holds": fig7_holds, "lines": lines}


def _table5(pairs, out: Path, scale: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, curves = [], []
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for s, rec in pairs:
        c = accuracy_curve(rec).assign(series=s.label)
        curves.append(c)
        ax.plot(c.time, c.accuracy, label=s.label)
        comp = pd.to_numeric(rec.steps.compressed, errors="coerce").dropna()  # 1/0, empty when not compressing
        sent = pd.to_numeric(rec.steps.bytes_sent, errors="coerce").sum()
        rows.append({"series": s.label, "CNC ratio": float(comp.mean()) if len(comp) else None,
                     "best accuracy": float(c.accuracy.max()) if len(c) else None,
                     "final accuracy": final_accuracy(c), "MB sent by devices": sent / 1e6,
                     "steps": int(len(rec.steps))})
    ax.set_xlabel("seconds")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"ScaDLES Table V ({scale} scale): adaptive compression, (CR, delta)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    pd.concat(curves).to_csv(out.with_suffix(".csv"), index=False)
    table = pd.DataFrame(rows)
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    by_cr: dict[str, list] = {}
    for r in rows:
        by_cr.setdefault(r["series"].split()[0], []).append(r["CNC ratio"])
    # the paper's effect: a larger delta lets more steps go compressed (CNC grows with delta)
    monotone = all(all(a is not None and b is not None and b >= a - 0.05 for a, b in zip(v, v[1:]))
                   for v in by_cr.values())
    lines = table_markdown(table).splitlines() + [
        f"CNC ratio grows with delta at each CR: {'holds' if monotone else 'does NOT hold'}"]
    return {"series": rows, "holds": monotone, "lines": lines}


register(Experiment(
    name="table-scadles-6", paper="scadles", title="ScaDLES vs conventional DDL per rate set (Fig. 6, Table VI)",
    claim="ResNet152: accuracy drop -0.06% to -0.32%, buffer reduction 0.6-5.9 GB, speed-up 1.15x-3.29x over "
          "conventional DDL (b=64, persistence) across S1, S2, S1', S2' (16 devices)",
    expect="ScaDLES reaches the target accuracy faster than DDL on each set with a small accuracy drop",
    scenario="scenarios/scadles/streams.{scale}.yaml",
    series=[s for rate_set in SETS for s in (
        Series(f"ScaDLES {rate_set}", {"streaming": {"rates": rate_set}}),
        Series(f"DDL {rate_set}", {**DDL, "streaming": {**DDL["streaming"], "rates": rate_set}}))],
    analyze=_table6))

register(Experiment(
    name="table-scadles-4", paper="scadles", title="buffer growth, persistence vs truncation (Fig. 7, Table IV)",
    claim="truncation cuts the buffer 848x-9,429x relative to persistence (ResNet152/VGG19, S1, S2, S1', S2'); "
          "under persistence ScaDLES holds 2x-641x less than DDL (Fig. 7)",
    expect="truncation's buffer is over 10x below persistence's on every set, and ScaDLES's below DDL's",
    scenario="scenarios/scadles/streams.{scale}.yaml",
    series=[Series(f"{rate_set} {who}",
                   {**(DDL if who.startswith("DDL") else {}),
                    "streaming": {**(DDL["streaming"] if who.startswith("DDL") else {}),
                                  "rates": rate_set, "buffer": who.split()[1]},
                    "stop": {"target_accuracy": None, "seconds": 60}})
            for rate_set in SETS for who in T4_SERIES],
    analyze=_table4))

register(Experiment(
    name="table-scadles-5", paper="scadles", title="adaptive compression: CNC ratio, accuracy, volume per (CR, delta)",
    claim="ResNet152, CR 0.1: CNC 0.29/0.99/1.0/1.0 for delta 0.1/0.2/0.3/0.4, volume 4.43e11 -> 0.4e11 floats at "
          "97.6-98.6% accuracy; CR 0.01: CNC 0/0.17/0.43/0.99",
    expect="the CNC ratio grows with delta, and the volume sent falls with it",
    scenario="scenarios/scadles/streams.{scale}.yaml",
    series=[Series(f"CR={cr} delta={d}", {"algorithm": {"params": {"cr": cr, "delta": d}},
                                          "streaming": {"rates": "S1'"},
                                          "stop": {"target_accuracy": None, "seconds": 50}})
            for cr in (0.1, 0.01) for d in (0.1, 0.2, 0.3, 0.4)],
    analyze=_table5))

