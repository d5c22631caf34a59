"""Does a link's delay follow a latency trace? Pings over edgebed's transport while the trace is
replayed, each round trip compared with the RTT the trace asked for when it was sent.

The path is the run's, from the replay to the wire, on the mechanism a kernel without netem
uses: the replay engine (node.trace_replay.TraceReplay, 100 ms ticks) calls the live
operations' `set_link(latency=)` (runtimes.live.LiveOps, its netlink calls made on nothing: they
would re-set the HTB rate, unchanged), which publishes the node's delays on a real control hub;
the node's transport (node.transport.DelaySpec, checked at most every 0.1 s) holds each message
for them. Node w0 pings the PS (a ROUTER echoing on loopback) back to back, at most every
`--interval`; w0's uplink and downlink each follow the trace's one-way delay (half its RTT).

Verdicts, fixed before the first run:
- steady pings (no change of the trace from 0.25 s before the ping to its end): median error
  (measured - asked) within 0-3 ms (the transport adds a little, never takes away), p95 |error|
  <= 10 ms;
- pickup: after each change of the trace, the first ping sent after it that is within 5 ms of
  the new RTT, <= 0.3 s after the change (one 0.1-s tick + one 0.1-s check + a ping) in >= 95%
  of changes (counted among the pings of the change's own segment, not a later one of the same
  value; a segment too short to hold a ping sent 0.3 s after its change is not judged);
- a recorded trace (changes at almost every tick): mean |measured - asked| over all pings <= 5 ms
  (the correlation is reported, not judged: a spike shorter than a pickup is missed).

    .venv/bin/python benchmarks/latency_trace.py [--trace NAME|FILE] [--seconds 60] [--repetitions 3]
        [--out benchmarks/results/latency-trace.json]

Without --trace it generates a synthetic one (a seeded random walk of the RTT between 20 and 400
ms, a new value every 0.5-3 s: steps far apart, so steady pings and pickups can be told apart).
A recorded trace (cicv5g-arterial-60: a new round trip every ~55 ms) changes at almost every
tick: few pings are steady there, and its MAE and correlation over all pings say how closely a
fast-moving delay is followed. Each repetition starts `seconds` further into the trace (looping).
Loopback only; run it alone. Results: BENCHMARKS.md, "Latency traces".
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.kernel.shaping import KernelCaps, plan_direction  # noqa: E402
from testbed.node import channel, channel_keys  # noqa: E402
from testbed.node.trace_replay import NodeReplay, TraceReplay  # noqa: E402
from testbed.node.transport import DelaySpec, node_endpoint, ps_endpoint  # noqa: E402
from testbed.node.wire import Message  # noqa: E402
from testbed.runtimes.control.hub import ControlHub  # noqa: E402
from testbed.runtimes.live import LiveOps  # noqa: E402
from testbed.scenario.latency_traces import latency_file, read_trace_delays  # noqa: E402
from testbed.scenario.links import Direction  # noqa: E402
from testbed.scenario.traces import TraceSchedule  # noqa: E402

ADDRESS = "127.0.0.61"  # a loopback address of its own (the PS port is fixed)
NO_NETEM = KernelCaps(htb=True, netem=False, tbf=True, ifb=True)
STEADY_MEDIAN_MS, STEADY_P95_MS, PICKUP_S, PICKUP_SHARE, MATCH_MS = (0.0, 3.0), 10.0, 0.3, 0.95, 5.0
RECORDED_MAE_MS = 5.0


class _NoLink:
    def tc(self, *args, **kw) -> None:  # the HTB rate set again, unchanged: nothing to measure
        pass


class BenchOps(LiveOps):
    """The live operations of one node, w0, whose delays go to its transport through `hub`."""

    def __init__(self, hub: ControlHub, delay: float):
        super().__init__()
        d = Direction(rate=100e6, latency=delay)
        link = SimpleNamespace(uplink=d, downlink=d, uplink_peers=[], downlink_peers=[])
        self.hub, self.fabric, self.caps = hub, None, NO_NETEM
        self.handles = {"w0": SimpleNamespace(node=SimpleNamespace(link=link), uplink=plan_direction(d, NO_NETEM),
                                              downlink=plan_direction(d, NO_NETEM))}

    def caps_of(self, node: str) -> KernelCaps:
        return self.caps

    @contextmanager
    def _link_iface(self, node: str, which: str):
        yield _NoLink(), 0


def synthetic_trace(path: Path, seconds: float, seed: int) -> Path:
    """`time,rtt_ms` rows: a random walk between 20 and 400 ms, a new value every 0.5-3 s."""
    rng, t, rtt, rows = random.Random(seed), 0.0, 80.0, ["time,rtt_ms"]
    while t < seconds:
        rows.append(f"{t:.1f},{rtt:.1f}")
        t += round(rng.uniform(0.5, 3.0), 1)
        rtt = min(400.0, max(20.0, rtt * rng.uniform(0.5, 1.8)))
    path.write_text("\n".join(rows) + "\n")
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _echo(ep, stop: threading.Event) -> None:
    while not stop.is_set():
        for sender, msg, _ in ep.recv(0.05):
            ep.send(Message("pong", {}, dict(msg.meta)), sender)


def _pings(w0, t0: float, seconds: float, interval: float) -> list[dict]:
    out, k = [], 0
    while (sent := time.time()) - t0 < seconds:
        w0.send(Message("ping", {}, {"k": k}))
        got = []
        while not got:
            got = w0.recv(1.0)
        out.append({"t": sent - t0, "rtt_s": time.time() - sent})
        k += 1
        time.sleep(max(0.0, interval - (time.time() - sent)))
    return out


def one_run(trace: Path, seconds: float, offset: float, interval: float, workdir: Path) -> dict:
    sched = TraceSchedule(read_trace_delays(trace, 0.1), 0.1, True, offset)
    up_port, down_port = _free_port(), _free_port()
    hub = ControlHub(None, "127.0.0.1", up_port, down_port, workdir)
    channel_keys.use(hub.keys.admit("w0", "worker"))
    ops = BenchOps(hub, sched.rate_at(0.0))
    import zmq

    ctx, stop = zmq.Context(), threading.Event()
    ps = ps_endpoint(ctx, ADDRESS, DelaySpec())
    start = sched.rate_at(0.0)
    w0 = node_endpoint(ctx, ADDRESS, "w0", DelaySpec(up=start, down=start, control=f"tcp://127.0.0.1:{down_port}",
                                                     node="w0"))
    echo = threading.Thread(target=_echo, args=(ps, stop), daemon=True)
    echo.start()
    node = NodeReplay("w0", {}, delays={"up": sched, "down": sched}, applied_delay={"up": start, "down": start})
    try:
        w0.delay.refresh()
        time.sleep(0.5)  # w0 subscribed to its delays; the first ping connects
        t0 = time.time()
        replay = TraceReplay([node], lambda *a: None, lambda *row: None, t0,
                             set_delay=lambda n, which, s: ops.set_link(n, which, {"latency": s}))
        replay.start()
        pings = _pings(w0, t0, seconds, interval)
        replay.stop()
        return {"offset_s": offset, "pings": pings, "replay": dict(replay.counts), "errors": replay.errors,
                "schedule": sched}
    finally:
        stop.set()
        echo.join(2)
        w0.close()
        ps.close()
        ctx.term()
        hub.close()
        channel.flush()
        channel_keys.use(None)


def judge(run: dict) -> dict:
    """Each ping's error against the RTT asked for, split into steady pings and pickups after changes."""
    sched: TraceSchedule = run["schedule"]
    asked = [sched.rate_at(p["t"]) + sched.rate_at(p["t"] + sched.rate_at(p["t"])) for p in run["pings"]]
    changes = [k * 0.1 for k in range(1, int(max(p["t"] for p in run["pings"]) / 0.1))
               if sched.rate_at(k * 0.1) != sched.rate_at((k - 1) * 0.1)]
    steady, pickups = [], []
    for p, a in zip(run["pings"], asked):
        if not any(p["t"] - 0.25 <= c <= p["t"] + p["rtt_s"] for c in changes):
            steady.append((p["rtt_s"] - a) * 1e3)
    unjudged = 0
    for c, end in zip(changes, changes[1:] + [float("inf")]):
        # pings of this change's own segment only (a later segment may hold the same value)
        mine = [p for p in run["pings"] if c <= p["t"] and p["t"] + p["rtt_s"] < end]
        after = [p for p in mine if abs(p["rtt_s"] - 2 * sched.rate_at(c)) * 1e3 <= MATCH_MS]
        if after:
            pickups.append(after[0]["t"] - c)
        elif not mine or mine[-1]["t"] - c < PICKUP_S:  # too short a segment to show a pickup
            unjudged += 1
    measured = [p["rtt_s"] for p in run["pings"]]
    return {"pings": len(run["pings"]), "changes": len(changes), "steady": len(steady),
            "asked_mean_ms": statistics.fmean(asked) * 1e3,
            "mae_ms": statistics.fmean(abs(m - a) for m, a in zip(measured, asked)) * 1e3,
            "pearson": pearson(measured, asked),
            "steady_median_ms": statistics.median(steady) if steady else None,
            "steady_p95_abs_ms": sorted(abs(e) for e in steady)[int(0.95 * (len(steady) - 1))] if steady else None,
            "pickups": len(pickups), "pickup_median_s": statistics.median(pickups) if pickups else None,
            "pickup_max_s": max(pickups) if pickups else None,
            "pickups_unjudged": unjudged,
            "pickup_within_share": (sum(p <= PICKUP_S for p in pickups) / (len(changes) - unjudged)
                                    if len(changes) > unjudged else None),
            "replay": run["replay"], "replay_errors": run["errors"]}


def pearson(a: list[float], b: list[float]) -> float | None:
    try:
        return statistics.correlation(a, b)
    except statistics.StatisticsError:  # a constant series
        return None


def verdict(r: dict, recorded: bool) -> str:
    if recorded:  # changes at almost every tick: all pings' error is the measure
        return "holds" if r["mae_ms"] <= RECORDED_MAE_MS else "does not hold"
    lo, hi = STEADY_MEDIAN_MS
    ok = (r["steady_median_ms"] is not None and lo <= r["steady_median_ms"] <= hi
          and r["steady_p95_abs_ms"] <= STEADY_P95_MS and (r["pickup_within_share"] or 0) >= PICKUP_SHARE)
    return "holds" if ok else "does not hold"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", help="a latency trace: a catalog name (cicv5g-arterial-60) or a file (ping -D "
                    "output, a time,rtt_ms CSV, a CICV5G table)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--interval", type=float, default=0.05, help="at most one ping per interval (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/latency-trace.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgebed-latency-") as tmp:
        trace = Path(args.trace).resolve() if args.trace and Path(args.trace).is_file() else \
            latency_file(args.trace, "up") if args.trace else \
            synthetic_trace(Path(tmp) / "rtt.csv", args.seconds * args.repetitions, args.seed)
        results = []
        for rep in range(args.repetitions):
            run = one_run(trace, args.seconds, rep * args.seconds, args.interval, Path(tmp))
            r = {"repetition": rep, "offset_s": run["offset_s"], **judge(run)}
            r["verdict"] = verdict(r, recorded=bool(args.trace))
            results.append(r)
            print(f"rep {rep}: {r['pings']} pings, {r['changes']} changes, {r['steady']} steady pings: median error "
                  f"{r['steady_median_ms']} ms, p95 |error| {r['steady_p95_abs_ms']} ms; "
                  f"pickups {r['pickups']}: median {r['pickup_median_s']} s, max {r['pickup_max_s']} s, "
                  f"{r['pickups_unjudged']} unjudged, within {PICKUP_S} s: "
                  f"{r['pickup_within_share']}; all pings: MAE {r['mae_ms']:.2f} ms on a mean RTT of "
                  f"{r['asked_mean_ms']:.1f} ms, r = {r['pearson']} -> {r['verdict']}")
    out = {"trace": str(args.trace) if args.trace else f"synthetic (seed {args.seed})", "seconds": args.seconds,
           "interval_s": args.interval, "repetitions": results,
           "verdict": "holds" if all(r["verdict"] == "holds" for r in results) else "does not hold"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"verdict: {out['verdict']} ({args.out})")


if __name__ == "__main__":
    main()
