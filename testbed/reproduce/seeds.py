"""An experiment's seeds gathered: tables as mean and range, curves as a mean with a min-max band,
and each criterion's per-seed values beside its bar."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Panel:
    """One panel of an experiment's band figure: y against x from the seeds' curves (NAME.csv),
    for the series whose label has `only` as one of its words (all when empty): "S1" is not "S1'"."""

    x: str = "time"
    y: str = "accuracy"
    xlabel: str = "seconds"
    ylabel: str = "accuracy"
    only: str = ""
    title: str = ""
    xscale: str = "linear"
    yscale: str = "linear"
    x_factor: float = 1.0  # e.g. 1e-6 for bytes drawn as MB
    reference: tuple = ()  # the paper's own points, (x, y, label), drawn as markers beside ours


ROW_LISTS = ("table", "sets", "series")  # where a seed's headline keeps its rows, most specific first


def _rows(result: dict) -> list[dict]:
    for key in ROW_LISTS:
        rows = result.get(key)
        if isinstance(rows, list) and rows and isinstance(rows[0], dict):
            return rows
    return []


def aggregate_rows(results: list[dict]) -> pd.DataFrame:
    """The seeds' rows (a series, a set, a method) side by side: per numeric column its mean, min and
    max over the seeds that have it; the row's label is its first text column."""
    frames = [pd.DataFrame(_rows(r)).assign(_seed=k) for k, r in enumerate(results) if _rows(r)]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    label = next(c for c in df.columns if df[c].map(lambda v: isinstance(v, str)).all())
    order = list(dict.fromkeys(df[label]))
    numeric = [c for c in df.columns if c not in (label, "_seed")
               and df[c].map(lambda v: v is None or isinstance(v, (int, float, np.number))).all()
               and not df[c].map(lambda v: isinstance(v, bool)).any()]
    out = []
    for name in order:
        g = df[df[label] == name]
        row = {label: name, "seeds": int(g._seed.nunique())}
        for c in numeric:
            v = pd.to_numeric(g[c], errors="coerce").dropna()
            row[c] = float(v.mean()) if len(v) else None
            row[f"{c} min"] = float(v.min()) if len(v) else None
            row[f"{c} max"] = float(v.max()) if len(v) else None
            if len(v) < len(g):
                row[f"{c} missing"] = int(len(g) - len(v))
        out.append(row)
    return pd.DataFrame(out)


def _cell(row, c) -> str:
    v = row.get(c)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "-"
    lo, hi, miss = row.get(f"{c} min"), row.get(f"{c} max"), row.get(f"{c} missing")
    text = f"{v:.3g}" if lo is None or lo == hi else f"{v:.3g} [{lo:.3g}, {hi:.3g}]"
    return text + (f" ({int(miss)} none)" if miss and not np.isnan(miss) else "")


def band_table_lines(table: pd.DataFrame, seeds: int) -> list[str]:
    """Markdown: each row's numbers as mean [min, max] over the seeds."""
    if table.empty:
        return []
    label = table.columns[0]
    cols = [c for c in table.columns[2:] if not c.endswith((" min", " max", " missing"))]
    lines = [f"mean [min, max] over {seeds} seed{'s' if seeds != 1 else ''}",
             "| " + " | ".join([label] + cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for _, row in table.iterrows():
        lines.append("| " + " | ".join([str(row[label])] + [_cell(row, c) for c in cols]) + " |")
    return lines


def _band(curves: list[pd.DataFrame], x: str, y: str, log: bool):
    """Mean, min and max of y over the curves on one x grid; a curve counts only inside its own x range."""
    if log:  # a log axis has no room for x = 0 (the untrained model's evaluation)
        curves = [c[c[x] > 0] for c in curves]
    spans = [(c[x].min(), c[x].max()) for c in curves if len(c)]
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    if log:
        grid = np.geomspace(lo, max(hi, lo * 1.0001), 200)
    else:
        grid = np.linspace(lo, hi, 200)
    ys = np.full((len(curves), len(grid)), np.nan)
    for i, c in enumerate(curves):
        c = c.dropna(subset=[x, y]).sort_values(x)
        if len(c) == 0:
            continue
        inside = (grid >= c[x].iloc[0]) & (grid <= c[x].iloc[-1])
        ys[i, inside] = np.interp(grid[inside], c[x].to_numpy(float), c[y].to_numpy(float))
    with warnings.catch_warnings():  # a grid point no seed covers is NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        return grid, np.nanmean(ys, axis=0), np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)


def _seed_curves(per_seed: dict) -> list[pd.DataFrame]:
    out = []
    for seed, v in per_seed.items():
        path = Path(v["curves"]).with_suffix(".csv")
        try:
            out.append(pd.read_csv(path).assign(seed=seed))
        except (OSError, ValueError):
            pass
    return out


def _draw_panel(ax, panel, curves: list[pd.DataFrame], band_rows: list[pd.DataFrame]) -> None:
    series = list(dict.fromkeys(s for c in curves for s in c.get("series", pd.Series(dtype=str)).unique()
                                if not panel.only or panel.only in str(s).split()))
    for name in series:
        per = [c[c.series == name].assign(**{panel.x: lambda d: d[panel.x] * panel.x_factor}) for c in curves]
        per = [p for p in per if len(p) and panel.x in p and panel.y in p]
        if not per:
            continue
        grid, mean, low, high = _band(per, panel.x, panel.y, panel.xscale == "log")
        label = " ".join(w for w in str(name).split() if w != panel.only) if panel.only else name
        line, = ax.plot(grid, mean, label=f"{label} (n={len(per)})")
        ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, lw=0)
        band_rows.append(pd.DataFrame({"panel": panel.title or panel.only or panel.y, "series": name, "x": grid,
                                       "mean": mean, "min": low, "max": high}))
    for x, y, label in panel.reference:
        ax.scatter([x], [y], marker="*", s=60, color="k", zorder=4)
        ax.annotate(label, (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
    ax.set_xscale(panel.xscale)
    ax.set_yscale(panel.yscale)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title or panel.only, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def _draw_criteria(ax, criteria, judgements) -> None:
    """Each criterion's per-seed values (dots) and their mean (bar, coloured by the verdict), on a
    scale shared by different units: 0 is no effect, 1 the bar to clear (a limit, whose bar is
    its no-effect value, is drawn in units of the limit), the bar's level a green tick."""
    colours = {"holds": "tab:green", "weak": "tab:orange", "tie": "tab:grey"}
    for i, (c, j) in enumerate(zip(criteria, judgements)):
        span = abs(c.bar - c.neutral) or abs(c.neutral) or 1.0
        sign = 1 if c.better == "higher" else -1
        rel = lambda v, sign=sign, c=c, span=span: sign * (v - c.neutral) / span  # noqa: E731
        vals = [v for v in j.values if v is not None]
        ax.scatter([i] * len(vals), [rel(v) for v in vals], color="k", s=12, zorder=3)
        if j.mean is not None:
            ax.bar(i, rel(j.mean), color=colours.get(j.verdict, "tab:red"), alpha=0.6)
            ax.annotate(f"{j.mean:.3g}", (i, rel(j.mean)), ha="center", va="bottom", fontsize=6)
        ax.hlines(rel(c.bar), i - 0.4, i + 0.4, color="tab:green", lw=1.5)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(criteria)))
    ax.set_xticklabels([f"{c.key}\n{j.verdict}" for c, j in zip(criteria, judgements)], fontsize=6, rotation=20,
                       ha="right")
    ax.set_ylabel("effect (0: none; green: the bar)", fontsize=8)
    ax.set_title("criteria: seeds (dots), mean (bar)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")


def band_figure(exp, per_seed: dict, judgements, out: Path, scale: str) -> None:
    """out.png: each panel's mean curve and min-max band over the seeds, then the criteria; out.csv
    the bands' numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(exp.panels(scale) if callable(exp.panels) else exp.panels) or [Panel()]
    curves = _seed_curves(per_seed)
    n = len(panels) + (1 if exp.criteria else 0)
    fig, axes = plt.subplots(1, n, figsize=(3.9 * n, 4.0), squeeze=False)
    band_rows: list[pd.DataFrame] = []
    for ax, panel in zip(axes[0], panels):
        _draw_panel(ax, panel, curves, band_rows)
    if exp.criteria:
        _draw_criteria(axes[0][-1], exp.criteria, judgements)
    fig.suptitle(f"{exp.paper} {exp.name} ({scale} scale, {len(per_seed)} seed{'s' if len(per_seed) != 1 else ''}): "
                 f"{exp.title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    plt.close(fig)
    (pd.concat(band_rows) if band_rows else pd.DataFrame()).to_csv(out.with_suffix(".csv"), index=False)
