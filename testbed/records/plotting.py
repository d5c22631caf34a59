"""PNG figures of a run, built from its records only (never from live state).

Figures are made with ``matplotlib.figure.Figure`` directly rather than pyplot, so
nothing touches the global backend or opens a window, and repeated calls from a
long-lived process leak no figures. A figure whose table is missing or empty is
skipped, not drawn blank.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from testbed.records.plot_topology import topology_figure, wan_figure
from testbed.records.reader import RunRecords, finite_float, load_run, traffic_rates

__all__ = ["plot_run", "plot_compare", "plot_progress_compare", "PLOT_FILES", "COMPARE_FILE", "PROGRESS_FILE"]

PLOT_FILES = ("accuracy.png", "loss.png", "traffic.png", "steps.png", "streaming.png", "topology.png", "wan.png",
              "links.png", "link_check.png")
COMPARE_FILE = "compare_accuracy.png"
PROGRESS_FILE = "compare_progress.png"

_DPI = 110
_PS_COLOR = "black"
_EVENT_COLOR = "0.45"
_MAX_EVENT_LABELS = 15  # beyond this, labels overlap into a smear; lines alone still show when


@dataclass(frozen=True)
class _Style:
    """Per-run styling shared by all figures, so a node keeps its colour everywhere."""

    colors: dict[str, Any]
    ps: frozenset[str]

    def color(self, node: str) -> Any:
        return self.colors.get(node, "0.5")


def plot_run(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write the run's figures (see PLOT_FILES) into out_dir, default RUN/plots/.

    Returns the paths written; figures without data are skipped. Prints nothing.
    Raises RunNotFound if run_dir is not a run directory.
    """
    rec = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else rec.run_dir / "plots"
    style = _style_for(rec)
    builders: dict[str, Callable[[RunRecords, _Style], Figure | None]] = {
        "accuracy.png": _accuracy_figure,
        "loss.png": _loss_figure,
        "traffic.png": _traffic_figure,
        "steps.png": _steps_figure,
        "streaming.png": _streaming_figure,
        "topology.png": topology_figure,
        "wan.png": wan_figure,
        "links.png": _links_figure,
        "link_check.png": _link_check_figure,
    }
    written: list[Path] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "print nothing": e.g. tight-layout or empty-legend chatter
        for filename, build in builders.items():
            fig = build(rec, style)
            if fig is None:
                continue
            out.mkdir(parents=True, exist_ok=True)
            path = out / filename
            fig.savefig(path, dpi=_DPI)
            written.append(path)
    return written


def plot_progress_compare(run_dirs: Sequence[str | os.PathLike[str]], out_path: str | os.PathLike[str]) -> Path | None:
    """Heterogeneity at a glance: per run (e.g. BSP vs ASGD vs ADSP on one scenario), each
    worker's cumulative local steps over wall time, labelled with its profile and mean
    seconds per step. Under BSP the lines move together at the slowest worker's pace; under
    asynchronous algorithms the fast workers pull ahead. Returns None if no run has steps."""
    records = [r for r in (load_run(d) for d in run_dirs) if not r.steps.empty]
    if not records:
        return None
    labels = _run_labels([r.run_dir for r in records])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = Figure(figsize=(11, 3.4 * len(records)), layout="constrained")
        axes = fig.subplots(len(records), 1, sharex=True, squeeze=False)[:, 0]
        for ax, rec, label in zip(axes, records, labels):
            style = _style_for(rec)
            profiles = _profile_labels(rec.meta)
            steps = rec.steps
            for node in _sorted_nodes(steps["node"]):
                g = steps[steps["node"] == node]
                # mean, not median: under a CFS quota steps come in bursts between throttled gaps
                per_step = float(g["time"].iloc[-1] - g["time"].iloc[0]) / (len(g) - 1) if len(g) > 1 else float("nan")
                text = f"{node}" + (f" [{profiles[node]}]" if node in profiles else "")
                text += f": {per_step:.2f} s/step" if np.isfinite(per_step) else ""
                ax.plot(g["time"], g["step"], color=style.color(node), lw=1.6, drawstyle="steps-post", label=text)
            algorithm = (rec.scenario.get("algorithm") or {}).get("name", "?")
            ax.set_title(f"{label}: {algorithm}", fontsize=10, loc="left")
            ax.set_ylabel("cumulative local steps")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="upper left")
        axes[-1].set_xlabel("wall time (s)")
        fig.suptitle("local steps per worker over time (heterogeneous workers)")
        path = Path(out_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=_DPI)
    return path


def plot_compare(
    run_dirs: Sequence[str | os.PathLike[str]], out_path: str | os.PathLike[str]
) -> Path | None:
    """Accuracy vs wall time, one line per run labelled by its directory name.

    Runs without eval rows are left out; returns None (writing nothing) if none has any.
    Raises RunNotFound for a path that is not a run directory.
    """
    records = [load_run(d) for d in run_dirs]
    labels = _run_labels([r.run_dir for r in records])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = Figure(figsize=(10, 5.5), layout="constrained")
        ax = fig.subplots()
        cmap = matplotlib.colormaps["tab10" if len(records) <= 10 else "tab20"]
        drawn = 0
        targets: set[float] = set()
        for i, (rec, label) in enumerate(zip(records, labels)):
            ev = rec.evals.dropna(subset=["accuracy"])
            if ev.empty:
                continue
            color = cmap(i % cmap.N)
            ax.plot(ev["time"], ev["accuracy"], color=color, marker="o", ms=2.5, lw=1.4, label=label)
            drawn += 1
            if rec.target_accuracy is not None:
                targets.add(rec.target_accuracy)
        if drawn == 0:
            return None
        for t in sorted(targets):
            ax.axhline(t, color="tab:red", ls="--", lw=1, label=f"target {t:g}")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        ax.set_title(f"Test accuracy vs wall time ({drawn} runs)")
        path = Path(out_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=_DPI)
    return path


# --- figures ------------------------------------------------------------------------------


def _accuracy_figure(rec: RunRecords, style: _Style) -> Figure | None:
    ev = rec.evals.dropna(subset=["accuracy"])
    if ev.empty:
        return None
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax_time, ax_step = fig.subplots(1, 2, sharey=True)
    ax_time.plot(ev["time"], ev["accuracy"], color="tab:blue", marker="o", ms=3, lw=1.5)
    ax_step.plot(ev["step"], ev["accuracy"], color="tab:blue", marker="o", ms=3, lw=1.5)
    target = rec.target_accuracy
    if target is not None:
        for ax in (ax_time, ax_step):
            ax.axhline(target, color="tab:red", ls="--", lw=1.2, label=f"target {target:g}")
        ax_step.legend(loc="lower right", fontsize=8)
    _draw_events(ax_time, rec.events)
    top = max(float(ev["accuracy"].max()), target or 0.0)
    ax_time.set_ylim(0, min(1.02, top + 0.05) if top <= 1 else top * 1.05)
    ax_time.set_xlabel("wall time (s)")
    ax_step.set_xlabel("step (model version)")
    ax_time.set_ylabel("test accuracy")
    for ax in (ax_time, ax_step):
        ax.grid(alpha=0.3)

    final = finite_float(rec.summary.get("final_accuracy"))
    if final is None:
        final = float(ev["accuracy"].iloc[-1])
    fig.suptitle(f"{rec.name}: final accuracy {final:.3f}{_status_suffix(rec.summary)}{_link_check_suffix(rec)}")
    return fig


def _link_check_suffix(rec: RunRecords) -> str:
    """Beside the result: whether the links were measured, and which were off (--verify-links)."""
    check = rec.meta.get("link_check")
    if not isinstance(check, dict):
        return ""
    off = check.get("off") or []
    return f"  [links checked: {len(off)} OFF: {', '.join(off)}]" if off else "  [links checked: all within " \
        f"{100 * float(check.get('tolerance', 0.1)):.0f}%]"


def _link_check_figure(rec: RunRecords, style: _Style) -> Figure | None:
    """--verify-links: configured vs measured per worker path (rate per direction, RTT); off ones red."""
    check = rec.meta.get("link_check")
    rows = check.get("rows") if isinstance(check, dict) else None
    if not rows:
        return None
    rates = [r for r in rows if r.get("direction") != "rtt"]
    rtts = [r for r in rows if r.get("direction") == "rtt" and r.get("measured_rtt_s") is not None]
    panels = [p for p in (rates, rtts) if p]
    fig = Figure(figsize=(max(6.0, 0.7 * max(len(p) for p in panels) + 3), 3.6 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, part in zip(axes, panels):
        is_rtt = part is rtts
        labels = [f"{r['node']} {r['direction']}" if not is_rtt else r["node"] for r in part]
        conf = [1000 * r["expected_rtt_s"] if is_rtt else r["configured_bps"] / 1e6 for r in part]
        got = [1000 * r["measured_rtt_s"] if is_rtt else r["measured_bps"] / 1e6 for r in part]
        x = np.arange(len(part))
        ax.bar(x - 0.2, conf, 0.4, color="0.75", label="configured")
        ax.bar(x + 0.2, got, 0.4, color=["tab:blue" if r["ok"] else "tab:red" for r in part],
               label="measured (red: off)")
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("round trip (ms)" if is_rtt else "Mbit/s at the wire")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    tol = 100 * float(check.get("tolerance", 0.1))
    fig.suptitle(f"{rec.name}: link check after bring-up (tolerance {tol:.0f}%)")
    return fig


def _loss_figure(rec: RunRecords, style: _Style) -> Figure | None:
    steps = rec.steps.dropna(subset=["loss"])
    ev = rec.evals.dropna(subset=["loss"])
    if steps.empty and ev.empty:
        return None
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    ax = fig.subplots()
    for node in _sorted_nodes(steps["node"]):
        g = steps[steps["node"] == node]
        color = style.color(node)
        # Per-step loss is noisy (one mini-batch); the raw trace stays faint, the trend bold.
        ax.plot(g["time"], g["loss"], color=color, alpha=0.25, lw=0.8)
        window = int(np.clip(len(g) // 20, 3, 50))
        smooth = g["loss"].rolling(window, min_periods=1, center=True).mean()  # centred: no lag
        ax.plot(g["time"], smooth, color=color, lw=1.6, label=f"{node} (train, mean of {window})")
    if not ev.empty:
        ax.plot(ev["time"], ev["loss"], color=_PS_COLOR, marker="o", ms=3.5, lw=1.8, label="eval (test set)")
    values = pd.concat([steps["loss"], ev["loss"]])
    values = values[np.isfinite(values)]
    if len(values) and values.min() > 0 and values.max() / values.min() > 50:
        ax.set_yscale("log")  # early loss dwarfs the rest on a linear axis
    _draw_events(ax, rec.events)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right", ncols=2 if steps["node"].nunique() > 8 else 1)
    ax.set_title(f"{rec.name}: training loss per worker and eval loss")
    return fig


def _traffic_figure(rec: RunRecords, style: _Style) -> Figure | None:
    rates = traffic_rates(rec.traffic)
    rates = rates[~rates["link"].astype(str).str.startswith("wan:")]  # WAN links: wan.png
    if rates.empty:
        return None
    fig = Figure(figsize=(12, 9), layout="constrained")
    ax_up, ax_down, ax_cum = fig.subplots(3, 1, sharex=True)
    links_per_node = rates.groupby("node")["link"].nunique()

    handles: dict[str, Line2D] = {}
    series = rates.groupby(["node", "link"], sort=False)
    for (node, link), g in sorted(series, key=lambda kv: (_natural_key(kv[0][0]), kv[0][1])):
        is_ps = node in style.ps
        color = _PS_COLOR if is_ps else style.color(node)
        label = node if links_per_node.get(node, 1) <= 1 else f"{node}/{link}"
        if is_ps:
            label += " (PS)"
        lw, z = (2.2, 3) if is_ps else (1.1, 2)
        for direction, ax in (("up", ax_up), ("down", ax_down)):
            d = g[g["direction"] == direction].dropna(subset=["mbps"])
            if d.empty:
                continue
            ax.plot(d["time"], d["mbps"], color=color, lw=lw, zorder=z)
            if is_ps and direction == "down":  # PS ingress is the usual bottleneck: make it stand out
                ax.fill_between(d["time"], d["mbps"], color=color, alpha=0.08, zorder=1)
            handles.setdefault(label, Line2D([], [], color=color, lw=lw, label=label))
        for direction, ls in (("up", "-"), ("down", "--")):
            d = g[g["direction"] == direction]
            if d.empty:
                continue
            cumulative = d["delta_bytes"].fillna(0).clip(lower=0).cumsum() / 1e6
            ax_cum.plot(d["time"], cumulative, color=color, ls=ls, lw=lw, zorder=z)
            handles.setdefault(label, Line2D([], [], color=color, lw=lw, label=label))

    ax_up.set_title("up (node → network)", fontsize=10, loc="left")
    ax_down.set_title("down (network → node); PS down = PS ingress", fontsize=10, loc="left")
    ax_cum.set_title("cumulative (sum of delta_bytes; solid up, dashed down)", fontsize=10, loc="left")
    ax_up.set_ylabel("Mbit/s")
    ax_down.set_ylabel("Mbit/s")
    ax_cum.set_ylabel("MB")
    ax_cum.set_xlabel("wall time (s)")
    for i, ax in enumerate((ax_up, ax_down, ax_cum)):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _draw_events(ax, rec.events, labels=i == 0)
    style_handles = [
        Line2D([], [], color="0.3", ls="-", label="up"),
        Line2D([], [], color="0.3", ls="--", label="down"),
    ]
    fig.legend(handles=[*handles.values(), *style_handles], loc="outside right upper", fontsize=8)

    ingress = finite_float(rec.summary.get("ps_ingress_bytes"))
    if ingress is None and style.ps:
        ps_down = rates[rates["node"].isin(style.ps) & (rates["direction"] == "down")]
        ingress = float(ps_down["delta_bytes"].clip(lower=0).sum()) if not ps_down.empty else None
    suffix = f", PS ingress {ingress / 1e6:.1f} MB" if ingress is not None else ""
    fig.suptitle(f"{rec.name}: traffic per node{suffix}")
    return fig


def _steps_figure(rec: RunRecords, style: _Style) -> Figure | None:
    steps = rec.steps
    if steps.empty:
        return None
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    ax_cum, ax_rate = fig.subplots(2, 1, sharex=True)
    profiles = _profile_labels(rec.meta)
    for node in _sorted_nodes(steps["node"]):
        g = steps[steps["node"] == node]
        color = style.color(node)
        span = float(g["time"].iloc[-1] - g["time"].iloc[0])
        mean_rate = (int(g["step"].iloc[-1]) - int(g["step"].iloc[0])) / span if span > 0 else float("nan")
        label = node + (f" [{profiles[node]}]" if node in profiles else "")
        if np.isfinite(mean_rate):
            label += f": {mean_rate:.2f} steps/s"
        ax_cum.plot(g["time"], g["step"], color=color, lw=1.6, drawstyle="steps-post", label=label)
        # Rate over the last k steps: smooth for fast workers, still defined for slow ones.
        k = int(np.clip(len(g) // 10, 1, 10))
        dt = g["time"].diff(k)
        rate = (g["step"].diff(k) / dt).where(dt > 0)
        ax_rate.plot(g["time"], rate, color=color, lw=1.3)
    ax_cum.set_ylabel("cumulative steps")
    ax_rate.set_ylabel("steps/s")
    ax_rate.set_xlabel("wall time (s)")
    ax_cum.set_title("cumulative local steps (legend: mean rate)", fontsize=10, loc="left")
    ax_rate.set_title("step rate (over the last few steps)", fontsize=10, loc="left")
    for i, ax in enumerate((ax_cum, ax_rate)):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _draw_events(ax, rec.events, labels=i == 0)
    ax_cum.legend(fontsize=8, loc="upper left", ncols=2 if steps["node"].nunique() > 8 else 1)
    fig.suptitle(f"{rec.name}: worker progress")
    return fig


def _streaming_figure(rec: RunRecords, style: _Style) -> Figure | None:
    """Stream buffers (ScaDLES Fig. 7: buffer size vs time per device) and streaming wait per step."""
    from testbed.records.columns import BUFFER_COLUMNS, STREAM_STEP_COLUMNS
    from testbed.records.reader import read_csv_records

    buf_path, st_path = rec.run_dir / "buffer.csv", rec.run_dir / "stream.csv"
    if not buf_path.exists():
        return None
    buf = read_csv_records(buf_path, {c: ("str" if c == "node" else "float") for c in BUFFER_COLUMNS})
    st = (read_csv_records(st_path, {c: ("str" if c == "node" else "float") for c in STREAM_STEP_COLUMNS})
          if st_path.exists() else pd.DataFrame(columns=STREAM_STEP_COLUMNS))
    if buf.empty:
        return None
    rates = (rec.meta.get("streaming") or {}).get("rates", {})
    schedules = (rec.meta.get("streaming") or {}).get("schedules", {})
    # A third panel when some device's rate follows a trace: the rate it was at over time.
    varying = "rate" in buf and buf["rate"].notna().any() and (buf.groupby("node")["rate"].nunique() > 1).any()
    fig = Figure(figsize=(11, 10 if varying else 7.5), layout="constrained")
    axes = fig.subplots(3 if varying else 2, 1, sharex=True)
    ax_buf, ax_wait = axes[0], axes[-1]
    for node in _sorted_nodes(buf["node"]):
        g = buf[buf["node"] == node]
        traced = len(schedules.get(node, {}).get("rates", [])) > 1
        label = node + (" (trace)" if traced else f" ({rates[node]:.0f} samples/s)" if node in rates else "")
        ax_buf.plot(g["time"], g["buffered"], color=style.color(node), lw=1.5, label=label)
        if varying:
            axes[1].plot(g["time"], g["rate"], color=style.color(node), lw=1.5, drawstyle="steps-post")
        w = st[st["node"] == node]
        if not w.empty:
            ax_wait.plot(w["time"], w["wait_seconds"], color=style.color(node), lw=1.0, marker=".", ms=3)
    if varying:
        axes[1].set_ylabel("streaming rate (samples/s)")
        axes[1].set_title("each device's rate (a trace, or constant)", fontsize=10, loc="left")
    policy = (rec.scenario.get("streaming") or {}).get("buffer", "?")
    ax_buf.set_ylabel("buffered samples")
    ax_buf.set_title(f"stream buffer per device ({policy})", fontsize=10, loc="left")
    ax_wait.set_ylabel("wait for batch (s)")
    ax_wait.set_xlabel("wall time (s)")
    ax_wait.set_title("streaming wait before each step", fontsize=10, loc="left")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    ax_buf.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{rec.name}: streaming")
    return fig


def _links_figure(rec: RunRecords, style: _Style) -> Figure | None:
    """Worker-to-worker traffic (peers.csv): decentralized exchanges and data injection, per link.
    Cross-site links are dashed; the lower panel is what each link carried per step."""
    from testbed.records.columns import PEER_COLUMNS
    from testbed.records.reader import read_csv_records

    path = rec.run_dir / "peers.csv"
    if not path.exists():
        return None
    kinds = {c: ("str" if c in ("node", "peer", "kind") else "float") for c in PEER_COLUMNS}
    df = read_csv_records(path, kinds)
    if df.empty:
        return None
    sites = {n: (info or {}).get("site") for n, info in (rec.meta.get("nodes") or {}).items()}
    grads = df[df["kind"] == "grad"]
    fig = Figure(figsize=(11, 8 if not grads.empty else 4.5), layout="constrained")
    axes = fig.subplots(2 if not grads.empty else 1, 1, sharex=True, squeeze=False)[:, 0]
    ax_cum = axes[0]
    for (node, peer), g in df.sort_values("time").groupby(["node", "peer"]):
        cross = sites.get(node) != sites.get(peer)
        ls = "--" if cross else "-"
        ax_cum.plot(g["time"], g["bytes"].cumsum() / 1e6, color=style.color(node), ls=ls, lw=1.3,
                    label=f"{node}→{peer}" + (" (WAN)" if cross else ""))
        if not grads.empty:
            gg = grads[(grads["node"] == node) & (grads["peer"] == peer)]
            axes[1].plot(gg["time"], gg["entries"], color=style.color(node), ls=ls, lw=0.9)
    what = ", ".join(sorted(df["kind"].unique()))
    ax_cum.set_ylabel("MB sent (cumulative)")
    ax_cum.set_title(f"per link, by sender ({what})", fontsize=10, loc="left")
    ax_cum.legend(fontsize=7, ncol=4, loc="upper left")
    if not grads.empty:
        axes[1].set_yscale("log")
        axes[1].set_ylabel("gradient entries per message")
        axes[1].set_title("what each link carried per step (fewer on slower links)", fontsize=10, loc="left")
    axes[-1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{rec.name}: worker-to-worker links")
    return fig


# --- helpers ------------------------------------------------------------------------------


def _style_for(rec: RunRecords) -> _Style:
    nodes = set(rec.node_roles) | set(rec.steps["node"]) | set(rec.traffic["node"])
    ps = frozenset(rec.ps_nodes)
    others = _sorted_nodes(n for n in nodes if n not in ps)
    cmap = matplotlib.colormaps["tab10" if len(others) <= 10 else "tab20"]
    colors: dict[str, Any] = {n: cmap(i % cmap.N) for i, n in enumerate(others)}
    colors.update({n: _PS_COLOR for n in ps})
    return _Style(colors=colors, ps=ps)


def _draw_events(ax: Axes, events: pd.DataFrame, labels: bool = True) -> None:
    """Scenario events (link changes, node kills, ...) as vertical lines on a time axis."""
    if events.empty:
        return
    show_labels = labels and len(events) <= _MAX_EVENT_LABELS
    for ev in events.itertuples(index=False):
        ax.axvline(ev.time, color=_EVENT_COLOR, ls=":", lw=1.1, zorder=0)
        if show_labels:
            text = " ".join(s for s in (str(ev.target), str(ev.action)) if s)
            ax.text(
                ev.time, 0.98, text, transform=ax.get_xaxis_transform(), rotation=90,
                ha="right", va="top", fontsize=7, color=_EVENT_COLOR,
            )  # fmt: skip


def _status_suffix(summary: dict[str, Any]) -> str:
    status = summary.get("status")
    if not status or status == "completed":
        return ""
    reason = str(summary.get("reason") or "")
    reason = reason if len(reason) <= 60 else reason[:57] + "..."
    return f" ({status}{': ' + reason if reason else ''})"


def _profile_labels(meta: dict[str, Any]) -> dict[str, str]:
    """node -> short profile description for legends ("cpus=0.5"), where meta has one."""
    nodes = meta.get("nodes")
    out: dict[str, str] = {}
    if not isinstance(nodes, dict):
        return out
    for node, info in nodes.items():
        if not isinstance(info, dict):
            continue
        profile = info.get("profile")
        if info.get("profile_name"):
            out[str(node)] = str(info["profile_name"])
        elif isinstance(profile, str) and profile:
            out[str(node)] = profile
        elif isinstance(profile, dict):
            if profile.get("name"):
                out[str(node)] = str(profile["name"])
            elif finite_float(profile.get("cpus")) is not None:
                out[str(node)] = f"cpus={finite_float(profile['cpus']):g}"
    return out


def _run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Directory names, with the parent added where two runs share a name."""
    resolved = [d.resolve() for d in run_dirs]  # "." has no name until resolved
    names = [p.name for p in resolved]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in resolved]


def _natural_key(name: str) -> list[Any]:
    # w2 before w10
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name) if t]


def _sorted_nodes(nodes: Iterable[str]) -> list[str]:
    return sorted(set(nodes), key=_natural_key)
