"""Figures of a run's training: test accuracy, loss, each worker's steps over time, and the
streaming buffers a run fed from topics (ScaDLES)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from testbed.records.plot_style import PS_COLOR, Style, draw_events, profile_labels, sorted_nodes, status_suffix
from testbed.records.reader import RunRecords, finite_float


def _link_check_suffix(rec: RunRecords) -> str:
    """Beside the result: whether the links were measured, and which were off (--verify-links)."""
    check = rec.meta.get("link_check")
    if not isinstance(check, dict):
        return ""
    off = check.get("off") or []
    return f"  [links checked: {len(off)} OFF: {', '.join(off)}]" if off else "  [links checked: all within " \
        f"{100 * float(check.get('tolerance', 0.1)):.0f}%]"


def accuracy_figure(rec: RunRecords, style: Style) -> Figure | None:
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
    draw_events(ax_time, rec.events)
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
    fig.suptitle(f"{rec.name}: final accuracy {final:.3f}{status_suffix(rec.summary)}{_link_check_suffix(rec)}")
    return fig


def loss_figure(rec: RunRecords, style: Style) -> Figure | None:
    steps = rec.steps.dropna(subset=["loss"])
    ev = rec.evals.dropna(subset=["loss"])
    if steps.empty and ev.empty:
        return None
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    ax = fig.subplots()
    for node in sorted_nodes(steps["node"]):
        g = steps[steps["node"] == node]
        color = style.color(node)
        # Per-step loss is noisy (one mini-batch); the raw trace stays faint, the trend bold.
        ax.plot(g["time"], g["loss"], color=color, alpha=0.25, lw=0.8)
        window = int(np.clip(len(g) // 20, 3, 50))
        smooth = g["loss"].rolling(window, min_periods=1, center=True).mean()  # centred: no lag
        ax.plot(g["time"], smooth, color=color, lw=1.6, label=f"{node} (train, mean of {window})")
    if not ev.empty:
        ax.plot(ev["time"], ev["loss"], color=PS_COLOR, marker="o", ms=3.5, lw=1.8, label="eval (test set)")
    values = pd.concat([steps["loss"], ev["loss"]])
    values = values[np.isfinite(values)]
    if len(values) and values.min() > 0 and values.max() / values.min() > 50:
        ax.set_yscale("log")  # early loss dwarfs the rest on a linear axis
    draw_events(ax, rec.events)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right", ncols=2 if steps["node"].nunique() > 8 else 1)
    ax.set_title(f"{rec.name}: training loss per worker and eval loss")
    return fig


def steps_figure(rec: RunRecords, style: Style) -> Figure | None:
    steps = rec.steps
    if steps.empty:
        return None
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    ax_cum, ax_rate = fig.subplots(2, 1, sharex=True)
    profiles = profile_labels(rec.meta)
    for node in sorted_nodes(steps["node"]):
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
        draw_events(ax, rec.events, labels=i == 0)
    ax_cum.legend(fontsize=8, loc="upper left", ncols=2 if steps["node"].nunique() > 8 else 1)
    fig.suptitle(f"{rec.name}: worker progress")
    return fig


def streaming_figure(rec: RunRecords, style: Style) -> Figure | None:
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
    for node in sorted_nodes(buf["node"]):
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
