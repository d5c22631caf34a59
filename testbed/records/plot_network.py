"""Figures of a run's network: traffic per node, the peers' links, and the link check (a link's
measured rate against its configured one)."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from testbed.records.plot_style import PS_COLOR, Style, finish_time_axes, natural_key
from testbed.records.reader import RunRecords, finite_float, traffic_rates


def traffic_figure(rec: RunRecords, style: Style) -> Figure | None:
    rates = traffic_rates(rec.traffic)
    rates = rates[~rates["link"].astype(str).str.startswith("wan:")]  # WAN links: wan.png
    if rates.empty:
        return None
    fig = Figure(figsize=(12, 9), layout="constrained")
    ax_up, ax_down, ax_cum = fig.subplots(3, 1, sharex=True)
    links_per_node = rates.groupby("node")["link"].nunique()

    handles: dict[str, Line2D] = {}
    series = rates.groupby(["node", "link"], sort=False)
    for (node, link), g in sorted(series, key=lambda kv: (natural_key(kv[0][0]), kv[0][1])):
        is_ps = node in style.ps
        color = PS_COLOR if is_ps else style.color(node)
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
    finish_time_axes((ax_up, ax_down, ax_cum), rec.events)
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


def links_figure(rec: RunRecords, style: Style) -> Figure | None:
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


def link_check_figure(rec: RunRecords, style: Style) -> Figure | None:
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


MAX_TRACED_PANELS = 8


def _delay_steps(ax, s) -> None:
    """A latency trace's one-way delay as set (link_rates.csv's latency_s), on a right-hand axis."""
    delays = s.dropna(subset=["latency_s"])
    if delays.empty:
        return
    right = ax.twinx()
    right.step(delays["time"], delays["latency_s"] * 1e3, where="post", color="tab:purple", lw=0.9, ls="--",
               label="one-way delay set (trace)")
    right.set_ylabel("delay (ms)", color="tab:purple")
    right.set_ylim(bottom=0)
    right.legend(fontsize=8, loc="upper left")


def link_rates_figure(rec: RunRecords, style: Style) -> Figure | None:
    """Traced links (link_rates.csv): the rate each was set to (a step per tick) beside the rate it
    carried (traffic.csv), and the delay a latency trace set, per node and direction: the trace
    the run experienced."""
    from testbed.records.columns import LINK_RATE_COLUMNS, LINK_RATES_FILE
    from testbed.records.reader import read_csv_records

    path = rec.run_dir / LINK_RATES_FILE
    if not path.exists():
        return None
    set_rates = read_csv_records(path, {c: ("str" if c in ("node", "direction") else "float")
                                        for c in LINK_RATE_COLUMNS})
    if set_rates.empty:
        return None
    carried = traffic_rates(rec.traffic)
    carried = carried[~carried["link"].astype(str).str.startswith("wan:")]
    keys = sorted(set_rates.groupby(["node", "direction"]).groups, key=lambda k: (natural_key(k[0]), k[1]))
    shown = keys[:MAX_TRACED_PANELS]
    fig = Figure(figsize=(11, 1.9 * len(shown) + 1), layout="constrained")
    axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (node, direction) in zip(axes, shown):
        s = set_rates[(set_rates["node"] == node) & (set_rates["direction"] == direction)].sort_values("time")
        rates = s.dropna(subset=["rate_bps"])
        if not rates.empty:
            ax.step(rates["time"], rates["rate_bps"] / 1e6, where="post", color="0.45", lw=0.9,
                    label="configured (trace)")
        c = carried[(carried["node"] == node) & (carried["direction"] == direction)].dropna(subset=["mbps"])
        if not c.empty:
            ax.plot(c["time"], c["mbps"], color=style.color(node), lw=1.4, label="measured (traffic.csv)")
        ax.set_ylabel("Mbit/s")
        ax.set_title(f"{node} {direction}", fontsize=9, loc="left")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _delay_steps(ax, s)
    axes[0].legend(fontsize=8, loc="upper right")
    axes[-1].set_xlabel("wall time (s)")
    more = f" (first {len(shown)} of {len(keys)})" if len(keys) > len(shown) else ""
    fig.suptitle(f"{rec.name}: traced links, configured vs measured{more}")
    return fig
