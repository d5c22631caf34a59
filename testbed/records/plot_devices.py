"""A run's devices side by side (devices.png): each worker's step rate and access-link rate over
time, coloured by the catalog device its profile names (meta.json's `device`), so a reader sees
which device class trained how fast and over which link. Drawn only for runs with `device:`
profiles."""

from __future__ import annotations

from typing import Any

import matplotlib
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from testbed.records.plot_style import finish_time_axes, natural_key
from testbed.records.reader import RunRecords, traffic_rates

STEP_WINDOW_S = 5.0  # steps counted per window: a device's rate, not each step's jitter


def node_devices(meta: dict[str, Any]) -> dict[str, str]:
    """node -> its catalog device's name, for the nodes meta.json records one for."""
    nodes = meta.get("nodes")
    out: dict[str, str] = {}
    if not isinstance(nodes, dict):
        return out
    for node, info in nodes.items():
        device = info.get("device") if isinstance(info, dict) else None
        name = device.get("device") if isinstance(device, dict) else None
        if isinstance(name, str) and name:
            out[str(node)] = name
    return out


def step_rates(steps: pd.DataFrame, window_s: float = STEP_WINDOW_S) -> pd.DataFrame:
    """Steps per second per node in consecutive windows: columns node, time (window's end), rate."""
    if steps.empty:
        return pd.DataFrame({"node": pd.Series(dtype=str), "time": pd.Series(dtype=float),
                             "rate": pd.Series(dtype=float)})
    df = steps[["node", "time"]].dropna()
    window = (df["time"] // window_s).astype(int)
    counts = df.groupby([df["node"], window]).size().rename("n").reset_index()
    counts.columns = ["node", "window", "n"]
    return pd.DataFrame({"node": counts["node"], "time": (counts["window"] + 1) * window_s,
                         "rate": counts["n"] / window_s})


def devices_figure(rec: RunRecords, style: Any = None) -> Figure | None:
    devices = node_devices(rec.meta)
    if not devices:
        return None
    names = sorted(set(devices.values()))
    cmap = matplotlib.colormaps["tab10"]
    color = {d: cmap(i % cmap.N) for i, d in enumerate(names)}
    fig = Figure(figsize=(12, 9), layout="constrained")
    ax_steps, ax_up, ax_down = fig.subplots(3, 1, sharex=True)
    rates = step_rates(rec.steps[rec.steps["node"].isin(list(devices))])
    for node in sorted(devices, key=natural_key):
        mine = rates[rates["node"] == node]
        ax_steps.step(mine["time"], mine["rate"], where="post", color=color[devices[node]], lw=1.2)
    links = traffic_rates(rec.traffic)
    links = links[(links["link"] == "access") & links["node"].isin(list(devices))]
    for (node, direction), g in links.groupby(["node", "direction"]):
        ax = ax_up if direction == "up" else ax_down
        g = g.dropna(subset=["mbps"])
        ax.plot(g["time"], g["mbps"], color=color[devices[str(node)]], lw=1.0)
    ax_steps.set_title(f"steps per second ({STEP_WINDOW_S:g} s windows), each worker", fontsize=10, loc="left")
    ax_up.set_title("uplink carried (node → network)", fontsize=10, loc="left")
    ax_down.set_title("downlink carried (network → node)", fontsize=10, loc="left")
    ax_steps.set_ylabel("steps/s")
    for ax in (ax_up, ax_down):
        ax.set_ylabel("Mbit/s")
    ax_down.set_xlabel("wall time (s)")
    finish_time_axes((ax_steps, ax_up, ax_down), rec.events)
    counts = pd.Series(list(devices.values())).value_counts()
    handles = [Line2D([], [], color=color[d], lw=2, label=f"{d} ({counts[d]})") for d in names]
    ax_steps.legend(handles=handles, fontsize=8, loc="upper right", title="device (workers)", title_fontsize=8)
    fig.suptitle(f"devices: {rec.name}", fontsize=11)
    return fig
