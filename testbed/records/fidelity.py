"""Fidelity: whether the emulation kept its promises, interval by interval (Mininet-HiFi's idea:
an emulation says when it stopped being faithful).

A node is promised its CFS quota (`cpu_quota`, read from its cgroup each second, so a quota set
by calibration or changed by the timeline is covered). Between two samples of resources.csv it
  - kept its promise ("faithful") when it got at least GOT_SHARE of its quota;
  - was "idle" (by choice: waiting on the network or its peers) when it got less, but its tasks
    spent under WANT_WAIT of the interval waiting for a CPU;
  - was "starved" when it got less than GOT_SHARE of its quota although its tasks waited for a
    CPU at least WANT_WAIT of the interval: it wanted CPU the host did not have, so it ran slower
    than the device it stands for;
  - is "unlimited" (no quota: nothing promised) or "unknown" (no waiting time readable) otherwise.
Waiting for a CPU is the time the cgroup's tasks were runnable and not running (its PSI `some`
total where it has cpu.pressure, else the sum of its threads' run-queue delay: a second of waiting
by two threads counts two) less the time its quota throttled it (cpu.stat): a node that bursts
at its quota and then idles (a BSP worker at the barrier) got less than its quota over the
interval and waited while throttled, and is idle, not starved.

A link is promised its HTB rate. An interval is "saturated" when its class dropped packets:
its queue was full, so more was offered than the rate lets through (a sustained flow; TCP fills
the queue until it drops). A saturated interval in which the link carried under LINK_SHARE of its
rate is a "shortfall" (the host could not move the bytes the link should have). Overlimits with a
backlog at both ~1 s samples are not enough: bursty pushes with idle gaps between them look like
that, and a healthy BSP uplink would be flagged (BENCHMARKS.md, fidelity monitor).
A saturated link whose queue never overflows (a short burst into a long queue) goes unjudged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

from testbed.records.columns import FIDELITY_COLUMNS, RESOURCE_COLUMNS, SHAPING_COLUMNS

# Got "clearly less" than promised: under 90% of the quota. CFS gives a busy cgroup its quota to
# within a few percent per second, and a 1 s sample's edges move a period or two of 100 ms in or
# out, so 10% is past the noise and still catches a node slowed by a tenth.
GOT_SHARE = 0.9
LINE_NODES = 8  # nodes named in the one-line verdict, the worst first
# "Wanted CPU": runnable but not running for at least a tenth of the interval. A node idle by
# choice sleeps (its tasks are not runnable), so its waiting stays near zero even on a busy host.
WANT_WAIT = 0.10
# Samples closer than this (a late sample followed by a prompt one) are too short to judge.
MIN_INTERVAL_S = 0.5
# A saturated link "fell short" under 90% of its rate: HTB's wire rate runs within about 5% of its
# setting, so 10% is past the shaper's own error.
LINK_SHARE = 0.9

FIDELITY_FILE = "fidelity.csv"
FLAGGED = ("starved", "shortfall")


@dataclass(frozen=True)
class CpuSample:
    """One node's cumulative counters at one time (a resources.csv row)."""
    time: float
    cpu_seconds: Optional[float]
    cpu_quota: Optional[float]
    wait_seconds: Optional[float]
    throttled_seconds: Optional[float] = None


@dataclass(frozen=True)
class LinkSample:
    """One link direction's cumulative counters at one time: bytes carried, its HTB rate then
    (bit/s; None: unshaped), its class's overlimits and drops, and its backlog (bytes) now."""
    time: float
    bytes: int
    rate_bps: Optional[float]
    overlimits: int = 0
    drops: int = 0
    backlog: int = 0


@dataclass(frozen=True)
class Interval:
    """One judged interval: what the node (cores) or link (bit/s) got against its promise."""
    kind: str  # "node" or "link"
    name: str  # a node, or "node/up", "node/down"
    start: float
    end: float
    got: float
    promised: Optional[float]
    wait: Optional[float]  # node: share of the interval runnable but waiting; link: 1 when saturated
    verdict: str

    @property
    def flagged(self) -> bool:
        return self.verdict in FLAGGED


def _num(v) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def node_verdict(got: float, quota: Optional[float], wait: Optional[float]) -> str:
    """The rule for one interval (cores got, quota in cores, share of it spent waiting)."""
    if quota is None:
        return "unlimited"
    if got >= GOT_SHARE * quota:
        return "faithful"
    if wait is None:
        return "unknown"
    return "starved" if wait >= WANT_WAIT else "idle"


def _waited(a: CpuSample, b: CpuSample, dt: float) -> Optional[float]:
    """The share of the interval a..b the node's tasks waited for a CPU, its quota's throttling excluded."""
    if a.wait_seconds is None or b.wait_seconds is None:
        return None
    throttled = 0.0
    if a.throttled_seconds is not None and b.throttled_seconds is not None:
        throttled = max(0.0, b.throttled_seconds - a.throttled_seconds)
    return max(0.0, b.wait_seconds - a.wait_seconds - throttled) / dt


def node_intervals(name: str, samples: Iterable[CpuSample], min_interval: float = MIN_INTERVAL_S) -> list[Interval]:
    """Each pair of consecutive samples judged; a counter that went back (a restarted node's new
    cgroup) or an interval shorter than `min_interval` leaves that pair out."""
    out = []
    rows = sorted((s for s in samples if s.cpu_seconds is not None), key=lambda s: s.time)
    for a, b in zip(rows, rows[1:]):
        dt = b.time - a.time
        used = b.cpu_seconds - a.cpu_seconds  # type: ignore[operator]
        if dt < min_interval or used < 0:
            continue
        wait = _waited(a, b, dt)
        got = used / dt
        out.append(Interval("node", name, a.time, b.time, got, b.cpu_quota, wait, node_verdict(got, b.cpu_quota, wait)))
    return out


def link_verdict(got_bps: float, rate_bps: Optional[float], saturated: bool) -> str:
    if rate_bps is None:
        return "unshaped"
    if not saturated:
        return "unsaturated"
    return "shortfall" if got_bps < LINK_SHARE * rate_bps else "faithful"


def link_intervals(name: str, samples: Iterable[LinkSample], min_interval: float = MIN_INTERVAL_S) -> list[Interval]:
    """Each pair of consecutive samples of one link direction judged against its rate then."""
    out = []
    rows = sorted(samples, key=lambda s: s.time)
    for a, b in zip(rows, rows[1:]):
        dt = b.time - a.time
        carried = b.bytes - a.bytes
        if dt < min_interval or carried < 0:
            continue
        saturated = b.drops > a.drops
        got = carried * 8 / dt
        out.append(Interval("link", name, a.time, b.time, got, b.rate_bps, 1.0 if saturated else 0.0,
                            link_verdict(got, b.rate_bps, saturated)))
    return out


def summarize(intervals: list[Interval]) -> dict:
    """summary.json's `fidelity`: per node and link, the intervals judged and those flagged
    (start, end, got, promised, wait), the flagged seconds, and whether the run was faithful."""
    out: dict = {"rule": {"got_share": GOT_SHARE, "want_wait": WANT_WAIT, "link_share": LINK_SHARE},
                 "nodes": {}, "links": {}}
    for iv in intervals:
        group = out["nodes" if iv.kind == "node" else "links"]
        entry = group.setdefault(iv.name, {"promised": iv.promised, "judged": 0, "flagged_seconds": 0.0,
                                           "intervals": []})
        entry["promised"] = iv.promised
        if iv.verdict == "startup":
            entry["startup"] = entry.get("startup", 0) + 1
            continue
        entry["judged"] += 1
        if iv.flagged:
            entry["flagged_seconds"] = round(entry["flagged_seconds"] + iv.end - iv.start, 3)
            entry["intervals"].append([round(iv.start, 2), round(iv.end, 2), round(iv.got, 4),
                                       iv.promised, None if iv.wait is None else round(iv.wait, 3)])
    for entry in out["nodes"].values():
        entry["starved_seconds"] = entry.pop("flagged_seconds")
    for entry in out["links"].values():
        entry["shortfall_seconds"] = entry.pop("flagged_seconds")
    out["faithful"] = not any(iv.flagged for iv in intervals)
    return out


def one_line(fid: dict) -> str:
    """The verdict `edgebed up` ends with."""
    starved = {n: e["starved_seconds"] for n, e in fid.get("nodes", {}).items() if e["starved_seconds"]}
    short = {n: e["shortfall_seconds"] for n, e in fid.get("links", {}).items() if e["shortfall_seconds"]}
    if not starved and not short:
        judged = sum(e["judged"] for e in fid.get("nodes", {}).values())
        return (f"fidelity: faithful ({judged} node-intervals judged, none starved, no link short of its rate)"
                + dilation_note(fid))
    parts = []
    if starved:
        parts.append("starved (CPU wanted, under {:.0%} of quota): ".format(GOT_SHARE) + _worst(starved))
    if short:
        parts.append("links short of their rate: " + _worst(short))
    return ("fidelity: NOT faithful: " + "; ".join(parts) + " (summary.json 'fidelity', fidelity.csv)"
            + dilation_note(fid))


def dilation_note(fid: dict) -> str:
    """What the run's load says of its dilation (run.dilation.enough_dilation), where it says
    something: a dilated run, or one whose load did not fit."""
    d = fid.get("dilation") or {}
    k, enough = d.get("k"), d.get("enough")
    if k is None or enough is None or (k == 1 and enough <= 1):
        return ""
    if enough <= k and not fid.get("faithful", True):  # flagged, though the load fits: bursts
        return (f"; dilation: k {k:g} ran and the load fits k {enough:g}: a larger k does not help the "
                "intervals flagged (bursts at the host's speed contend at every k)")
    return f"; dilation: k {k:g} ran, k {enough:g} fits this load"


def _worst(seconds: dict[str, float], shown: int = LINE_NODES) -> str:
    """`node Ns` for the `shown` with the most seconds (a fleet's line stays one line), the rest counted."""
    worst = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{n} {s:.0f}s" for n, s in worst[:shown])
    return text + (f" and {len(worst) - shown} more" if len(worst) > shown else "")


# -- from and to a run's records -----------------------------------------------------------
def cpu_samples(run_dir: Path) -> dict[str, list[CpuSample]]:
    """resources.csv as each node's samples (a run from before these columns: quota and wait None)."""
    from testbed.records.reader import read_csv_records

    schema = {c: "float" for c in RESOURCE_COLUMNS}
    schema.update(time="time", node="name")
    df = read_csv_records(Path(run_dir) / "resources.csv", schema)  # type: ignore[arg-type]
    out: dict[str, list[CpuSample]] = {}
    for row in df.itertuples(index=False):
        out.setdefault(str(row.node), []).append(
            CpuSample(float(row.time), _num(row.cpu_seconds), _num(row.cpu_quota), _num(row.wait_seconds),
                      _num(row.throttled_seconds)))
    return out


def link_samples(run_dir: Path) -> dict[str, list[LinkSample]]:
    """shaping.csv as each link direction's ("w0/up") samples; {} for a run without one."""
    from testbed.records.reader import read_csv_records

    schema = {c: "float" for c in SHAPING_COLUMNS}
    schema.update(time="time", node="name", direction="name")
    df = read_csv_records(Path(run_dir) / "shaping.csv", schema)  # type: ignore[arg-type]
    out: dict[str, list[LinkSample]] = {}
    for row in df.itertuples(index=False):
        counts = [_num(v) for v in (row.bytes, row.overlimits, row.drops, row.backlog)]
        if counts[0] is None:
            continue
        b, ol, dr, bl = (int(c or 0) for c in counts)
        out.setdefault(f"{row.node}/{row.direction}", []).append(
            LinkSample(float(row.time), b, _num(row.rate_bps), overlimits=ol, drops=dr, backlog=bl))
    return out


def assess_run(run_dir: Path, dilation: float = 1.0, first_step: Optional[float] = None) -> list[Interval]:
    """Every node's intervals (resources.csv) and every shaped link direction's (shaping.csv). The
    records of a run dilated by k are in the world's seconds, k times shorter than the wall's
    samples: the shortest interval judged is the wall's MIN_INTERVAL_S. Intervals over before
    `first_step` (the run's first training step) are its nodes' start: "startup", not judged."""
    least = MIN_INTERVAL_S / dilation
    out = []
    for node, samples in sorted(cpu_samples(run_dir).items()):
        out += node_intervals(node, samples, least)
    for name, link in sorted(link_samples(run_dir).items()):
        out += link_intervals(name, link, least)
    return [before_training(iv, first_step) for iv in out]


def before_training(iv: Interval, first_step: Optional[float]) -> Interval:
    """An interval over before the first training step is the start of the nodes (importing torch,
    loading data, connecting): the host's work, not the world's, which begins with training (a
    device's boot is nothing a scenario states). Its verdict is "startup"."""
    if first_step is None or iv.end > first_step:
        return iv
    return replace(iv, verdict="startup")


def write_table(run_dir: Path, intervals: list[Interval]) -> Path:
    """fidelity.csv: one row per judged interval (kind, name, start, end, got, promised, wait, verdict)."""
    from testbed.records.metrics import write_whole

    return write_whole(Path(run_dir) / FIDELITY_FILE, FIDELITY_COLUMNS, (asdict(iv) for iv in intervals))
