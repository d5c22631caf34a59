"""PNG figures of a run, built from its records only (never from live state).

Figures are made with ``matplotlib.figure.Figure`` directly rather than pyplot, so
nothing touches the global backend or opens a window, and repeated calls from a
long-lived process leak no figures. A figure whose table is missing or empty is
skipped, not drawn blank.

This module writes the files; the figures are built in plot_training (accuracy, loss,
steps, streaming), plot_network (traffic, links, link check) and plot_topology, on the
shared styling of plot_style.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from testbed.records.plot_devices import devices_figure
from testbed.records.plot_energy import energy_figure
from testbed.records.plot_fidelity import fidelity_figure
from testbed.records.plot_fleet import fleet_figure
from testbed.records.plot_network import link_check_figure, link_rates_figure, links_figure, traffic_figure
from testbed.records.plot_style import DPI, Style, profile_labels, run_dir_labels, sorted_nodes, style_for
from testbed.records.plot_topology import topology_figure, wan_figure
from testbed.records.plot_training import accuracy_figure, loss_figure, steps_figure, streaming_figure
from testbed.records.reader import RunRecords, load_run

__all__ = ["plot_run", "plot_compare", "plot_progress_compare", "PLOT_FILES", "COMPARE_FILE", "PROGRESS_FILE"]

PLOT_FILES = ("accuracy.png", "loss.png", "traffic.png", "steps.png", "streaming.png", "topology.png", "wan.png",
              "links.png", "link_check.png", "link_rates.png", "fidelity.png", "devices.png", "fleet.png",
              "energy.png")
COMPARE_FILE = "compare_accuracy.png"
PROGRESS_FILE = "compare_progress.png"


def plot_run(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write the run's figures (see PLOT_FILES) into out_dir, default RUN/plots/.

    Returns the paths written; figures without data are skipped. Prints nothing.
    Raises RunNotFound if run_dir is not a run directory.
    """
    rec = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else rec.run_dir / "plots"
    style = style_for(rec)
    builders: dict[str, Callable[[RunRecords, Style], Figure | None]] = {
        "accuracy.png": accuracy_figure,
        "loss.png": loss_figure,
        "traffic.png": traffic_figure,
        "steps.png": steps_figure,
        "streaming.png": streaming_figure,
        "topology.png": topology_figure,
        "wan.png": wan_figure,
        "links.png": links_figure,
        "link_check.png": link_check_figure,
        "link_rates.png": link_rates_figure,
        "fidelity.png": fidelity_figure,  # CPU got against promised, starved intervals shaded
        "devices.png": devices_figure,  # step and link rate per catalog device
        "fleet.png": fleet_figure,  # online over time, participants and time per round (client selection, availability)
        "energy.png": energy_figure,  # device nodes' joules over time and per round (catalog power)
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
            fig.savefig(path, dpi=DPI)
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
    labels = run_dir_labels([r.run_dir for r in records])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fig = Figure(figsize=(11, 3.4 * len(records)), layout="constrained")
        axes = fig.subplots(len(records), 1, sharex=True, squeeze=False)[:, 0]
        for ax, rec, label in zip(axes, records, labels):
            style = style_for(rec)
            profiles = profile_labels(rec.meta)
            steps = rec.steps
            for node in sorted_nodes(steps["node"]):
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
        fig.savefig(path, dpi=DPI)
    return path


def plot_compare(
    run_dirs: Sequence[str | os.PathLike[str]], out_path: str | os.PathLike[str]
) -> Path | None:
    """Accuracy vs wall time, one line per run labelled by its directory name.

    Runs without eval rows are left out; returns None (writing nothing) if none has any.
    Raises RunNotFound for a path that is not a run directory.
    """
    records = [load_run(d) for d in run_dirs]
    labels = run_dir_labels([r.run_dir for r in records])
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
        fig.savefig(path, dpi=DPI)
    return path
