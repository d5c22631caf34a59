"""What the figures read from a run's records: accuracy curves, bytes at the PS, time to accuracy."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import pandas as pd


def accuracy_curve(rec, window: int = 1) -> pd.DataFrame:
    """Evaluations in time order: time, step (model version), updates (pushes received), accuracy
    (a moving average over `window` evaluations, as the AdaComp paper smooths its curves)."""
    ev = rec.evals.dropna(subset=["accuracy"]).sort_values("time").reset_index(drop=True)
    acc = ev.accuracy.rolling(window, min_periods=1).mean() if window > 1 else ev.accuracy
    return pd.DataFrame({"time": ev.time, "step": ev.step, "updates": ev.updates_received, "accuracy": acc})


def cumulative_bytes(rec, node: str, direction: str) -> pd.DataFrame:
    """time, bytes: a node's access-link counter (`down` at the PS is its ingress)."""
    t = rec.traffic
    t = t[(t.node == node) & (t.link == "access") & (t.direction == direction)].sort_values("time")
    return pd.DataFrame({"time": t.time.to_numpy(), "bytes": t.bytes.to_numpy()})


def bytes_at(series: pd.DataFrame, times) -> np.ndarray:
    """A cumulative counter read at `times` (linear between the ~1 s samples)."""
    if series.empty:
        return np.full(len(times), np.nan)
    return np.interp(np.asarray(times, dtype=float), series.time.to_numpy(), series.bytes.to_numpy().astype(float))


def first_reaching(curve: pd.DataFrame, target: float, column: str = "time") -> Optional[float]:
    hit = curve[curve.accuracy >= target]
    return float(hit[column].iloc[0]) if len(hit) else None


def final_accuracy(curve: pd.DataFrame, last: int = 3) -> Optional[float]:
    """The mean of the last `last` evaluations (one evaluation is noisy on a 1,000-sample test set),
    leaving out the untrained model's (step 0) when later ones exist: a short run's few evaluations
    would otherwise average it in."""
    if "step" in curve and (curve.step > 0).any():
        curve = curve[curve.step > 0]
    return float(curve.accuracy.tail(last).mean()) if len(curve) else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0 or (isinstance(a, float) and math.isnan(a)):
        return None
    return a / b


def fmt(v, spec: str = ".3f", none: str = "-") -> str:
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table_markdown(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(fmt(v, ".3g") if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines)


def time_to_accuracy_figure(pairs, out, *, title: str, targets: list[float], baseline: str,
                            subject: str, at_seconds: Optional[float] = None, window: int = 1) -> dict:
    """Accuracy vs wall time per series (left) and seconds to each target accuracy (right), the
    shape of ADSP's Fig. 4, DLion's Fig. 6/7 and SelSync's table. Returns the headline: per series
    the time to each target, best and final accuracy (and accuracy at `at_seconds`), and
    `subject`'s speed-up over `baseline` at each target (time ratio). `window` > 1 reads every
    crossing and accuracy on the trailing moving average of that many evaluations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, table = [], []
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    for s, rec in pairs:
        curve = accuracy_curve(rec, window=window).assign(series=s.label)
        rows.append(curve)
        ax_t.plot(curve.time, curve.accuracy, label=s.label)
        entry = {"series": s.label, "best_accuracy": float(curve.accuracy.max()) if len(curve) else None,
                 "final_accuracy": final_accuracy(curve), "seconds": float(curve.time.max()) if len(curve) else None,
                 "updates": int(curve.step.max()) if len(curve) else 0}
        for t in targets:
            entry[f"seconds_to_{t}"] = first_reaching(curve, t)
        if at_seconds is not None:
            before = curve[curve.time <= at_seconds]
            entry[f"accuracy_at_{at_seconds:g}s"] = float(before.accuracy.tail(3).mean()) if len(before) else None
        table.append(entry)
    for t in targets:
        ax_t.axhline(t, color="grey", lw=0.8, ls=":")
    if at_seconds is not None:
        ax_t.axvline(at_seconds, color="grey", lw=0.8, ls="--")
    ax_t.set_xlabel("seconds")
    ax_t.set_ylabel("accuracy")
    ax_t.grid(alpha=0.3)
    ax_t.legend(fontsize=8)
    if not targets and at_seconds is not None:  # accuracy after a fixed time (DLion's Fig. 7)
        ax_b.bar(range(len(table)), [e[f"accuracy_at_{at_seconds:g}s"] or 0 for e in table])
        ax_b.set_xticks(range(len(table)))
        ax_b.set_xticklabels([e["series"] for e in table], rotation=30, ha="right", fontsize=8)
        ax_b.set_ylabel(f"accuracy at {at_seconds:g} s")
    width = 0.8 / max(1, len(targets))
    for k, t in enumerate(targets):
        vals = [e[f"seconds_to_{t}"] or 0 for e in table]
        ax_b.bar([i + k * width for i in range(len(table))], vals, width, label=f"to {t:g}")
    if targets:
        ax_b.set_xticks([i + width * (len(targets) - 1) / 2 for i in range(len(table))])
        ax_b.set_xticklabels([e["series"] for e in table], rotation=30, ha="right", fontsize=8)
        ax_b.set_ylabel("seconds to accuracy (0: not reached)")
        ax_b.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    pd.concat(rows).to_csv(out.with_suffix(".csv"), index=False)
    pd.DataFrame(table).to_csv(out.with_name(out.name + "-table.csv"), index=False)

    by = {e["series"]: e for e in table}
    speedups = {}
    for t in targets:
        b, s_ = by.get(baseline, {}).get(f"seconds_to_{t}"), by.get(subject, {}).get(f"seconds_to_{t}")
        speedups[str(t)] = ratio(b, s_)
    lines = [f"{e['series']:22s} best {fmt(e['best_accuracy'])} final {fmt(e['final_accuracy'])} "
             + " ".join(f"to {t:g}: {fmt(e[f'seconds_to_{t}'], '.1f')} s" for t in targets)
             + (f"  at {at_seconds:g} s: {fmt(e[f'accuracy_at_{at_seconds:g}s'])}" if at_seconds is not None else "")
             for e in table]
    lines += [f"{subject} vs {baseline}, time to {t}: {fmt(v, '.2f')}x" for t, v in speedups.items()]
    return {"series": table, "speedup_vs_" + baseline.lower().replace(" ", "_"): speedups, "lines": lines}
