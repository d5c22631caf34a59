"""A fidelity report with every run (`edgebed up --verify-links`, or `network: {verify_links: true}`).

Right after bring-up and before any training, each worker's path to the PS is measured briefly:
one saturating TCP flow per shaped direction (worker -> PS, then PS -> worker), its wire rate taken
from the worker's own interface counters after a short warm-up, against the path's configured
bottleneck (the access links, a `links:` pair's class, the WAN hops: cluster.path_rate); and,
where a latency is set, the round trip of small training messages through the same transport and
delay line a run uses, against the configured one. Results go to RUN/link_check.csv and
meta.json["link_check"]; a path more than `tolerance` off is a warning the run prints and keeps.

Measured at the wire (IP packets + Ethernet header), which is what HTB shapes, so a faithful link
reads ~100%; goodput would sit ~4.4% lower (headers). The measuring processes run inside the nodes
under their CPU caps: a node too slow to fill its own link reads low, and that is real. A reading
more than 3% off is taken once more over a longer window (a single stall under the cap costs a
1 s window several percent); a node that is really too slow reads low twice.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Callable, Optional

from testbed.node import untrusted
from testbed.plan.cluster import ClusterSpec, path_rate
from testbed.run.flows import Flow, measure_flows, ping_client, ping_server
from testbed.scenario import units

COLUMNS = ["node", "direction", "configured_bps", "measured_bps", "ratio", "expected_rtt_s", "measured_rtt_s",
           "min_rtt_s", "ok", "note"]
UNSHAPED_BPS = 10e9  # rates at or above this are "unlimited" classes, not a configured rate


def _expected_rtt(spec: ClusterSpec, node, ps) -> float:
    """Configured round trip node -> ps -> node: both access links each way, plus the WAN path."""
    rtt = sum((d.latency or 0.0) for d in (node.link.uplink, node.link.downlink, ps.link.uplink, ps.link.downlink))
    if spec.topology is not None and node.site != ps.site:
        rtt += spec.topology.path_delay(node.site, ps.site)[0] + spec.topology.path_delay(ps.site, node.site)[0]
    return rtt


def planned_flows(spec: ClusterSpec, direction: str, read_counter: Callable[[str, str], int]) -> list[tuple]:
    """(Flow, configured bit/s, worker) for every worker whose path to the PS is shaped in
    `direction`; `read_counter(node, "up_bytes" | "down_bytes")` reads the node's wire bytes."""
    flows = []
    for node in spec.workers:
        sender, receiver = (node, spec.ps) if direction == "up" else (spec.ps, node)
        configured = path_rate(spec, sender, receiver)
        if configured is None or configured >= UNSHAPED_BPS:
            continue
        flows.append((Flow(f"{node.name}-{direction}", sender, receiver,
                           lambda n=node.name, k=f"{direction}_bytes": read_counter(n, k)), configured, node))
    return flows


def _batches(spec: ClusterSpec, flows: list[tuple], ps_side_rate: Optional[float], together: bool) -> list[list[tuple]]:
    """Flows that can be measured together: on one LAN, when their configured rates add up to no
    more than 90% of the PS's side of the path (they share only that); otherwise one at a time."""
    total = sum(f[1] for f in flows)
    if together and spec.topology is None and (ps_side_rate is None or total <= 0.9 * ps_side_rate):
        return [flows] if flows else []
    return [[f] for f in flows]


def verify_links(rt, spec: ClusterSpec, delays: dict, scratch, *, window: float = 1.0, warmup: float = 0.7,
                 pings: int = 10, tolerance: float = 0.10, together: bool = True, recheck: float = 0.03,
                 say: Callable[[str], None] = print) -> list[dict]:
    """Measure every worker's path to the PS (see the module doc). `delays[node]` is the node's
    transport DelaySpec as the run gives it. A rate more than `recheck` off is measured again
    (a faithful link reads within ~1%). Returns one row per measured direction."""
    scratch.mkdir(parents=True, exist_ok=True)
    ps = spec.ps
    rows: list[dict] = []
    for direction in ("up", "down"):
        flows = planned_flows(spec, direction, rt.link_counter)
        ps_side = (ps.link.downlink if direction == "up" else ps.link.uplink).rate
        for batch in _batches(spec, flows, None if ps_side is None else float(ps_side), together):
            rates = measure_flows(rt, scratch, [f[0] for f in batch], window=window, warmup=warmup)
            for (flow, configured, node), rate in zip(batch, rates):
                row = _rate_row(node.name, direction, configured, rate.wire_bps, tolerance,
                                "measured together" if len(batch) > 1 else "")
                if abs(1 - row["ratio"]) > recheck:
                    row = _measure_again(rt, scratch, flow, row, window, warmup, tolerance)
                rows.append(row)
    # round trips: one ping server on the PS answers every delayed worker's client at once
    delayed = [(n, _expected_rtt(spec, n, ps)) for n in spec.workers]
    delayed = [(n, e) for n, e in delayed if e > 0]
    if delayed:
        srv = rt.start(ps.name, ping_server, {"address": ps.address, "delay": _delay_dict(delays[ps.name]),
                                               "count": len(delayed) * (pings + 1)})
        clients = [rt.start(n.name, ping_client, {"ps_address": ps.address, "delay": _delay_dict(delays[n.name]),
                                                   "count": pings + 1, "size": 64, "name": n.name,
                                                   "result_path": str(scratch / f"{n.name}-rtt.json")})
                   for n, _ in delayed]
        for c in clients:
            c.join(60)
        srv.join(10)
        for node, expected in delayed:
            try:  # the first round trip includes connection set-up
                rtts = untrusted.loads((scratch / f"{node.name}-rtt.json").read_text())["rtts"][1:]
                rtts = [float(r) for r in rtts]  # a job's result, from a node: numbers or nothing
            except (OSError, ValueError, KeyError, TypeError):
                rtts = []
            med = statistics.median(rtts) if rtts else None
            # the least round trip is the path's own delay (ping's min): load on the host only adds to it
            least = min(rtts) if rtts else None
            # 5 ms of slack: the transport adds ~0.3 ms unshaped, +0.8 ms a hop, more under a small CPU cap
            ok = med is not None and abs(med - expected) <= max(0.005, tolerance * expected)
            rows.append({"node": node.name, "direction": "rtt", "configured_bps": None, "measured_bps": None,
                         "ratio": None if med is None else med / expected, "expected_rtt_s": expected,
                         "measured_rtt_s": med, "min_rtt_s": least, "ok": ok,
                         "note": "" if rtts else "no round trip completed"})
    order = {n.name: i for i, n in enumerate(spec.workers)}
    rows.sort(key=lambda r: (order[r["node"]], ("up", "down", "rtt").index(r["direction"])))
    for r in rows:
        say(describe(r, tolerance))
    return rows


def _rate_row(node: str, direction: str, configured: float, measured: float, tolerance: float, note: str) -> dict:
    ratio = measured / configured
    return {"node": node, "direction": direction, "configured_bps": configured, "measured_bps": measured,
            "ratio": ratio, "expected_rtt_s": None, "measured_rtt_s": None, "min_rtt_s": None,
            "ok": abs(1 - ratio) <= tolerance, "note": note}


def _measure_again(rt, scratch, flow: Flow, first: dict, window: float, warmup: float, tolerance: float) -> dict:
    """An off reading is taken once more, alone and over a window twice as long: the measuring
    process runs under the node's own CPU cap, where one stall of a few hundred ms costs a 1 s
    window several percent. The row keeps the second reading; its note keeps the first."""
    rate, = measure_flows(rt, scratch, [flow], window=2 * window, warmup=warmup)
    note = f"measured again; first read {100 * first['ratio']:.1f}%" + (f" ({first['note']})" if first["note"] else "")
    return _rate_row(first["node"], first["direction"], first["configured_bps"], rate.wire_bps, tolerance, note)


def _delay_dict(d) -> dict:
    # the ping endpoints take the run's per-link delays; per-sender paths (WAN, `links:`) too
    return {"up": d.up, "up_jitter": d.up_jitter, "down": d.down, "down_jitter": d.down_jitter,
            "paths": dict(d.paths)}


def describe(r: dict, tolerance: float = 0.10) -> str:
    flag = "ok" if r["ok"] else f"OFF by more than {tolerance:.0%}"
    if r["direction"] == "rtt":
        got = ("-" if r["measured_rtt_s"] is None
               else f"{1000 * r['measured_rtt_s']:.1f} ms (least {1000 * r['min_rtt_s']:.1f} ms)")
        return f"link check {r['node']} rtt: configured {1000 * r['expected_rtt_s']:.1f} ms, measured {got}  [{flag}]"
    return (f"link check {r['node']} {r['direction']:4s}: configured {units.format_rate(r['configured_bps'])}, "
            f"measured {r['measured_bps'] / 1e6:.2f} Mbit/s at the wire ({100 * r['ratio']:.1f}%)  [{flag}]")


def write(rows: list[dict], run_dir: Path) -> Path:
    path = Path(run_dir) / "link_check.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in COLUMNS})
    return path


def warnings_for(rows: list[dict], tolerance: float = 0.10) -> list[str]:
    return [f"LINK CHECK: {describe(r, tolerance)[len('link check '):]}" for r in rows if not r["ok"]]


def summary(rows: list[dict], tolerance: float, seconds: float) -> dict:
    return {"tolerance": tolerance, "seconds": round(seconds, 2), "rows": rows,
            "all_ok": all(r["ok"] for r in rows), "off": [f"{r['node']} {r['direction']}" for r in rows if not r["ok"]]}
