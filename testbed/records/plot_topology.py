"""Figures of a run's topology: the picture of sites, nodes and links, and LAN vs WAN traffic.

`topology.png` is drawn for every run (a run without sites is one LAN); `wan.png` only for
runs with WAN links: traffic on each WAN direction next to the LAN traffic of each site
(DLion's Fig. 7 is read from this).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import pandas as pd
from matplotlib.figure import Figure

from testbed.records.reader import RunRecords, traffic_rates


def _rate(bps: Optional[float]) -> str:
    if not bps:
        return "∞"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            v = bps / scale
            return f"{v:.0f}{unit}" if v >= 10 or v == int(v) else f"{v:.1f}{unit}"
    return f"{bps:.0f}"


def _shape(d: dict) -> str:
    """'100M 25ms' from a Direction dump (rate in bit/s, latency in s)."""
    out = _rate(d.get("rate"))
    if d.get("latency"):
        out += f" {d['latency'] * 1e3:.0f}ms"
    if d.get("loss"):
        out += f" {d['loss'] * 100:g}%"
    return out


def topology_figure(rec: RunRecords, style: Any) -> Optional[Figure]:
    meta = rec.meta
    nodes = meta.get("nodes") or {}
    if not nodes:
        return None
    topo = meta.get("topology")
    sites = {name: s["nodes"] for name, s in topo["sites"].items()} if topo else {"lan": list(nodes)}
    links = meta.get("links") or {}
    fig = Figure(figsize=(11, 6 if len(sites) == 2 else 8.5), layout="constrained")
    ax = fig.subplots()
    ax.set_aspect("equal")
    ax.axis("off")
    n = len(sites)
    big = 0.0 if n == 1 else max(4.5, 1.6 * n)
    start = math.pi if n == 2 else math.pi / 2  # two sites side by side, more on a circle
    wan_links = (topo or {}).get("wan_links", [])
    degree = {name: sum(name in e["between"] for e in wan_links) for name in sites}
    hub = next((name for name, d in degree.items() if n > 2 and d == n - 1 == len(wan_links)), None)
    ring = [name for name in sites if name != hub]  # a star's hub sits in the middle
    centers = {name: (big * math.cos(2 * math.pi * i / len(ring) + start),
                      big * math.sin(2 * math.pi * i / len(ring) + start))
               for i, name in enumerate(ring)}
    if hub is not None:
        centers[hub] = (0.0, 0.0)
    for e in wan_links:
        (x0, y0), (x1, y1) = centers[e["between"][0]], centers[e["between"][1]]
        ax.plot([x0, x1], [y0, y1], color="tab:red", lw=2.5, zorder=1)
        fwd, rev = _shape(e["forward"]), _shape(e["reverse"])
        text = fwd if fwd == rev else (f"{e['between'][0]}→{e['between'][1]} {fwd}\n"
                                       f"{e['between'][1]}→{e['between'][0]} {rev}")
        ax.text((x0 + x1) / 2, (y0 + y1) / 2, text, ha="center", va="center", fontsize=8, color="tab:red",
                bbox=dict(boxstyle="round", fc="white", ec="tab:red", alpha=0.9), zorder=4)
    for site, members in sites.items():
        cx, cy = centers[site]
        r = 1.8 if n > 1 else 3.0
        ax.add_patch(_circle((cx, cy), r * 1.35, fc="0.96", ec="0.6", ls="--", zorder=0))
        ax.plot([cx], [cy], marker="s", ms=14, color="0.3", zorder=3)
        ax.text(cx, cy - 0.35, site if topo else "switch", ha="center", va="top", fontsize=9, weight="bold")
        for k, node in enumerate(members):
            if n == 1 or site == hub:
                a = 2 * math.pi * (k + 0.25) / max(1, len(members))
            else:  # fan the nodes out on the side facing away from the other sites (WAN lines)
                span = 1.6 * math.pi
                a = math.atan2(cy, cx) - span / 2 + span * (k + 0.5) / len(members)
            x, y = cx + r * math.cos(a), cy + r * math.sin(a)
            ax.plot([cx, x], [cy, y], color="0.55", lw=1.2, zorder=1)
            role = nodes[node].get("role", "")
            color = "black" if role == "ps" else style.color(node)
            ax.plot([x], [y], marker="o", ms=11, color=color, zorder=3)
            up = (links.get(node) or {}).get("uplink") or {}
            down = (links.get(node) or {}).get("downlink") or {}
            label = f"{node}\n↑{_rate(up.get('rate_bps'))} ↓{_rate(down.get('rate_bps'))}"
            cpus = (nodes[node].get("compute") or {}).get("cpu_quota")
            if cpus:
                label += f"\n{cpus:g} cpu"
            ax.text(x, y + 0.28, label, ha="center", va="bottom", fontsize=7)
    pad = (1.8 if n > 1 else 3.0) * 1.35 + 1.0
    xs, ys = [c[0] for c in centers.values()], [c[1] for c in centers.values()]
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    title = f"{rec.name}: topology"
    title += f" ({len(sites)} sites, {len((topo or {}).get('wan_links', []))} WAN links)" if topo else " (one LAN)"
    fig.suptitle(title + "; access links ↑ up ↓ down (bit/s)")
    return fig


def _circle(xy, r, **kw):
    from matplotlib.patches import Circle

    return Circle(xy, r, **kw)


def wan_figure(rec: RunRecords, style: Any) -> Optional[Figure]:
    rates = traffic_rates(rec.traffic)
    if rates.empty:
        return None
    wan = rates[rates["link"].astype(str).str.startswith("wan:")].dropna(subset=["mbps"])
    if wan.empty:
        return None
    topo = rec.meta.get("topology") or {}
    site_of = {n: s for s, v in (topo.get("sites") or {}).items() for n in v["nodes"]}
    access = rates[(rates["link"] == "access") & (rates["direction"] == "up")].dropna(subset=["mbps"]).copy()
    access["site"] = access["node"].map(site_of)
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    ax_wan, ax_lan = fig.subplots(2, 1, sharex=True)
    for (site, link), g in wan.groupby(["node", "link"]):
        ax_wan.plot(g["time"], g["mbps"], lw=1.5, label=f"{site} → {link[4:]}")
    if not access.empty:
        # each sample time of a site: the sum of its nodes' uplinks (what they put on the LAN)
        lan = access.assign(t=access["time"].round(0)).groupby(["site", "t"])["mbps"].sum().reset_index()
        for site, g in lan.groupby("site"):
            ax_lan.plot(g["t"], g["mbps"], lw=1.5, label=f"site {site}")
    ax_wan.set_title("WAN links, per direction", fontsize=10, loc="left")
    ax_lan.set_title("LAN: sum of the site's node uplinks", fontsize=10, loc="left")
    for ax in (ax_wan, ax_lan):
        ax.set_ylabel("Mbit/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8, loc="upper right")
    ax_lan.set_xlabel("wall time (s)")
    fig.suptitle(f"{rec.name}: LAN vs WAN traffic")
    return fig


def wan_totals(traffic: pd.DataFrame) -> dict[str, float]:
    """Bytes carried by each WAN direction over the run ('a->b' -> bytes)."""
    wan = traffic[traffic["link"].astype(str).str.startswith("wan:")]
    return {f"{site}->{link[4:]}": float(g["delta_bytes"].clip(lower=0).sum())
            for (site, link), g in wan.groupby(["node", "link"])}
