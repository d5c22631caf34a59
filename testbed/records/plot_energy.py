"""A run's energy (energy.png): each device node's cumulative joules over the run's time, and its
joules per round, coloured by the catalog device its profile names (records/energy.py). Drawn only
for runs with a node whose device states its power."""

from __future__ import annotations

from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from testbed.records.energy import energy_table, read_rounds
from testbed.records.plot_style import finish_time_axes, natural_key
from testbed.records.reader import ROUNDS_FILE, RunRecords


def energy_figure(rec: RunRecords, style: Any = None) -> Figure | None:
    table = energy_table(rec.steps, rec.meta, read_rounds(rec.run_dir / ROUNDS_FILE))
    if table.empty:
        return None
    devices = table.groupby("node")["device"].first().to_dict()
    names = sorted(set(devices.values()))
    cmap = matplotlib.colormaps["tab10"]
    color = {d: cmap(i % cmap.N) for i, d in enumerate(names)}
    fig = Figure(figsize=(12, 7), layout="constrained")
    ax_total, ax_round = fig.subplots(2, 1)
    for node in sorted(devices, key=natural_key):
        g = table[table["node"] == node]
        ax_total.step(g["time"], g["joules"].cumsum(), where="post", color=color[devices[node]], lw=1.2)
        per_round = g.dropna(subset=["round"]).groupby("round")["joules"].sum()
        ax_round.plot(per_round.index, per_round.to_numpy(), color=color[devices[node]], lw=1.0, marker=".", ms=3)
    ax_total.set_title("energy so far, each device node (J)", fontsize=10, loc="left")
    ax_total.set_ylabel("J")
    ax_total.set_xlabel("time (s)")
    finish_time_axes((ax_total,), rec.events)
    ax_round.set_title("energy per round (J): compute at active power, the rest at idle power", fontsize=10,
                       loc="left")
    ax_round.set_xlabel("round")
    ax_round.set_ylabel("J")
    ax_round.grid(alpha=0.3)
    handles = [Line2D([], [], color=color[d], lw=2, label=d) for d in names]
    ax_total.legend(handles=handles, fontsize=8, loc="upper left", title="device", title_fontsize=8)
    total = float(table["joules"].sum())
    fig.suptitle(f"energy: {rec.name} ({total:.1f} J in all)", fontsize=11)
    return fig
