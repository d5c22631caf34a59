"""The fidelity figure: per node, the CPU it got against the quota it was promised, with the
intervals in which it was starved shaded (records.fidelity's rule); below, the share of each
interval its tasks spent runnable but waiting, with the rule's threshold; links short of their
rate, where the run recorded any, in a third panel."""

from __future__ import annotations

from typing import Any, Callable, Optional

from matplotlib.figure import Figure

from testbed.records import fidelity as F
from testbed.records.plot_style import Style, sorted_nodes
from testbed.records.reader import RunRecords


def fidelity_figure(rec: RunRecords, style: Style) -> Figure | None:
    """`edgebed plot`'s fidelity.png (None: no node had a quota, nothing was promised)."""
    return draw_fidelity(F.assess_run(rec.run_dir), style.color, title=f"{rec.name}: fidelity")


def _by_name(intervals: list[F.Interval]) -> dict[str, list[F.Interval]]:
    out: dict[str, list[F.Interval]] = {}
    for iv in intervals:
        out.setdefault(iv.name, []).append(iv)
    return out


def draw_fidelity(intervals: list[F.Interval], color: Optional[Callable[[str], Any]] = None,
                  title: str = "fidelity") -> Figure | None:
    nodes = _by_name([iv for iv in intervals if iv.kind == "node" and iv.promised is not None])
    links = _by_name([iv for iv in intervals if iv.kind == "link" and iv.promised is not None])
    if not nodes:
        return None
    col = color or (lambda n: None)
    rows = 3 if links else 2
    fig = Figure(figsize=(11, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    for name in sorted_nodes(nodes):
        ivs = nodes[name]
        mid = [(iv.start + iv.end) / 2 for iv in ivs]
        axes[0].plot(mid, [iv.got for iv in ivs], color=col(name), lw=1.3, label=name)
        axes[0].step([iv.end for iv in ivs], [iv.promised for iv in ivs], where="pre", color=col(name), ls="--", lw=0.8)
        axes[1].plot(mid, [iv.wait if iv.wait is not None else float("nan") for iv in ivs], color=col(name), lw=1.0)
        for iv in ivs:
            if iv.flagged:
                axes[0].axvspan(iv.start, iv.end, color=col(name) or "red", alpha=0.15, lw=0)
    flagged = sum(iv.end - iv.start for v in nodes.values() for iv in v if iv.flagged)
    axes[0].set_ylabel("CPU got (cores)")
    axes[0].set_title(f"got (solid) against the quota (dashed); shaded: starved ({flagged:.0f} node-seconds)",
                      fontsize=10, loc="left")
    axes[0].legend(fontsize=7, ncol=6, loc="upper left")
    axes[1].axhline(F.WANT_WAIT, color="0.3", ls=":", lw=1)
    axes[1].set_ylabel("waiting for a CPU\n(share of interval)")
    if links:
        for name in sorted(links):
            ivs = links[name]
            axes[2].plot([(iv.start + iv.end) / 2 for iv in ivs], [iv.got / max(iv.promised or 1, 1) for iv in ivs],
                         lw=1.0, label=name)
            for iv in ivs:
                if iv.flagged:
                    axes[2].axvspan(iv.start, iv.end, color="red", alpha=0.15, lw=0)
        axes[2].axhline(F.LINK_SHARE, color="0.3", ls=":", lw=1)
        axes[2].set_ylabel("carried / set rate")
        axes[2].legend(fontsize=7, ncol=6, loc="upper left")
    axes[-1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig
