"""ScaDLES (Tyagi & Swany, "ScaDLES: Scalable Deep Learning over Streaming data at the Edge"):
Fig. 6 / Table VI (ScaDLES vs conventional DDL per rate set), Fig. 7 / Table IV (buffer growth,
persistence vs truncation) and Table V (adaptive compression's CNC ratio and volume)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from testbed.reproduce import Experiment, Panel, Series, register
from testbed.reproduce.common import accuracy_curve, final_accuracy, first_reaching, fmt, table_markdown
from testbed.reproduce.verdict import EXCLUDED, Criterion

SETS = ("S1", "S2", "S1'", "S2'")
# The accuracy every run of Table VI and Table IV is timed to, fixed before the runs (not a share
# of DDL's best: that means little where DDL barely trains). At ci scale runs stop at 0.9 or after
# RUN_SECONDS, whichever comes first; a DDL run that never reached the target claims no speed-up.
TARGET = {"ci": 0.8, "paper": 0.9}
RUN_SECONDS = {"ci": 150, "paper": 7200}
DDL = {"algorithm": {"name": "bsp"}, "streaming": {"batch": "fixed", "buffer": "persistence"}}


def _stop(scale: str) -> dict:
    return {"stop": {"target_accuracy": 0.9 if scale == "ci" else None, "seconds": RUN_SECONDS[scale]}}


def _rates(rec) -> dict:
    """Each device's drawn stream rate (samples/s), as the run's meta.json recorded it."""
    return {k: round(float(v), 2) for k, v in (rec.meta.get("streaming", {}).get("rates") or {}).items()}


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
        entry: dict = {"set": rate_set, "target": target}
        for who in ("ScaDLES", "DDL", *(f"ScaDLES {name}" for name in ABLATIONS)):
            rec = by.get(f"{who} {rate_set}")
            if rec is None:
                continue
            c = accuracy_curve(rec).assign(series=f"{who} {rate_set}")
            curves.append(c)
            ax.plot(c.time, c.accuracy, label=who)
            entry[f"{who} best"] = float(c.accuracy.max()) if len(c) else None
            entry[f"{who} seconds"] = first_reaching(c, target)
            t_end = entry[f"{who} seconds"]
            entry[f"{who} buffer GB"] = (_buffered_at(_buffer(rec), t_end, "buffered_bytes") or 0) / 1e9
            entry[f"{who} mean batch"] = float(pd.to_numeric(rec.steps.batch_size, errors="coerce").mean()) \
                if len(rec.steps) else None
            entry[f"{who} run seconds"] = float(c.time.max()) if len(c) else None
            entry["rates"] = _rates(rec)
        sc, dd = entry.get("ScaDLES seconds"), entry.get("DDL seconds")
        entry["speedup"] = None if sc is None or dd is None else dd / sc
        for name in ABLATIONS:  # DDL's time over the variant's, where it ran
            t = entry.get(f"ScaDLES {name} seconds")
            entry[f"speedup, {name}"] = None if t is None or dd is None else dd / t
        entry["DDL reached"] = dd is not None
        entry["accuracy drop"] = None if entry.get("ScaDLES best") is None or entry.get("DDL best") is None else \
            entry["ScaDLES best"] - entry["DDL best"]
        entry["buffer reduction GB"] = (entry.get("DDL buffer GB") or 0) - (entry.get("ScaDLES buffer GB") or 0)
        rows.append(entry)
        ax.axhline(target, color="grey", lw=0.8, ls=":")
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
                                                   *(f"speedup, {name}" for name in ABLATIONS),
                                                   "ScaDLES mean batch", "DDL mean batch")} for r in rows])
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    notes = [f"{r['set']}: DDL did not reach {r['target']} in {r.get('DDL run seconds') or 0:.0f} s: no speed-up "
             f"claimed" for r in rows if not r["DDL reached"]] + [
        f"{r['set']} rates (samples/s): {', '.join(f'{k} {v:g}' for k, v in r['rates'].items())}" for r in rows]
    return {"target_accuracy": target, "sets": rows, "notes": notes,
            "lines": table_markdown(table).splitlines() + notes}


# Per set: ScaDLES at least as fast as the paper's smallest speed-up (1.15x) to the target, within
# 5% a tie; its best accuracy at most 1 point below DDL's (the paper: -0.06 to -0.32 points).
TABLE6_CRITERIA = tuple(c for rs in SETS for c in (
    Criterion(f"speedup {rs}", f"{rs}: DDL's time to the target / ScaDLES's", "higher", 1.0, 1.15, 0.05, ratio=True),
    Criterion(f"accuracy {rs}", f"{rs}: ScaDLES's best accuracy minus DDL's (at most 1 point below)", "higher",
              -0.01, -0.01)))


def _table6_metrics(result: dict, scale: str) -> dict:
    out = {}
    for r in result.get("sets", []):
        out[f"speedup {r['set']}"] = r.get("speedup") if r.get("DDL reached") else EXCLUDED
        out[f"accuracy {r['set']}"] = r.get("accuracy drop")
    return out


T4_SERIES = ("DDL persistence", "DDL truncation", "ScaDLES persistence")


def _table4(pairs, out: Path, scale: str) -> dict:
    """Table IV: truncation vs persistence under the same (conventional, b = 64 BSP) training, each
    run's buffer read when it first reaches the target accuracy (the paper's method; a run that
    never did is read at its end and marked). BSP waits on the slowest stream while the fast ones
    pile up. Fig. 7's comparison rides along: ScaDLES (batch = rate) under persistence against DDL."""
    target = TARGET[scale]
    by = {s.label: rec for s, rec in pairs}
    plt, fig, axes = _panels(len(SETS))
    rows, curves = [], []
    for ax, rate_set in zip(axes, SETS):
        entry: dict = {"set": rate_set, "target": target}
        for who in T4_SERIES:
            rec = by.get(f"{rate_set} {who}")
            if rec is None:
                continue
            buf = _buffer(rec)
            steps = rec.steps.groupby(rec.steps.time.round(0)).step.max().rename("step")
            buf = buf.join(steps, on="time").ffill()
            curves.append(buf.assign(series=f"{rate_set} {who}"))
            ax.plot(buf.time, buf.buffered.clip(lower=1), label=who)
            reached = first_reaching(accuracy_curve(rec), target)
            entry[who] = _buffered_at(buf, reached)
            entry[f"{who} at s"] = reached if reached is not None else (float(buf.time.max()) if len(buf) else None)
            entry[f"{who} reached"] = reached is not None
            entry["rates"] = _rates(rec)
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
    table = pd.DataFrame([{k: v for k, v in r.items() if k != "rates"} for r in rows]) \
        .rename(columns={w: f"{w} (samples)" for w in T4_SERIES})
    table.to_csv(out.with_name(out.name + "-table.csv"), index=False)
    notes = [f"{r['set']} {w}: did not reach {target}; its buffer is read at the end ({r.get(f'{w} at s') or 0:.0f} s)"
             for r in rows for w in T4_SERIES if r.get(f"{w} reached") is False]
    return {"target_accuracy": target, "sets": rows, "notes": notes,
            "lines": table_markdown(table).splitlines() + notes}


# Per set: truncation holds at least 10x less than persistence when each reaches the target (the
# paper: 848-9,429x over hours), within 10% a tie; Fig. 7: ScaDLES under persistence holds at least
# 2x less than DDL (the paper: 2-641x). A comparison where either run never reached the target is
# left out (buffers read at different points of training).
TABLE4_CRITERIA = tuple(c for rs in SETS for c in (
    Criterion(f"truncation {rs}", f"{rs}: DDL's buffer at the target, persistence / truncation", "higher",
              1.0, 10.0, 0.1, ratio=True),
    Criterion(f"fig7 {rs}", f"{rs}: buffer at the target under persistence, DDL / ScaDLES", "higher",
              1.0, 2.0, 0.1, ratio=True)))


def _table4_metrics(result: dict, scale: str) -> dict:
    out = {}
    for r in result.get("sets", []):
        both = lambda a, b, r=r: r.get(f"{a} reached") and r.get(f"{b} reached")  # noqa: E731
        out[f"truncation {r['set']}"] = r.get("reduction") if both("DDL persistence", "DDL truncation") else EXCLUDED
        out[f"fig7 {r['set']}"] = r.get("DDL / ScaDLES (persistence)") \
            if both("DDL persistence", "ScaDLES persistence") else EXCLUDED
    return out


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
    by = {r["series"]: r for r in rows}
    per_cr = {}
    for cr in ("0.1", "0.01"):
        lo, hi = by.get(f"CR={cr} delta=0.1", {}), by.get(f"CR={cr} delta=0.4", {})
        rise = None if lo.get("CNC ratio") is None or hi.get("CNC ratio") is None else hi["CNC ratio"] - lo["CNC ratio"]
        fall = None if not lo.get("MB sent by devices") or not hi.get("MB sent by devices") else \
            lo["MB sent by devices"] / hi["MB sent by devices"]
        per_cr[cr] = {"cnc_rise": rise, "volume_ratio": fall}
    lines = table_markdown(table).splitlines() + [
        f"CR={cr}: CNC ratio from delta 0.1 to 0.4 {fmt(v['cnc_rise'], '+.3f')}; volume sent at delta 0.1 / at 0.4: "
        f"{fmt(v['volume_ratio'], '.2f')}x" for cr, v in per_cr.items()]
    return {"series": rows, "per_cr": per_cr, "lines": lines}


# The paper's effect at each CR: going from delta 0.1 to 0.4, the CNC ratio rises (by at least 0.1;
# within 0.02 a tie) and the volume the devices send falls (by at least 10%; within 2% a tie).
TABLE5_CRITERIA = tuple(c for cr in ("0.1", "0.01") for c in (
    Criterion(f"cnc rise CR={cr}", f"CR={cr}: CNC ratio at delta 0.4 minus at 0.1", "higher", 0.0, 0.1, 0.02),
    Criterion(f"volume fall CR={cr}", f"CR={cr}: volume sent at delta 0.1 / at 0.4", "higher", 1.0, 1.1, 0.02,
              ratio=True)))


def _table5_metrics(result: dict, scale: str) -> dict:
    out = {}
    for cr, v in result.get("per_cr", {}).items():
        out[f"cnc rise CR={cr}"], out[f"volume fall CR={cr}"] = v["cnc_rise"], v["volume_ratio"]
    return out


# Extra series on the sets where ScaDLES does not hold: ScaDLES with its linear
# learning-rate rule (Eq. 4c) off, and with its adaptive compression off, each alone -- which of
# the two makes it slower than DDL there. No criterion judges them.
ABLATIONS: dict[str, dict] = {"no lr rule": {"algorithm": {"params": {"lr_scaling": False}}},
                             "dense": {"algorithm": {"params": {"cr": None}}}}
ABLATION_SETS = ("S2", "S2'")


def _table6_series(scale: str) -> list[Series]:
    return [s for rate_set in SETS for s in (
        Series(f"ScaDLES {rate_set}", {"streaming": {"rates": rate_set}, **_stop(scale)}),
        Series(f"DDL {rate_set}", {**DDL, "streaming": {**DDL["streaming"], "rates": rate_set}, **_stop(scale)}),
        *(Series(f"ScaDLES {name} {rate_set}", {**change, "streaming": {"rates": rate_set}, **_stop(scale)})
          for name, change in ABLATIONS.items() if rate_set in ABLATION_SETS))]


def _table4_series(scale: str) -> list[Series]:
    return [Series(f"{rate_set} {who}",
                   {**(DDL if who.startswith("DDL") else {}),
                    "streaming": {**(DDL["streaming"] if who.startswith("DDL") else {}),
                                  "rates": rate_set, "buffer": who.split()[1]}, **_stop(scale)})
            for rate_set in SETS for who in T4_SERIES]


def _set_panels(y: str = "accuracy", ylabel: str = "accuracy", yscale: str = "linear") -> tuple:
    return tuple(Panel(y=y, ylabel=ylabel, yscale=yscale, only=rs, title=f"rates {rs}") for rs in SETS)


register(Experiment(
    name="table-scadles-6", paper="scadles", title="ScaDLES vs conventional DDL per rate set (Fig. 6, Table VI)",
    claim="ResNet152: accuracy drop -0.06% to -0.32%, buffer reduction 0.6-5.9 GB, speed-up 1.15x-3.29x over "
          "conventional DDL (b=64, persistence) across S1, S2, S1', S2' (16 devices)",
    expect="ScaDLES reaches the target accuracy faster than DDL on each set with a small accuracy drop",
    scenario="scenarios/scadles/streams.{scale}.yaml", series=_table6_series, analyze=_table6,
    criteria=TABLE6_CRITERIA, metrics=_table6_metrics, panels=_set_panels()))

register(Experiment(
    name="table-scadles-4", paper="scadles", title="buffer growth, persistence vs truncation (Fig. 7, Table IV)",
    claim="truncation cuts the buffer 848x-9,429x relative to persistence (ResNet152/VGG19, S1, S2, S1', S2'); "
          "under persistence ScaDLES holds 2x-641x less than DDL (Fig. 7)",
    expect="truncation's buffer is over 10x below persistence's on every set, and ScaDLES's below DDL's",
    scenario="scenarios/scadles/streams.{scale}.yaml", series=_table4_series, analyze=_table4,
    criteria=TABLE4_CRITERIA, metrics=_table4_metrics,
    panels=_set_panels("buffered", "samples buffered (all devices, log)", "log")))

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
    analyze=_table5, criteria=TABLE5_CRITERIA, metrics=_table5_metrics))
