"""What every figure of a run shares: a node's colour, the scenario's events drawn on a time
axis, a run's status and profile labels, and node names in natural order (w2 before w10)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import pandas as pd
from matplotlib.axes import Axes

from testbed.records.reader import RunRecords, finite_float

DPI = 110
PS_COLOR = "black"
_EVENT_COLOR = "0.45"
_MAX_EVENT_LABELS = 15  # beyond this, labels overlap into a smear; lines alone still show when


@dataclass(frozen=True)
class Style:
    """Per-run styling shared by all figures, so a node keeps its colour everywhere."""

    colors: dict[str, Any]
    ps: frozenset[str]

    def color(self, node: str) -> Any:
        return self.colors.get(node, "0.5")


def style_for(rec: RunRecords) -> Style:
    nodes = set(rec.node_roles) | set(rec.steps["node"]) | set(rec.traffic["node"])
    ps = frozenset(rec.ps_nodes)
    others = sorted_nodes(n for n in nodes if n not in ps)
    cmap = matplotlib.colormaps["tab10" if len(others) <= 10 else "tab20"]
    colors: dict[str, Any] = {n: cmap(i % cmap.N) for i, n in enumerate(others)}
    colors.update({n: PS_COLOR for n in ps})
    return Style(colors=colors, ps=ps)


def draw_events(ax: Axes, events: pd.DataFrame, labels: bool = True) -> None:
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


def finish_time_axes(axes: Sequence[Axes], events: pd.DataFrame) -> None:
    """Stacked time axes: from zero, a grid, the scenario's events (labelled on the top one)."""
    for i, ax in enumerate(axes):
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        draw_events(ax, events, labels=i == 0)


def status_suffix(summary: dict[str, Any]) -> str:
    status = summary.get("status")
    if not status or status == "completed":
        return ""
    reason = str(summary.get("reason") or "")
    reason = reason if len(reason) <= 60 else reason[:57] + "..."
    return f" ({status}{': ' + reason if reason else ''})"


def profile_labels(meta: dict[str, Any]) -> dict[str, str]:
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


def run_dir_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Directory names, with the parent added where two runs share a name."""
    resolved = [d.resolve() for d in run_dirs]  # "." has no name until resolved
    names = [p.name for p in resolved]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in resolved]


def natural_key(name: str) -> list[Any]:
    # w2 before w10
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name) if t]


def sorted_nodes(nodes: Iterable[str]) -> list[str]:
    return sorted(set(nodes), key=natural_key)
