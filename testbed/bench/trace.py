"""`edgebed bench trace`: does a link follow a recorded trace at 10 Hz?

For each of three recorded traces (an LTE driving one, an LTE short one, a 3G one: Norway HSDPA),
node w0's uplink replays the trace (runtimes.replay: the HTB class's rate changed in place every
100 ms) while a flow saturates it: a constant-bit-rate UDP flow sent at 1.3x the section's peak
(the queue never empties: what leaves is what the shaper lets through), then a bulk TCP flow.
Every 100 ms, at the same instant as the replay's tick, the link's wire counter is read (the
switch-side end of w0's veth: Ethernet frames, what HTB counts), so window k's wire rate is
compared with the rate the trace set for window k:

- mae_fraction: mean |wire - trace| over the windows, as a fraction of the trace's mean (target <= 5%)
- pearson: correlation of wire and trace over the windows (target >= 0.9)
- TCP: goodput (payload at the receiver) over the section, beside the trace's mean.

Each repetition replays another section of the trace (offset `rep * seconds`); the first second
of each (the flow starting) is left out. `via`: the trace given on the profile's uplink
(`trace:`), or by a timeline event (`{at: 0s, target: w0, action: link, direction: up, trace:}`,
its schedule built and handed to the replay as a run's LinkTraces does) on a plain link.
Compares wire rates (frames with their headers) with the trace's; goodput sits below by the
headers (Kollaps#47) and, for TCP, by its own dynamics. `dilation` k: the replay as a run dilated
by k makes it (scenario.dilation: every tick k x 100 ms, every rate / k), so each window is 100 ms
of the world and its MAE, a fraction, is the world's too.
"""

from __future__ import annotations

import bisect
import json
import os
import socket
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from testbed.bench.harness import Bench, save_result
from testbed.bench.links import udp_sink
from testbed.node.trace_replay import TraceReplay, schedules_to_wire
from testbed.run.flows import BENCH_PORT, tcp_sink, tcp_source
from testbed.runtimes.replay import replays_of
from testbed.scenario.traces import trace_file

# (label, the trace w0's uplink replays): a library path picks that direction's file
TRACES = (("att-lte-driving", "mahimahi/ATT-LTE-driving.down"),
          ("verizon-lte-short", "mahimahi/Verizon-LTE-short.down"),
          ("norway-hsdpa-bus", "norway-bus"))
VIAS = ("profile", "event")  # how the trace is given: a profile's `trace:`, a timeline link event's
RESOLUTION_S = 0.1
PAYLOAD = 1400  # datagrams that fit every runtime's MTU unfragmented (swarm's overlay: 1450)
TARGET_MAE, TARGET_PEARSON = 0.05, 0.9


def udp_cbr_source(addr: str, port: int, rate_bps: float, seconds: float) -> None:
    """Send PAYLOAD-byte datagrams at `rate_bps` (paced per millisecond) for `seconds`, then END."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    data = b"x" * PAYLOAD
    per_s = rate_bps / 8 / (PAYLOAD + 42)  # datagrams a second, counted as frames on the wire
    t0 = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - t0 < seconds:
        due = int((now - t0) * per_s)
        while sent < due:
            try:
                s.sendto(data, (addr, port))
            except OSError:  # the shaper's queue is full (ENOBUFS): that datagram is lost, as on a link
                pass
            sent += 1
        time.sleep(0.0005)
    for _ in range(30):
        try:
            s.sendto(b"END", (addr, port))
        except OSError:
            pass
        time.sleep(0.02)


def pearson(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / (va * vb) ** 0.5 if va > 0 and vb > 0 else float("nan")


def fidelity(trace: list[float], wire: list[float]) -> dict:
    """MAE as a fraction of the trace's mean, and the correlation, over paired windows."""
    mean = statistics.fmean(trace)
    mae = statistics.fmean(abs(w - t) for w, t in zip(wire, trace))
    return {"mae_fraction": mae / mean, "pearson": pearson(trace, wire), "trace_mean_bps": mean,
            "wire_mean_bps": statistics.fmean(wire)}


def wire_rates(reads: list[tuple[float, int]], t0: float, tick: float, n: int) -> list[float]:
    """Bit/s per window [t0 + (k-1) tick, t0 + k tick], k = 1..n, from the counter's reads (time,
    bytes) interpolated at the windows' edges: a read that comes late (a busy core) moves no bytes
    from one window into the next, and a pair of reads a millisecond apart makes no spike."""
    times = [t for t, _ in reads]

    def bytes_at(t: float) -> float:
        i = min(max(bisect.bisect_right(times, t), 1), len(reads) - 1)
        (ta, ba), (tb, bb) = reads[i - 1], reads[i]
        return ba + (bb - ba) * (t - ta) / (tb - ta) if tb > ta else float(bb)

    edges = [bytes_at(t0 + k * tick) for k in range(n + 1)]
    return [(edges[k] - edges[k - 1]) * 8 / tick for k in range(1, n + 1)]


def _read(rt) -> tuple[float, int]:
    """(when, bytes) of w0's uplink counter: the time halfway through the read (a netlink dump)."""
    before = time.time()
    b = rt.link_counter("w0", "up_bytes")
    return (before + time.time()) / 2, b


def _replay_windows(rt, replay: TraceReplay, seconds: float) -> tuple[list[float], list[float]]:
    """Replay for `seconds` and read w0's uplink wire counter at each tick: per window, (the rate
    set for it, the wire rate measured). Where the node replays its own trace (swarm: it keeps
    the clock), it is handed the schedule and the counter is read 3 ms after each of its ticks;
    else this loop is the clock, reading the counter and then making the tick's change."""
    tick = replay.tick
    sched = replay.nodes[0].schedules["up"]
    t0 = time.time() + 0.3
    remote = rt.replay_on_node("w0", schedules_to_wire({"up": sched}), t0)
    lag = 0.003 if remote else 0.0
    n = int(seconds / tick)
    time.sleep(max(0.0, t0 + lag - time.time()))
    reads = [_read(rt)]
    for k in range(1, n + 2):  # one read past the last window's end
        delay = t0 + k * tick + lag - time.time()
        if delay > 0:
            time.sleep(delay)
        reads.append(_read(rt))
        if not remote:
            replay.run_once(k * tick)
    return [sched.rate_at((k - 1) * tick) for k in range(1, n + 1)], wire_rates(reads, t0 + lag, tick, n)


def _await_traffic(rt, timeout: float = 30.0) -> None:
    """Until the flow's first packets cross w0's uplink (a container's job starts its python in
    seconds): the measured windows start with the flow."""
    start = rt.link_counter("w0", "up_bytes")
    deadline = time.monotonic() + timeout
    while rt.link_counter("w0", "up_bytes") - start < 3000 and time.monotonic() < deadline:
        time.sleep(0.02)


def _one_section(bench: Bench, rt, spec, replay: TraceReplay, flow: str, seconds: float) -> dict:
    """One flow over one section of the trace (the replay already at its offset; `seconds` the wall's)."""
    sched = replay.nodes[0].schedules["up"]
    warm = 10 * replay.tick  # ten ticks: a second of the world
    peak = max(sched.rate_at(k * sched.resolution) for k in range(int((seconds + warm) / sched.resolution) + 2))
    result = bench.result(f"{flow}.json")
    result.unlink(missing_ok=True)
    if flow == "udp":
        sink = rt.start("ps", udp_sink, {"port": BENCH_PORT, "seconds": seconds + 30, "result_path": str(result)})
        time.sleep(0.3)
        src = rt.start("w0", udp_cbr_source, {"addr": spec.ps.address, "port": BENCH_PORT, "rate_bps": 1.3 * peak,
                                              "seconds": seconds + warm + 3})
    else:
        sink = rt.start("ps", tcp_sink, {"port": BENCH_PORT + 1, "seconds": seconds, "flows": 1,
                                         "result_path": str(result), "warm": warm})
        time.sleep(0.3)
        src = rt.start("w0", tcp_source, {"addr": spec.ps.address, "port": BENCH_PORT + 1,
                                          "seconds": seconds + warm + 3, "flows": 1, "linger": 0.5})
    rt.set_rates("w0", {"up": sched.rate_at(0.0)})
    replay.nodes[0].applied = {"up": sched.rate_at(0.0)}
    _await_traffic(rt)
    trace, wire = _replay_windows(rt, replay, seconds + warm)
    src.join(seconds + 40)
    sink.join(seconds + 40)
    skip = int(warm / replay.tick)
    out = {"flow": flow, **fidelity(trace[skip:], wire[skip:]), "peak_bps": peak,
           "windows": {"trace_bps": trace[skip:], "wire_bps": [round(w) for w in wire[skip:]]}}
    try:
        got = json.loads(result.read_text())
        # UDP: what the sink got over the whole flow (it sends for seconds + warm + 3 s)
        good = (got["received"] * PAYLOAD * 8 / (seconds + warm + 3) if flow == "udp"
                else got["bytes"] * 8 / got["seconds"])
        out["goodput_bps"] = good
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        out["goodput_bps"] = None
    return out


def section_replay(rt, spec, via: str, ref: str, offset: float, dilation: float = 1.0) -> TraceReplay:
    """w0's uplink replaying the trace from `offset` s into it: given on the profile, or by an event
    at 0 s; on the wall of a run dilated by `dilation`."""
    if via == "profile":
        base = replays_of(spec, 0)[0]  # (the bench's own spec: undilated, dilated here)
        sched = replace(base.schedules["up"], offset=offset).dilated(dilation, 1 / dilation)
        return TraceReplay([replace(base, schedules={"up": sched}, applied={})], rt.set_rates, lambda *row: None,
                           t0=0.0)
    # imported here: run.events starts a native thread at import, and a node process imports this
    # module (its flows' functions) before it gives up its privileges, which needs one thread
    from testbed.run.events import LinkTraces

    replay = TraceReplay([], rt.set_rates, lambda *row: None, t0=0.0, tick=RESOLUTION_S * dilation)
    LinkTraces(replay, 0, dilation).follow("w0", {"direction": "up", "trace": str(trace_file(ref, "up")),
                                        "trace_resolution": RESOLUTION_S, "trace_offset": offset}, at=0.0)
    return replay


def world_rates(r: dict, k: float) -> dict:
    """A section's means, peak and goodput measured on the wall of a run dilated by k, in the
    world's bit/s (x k); MAE and r are ratios, the same in both."""
    for key in ("trace_mean_bps", "wire_mean_bps", "peak_bps", "goodput_bps"):
        if isinstance(r.get(key), (int, float)):
            r[key] = r[key] * k
    return r


def trace_benchmark(*, seconds: float = 30.0, repetitions: int = 3, runtime: str = "netns",
                    out_dir: Optional[Path] = None, say: Callable[[str], None] = print,
                    traces=TRACES, via: str = "profile", dilation: float = 1.0) -> dict:
    """Each trace, each repetition (another section), UDP then TCP; targets on UDP's windows.
    `seconds` and the sections' offsets are the world's (the wall's at dilation 1)."""
    if via not in VIAS:
        raise ValueError(f"via: {via} is not one of {', '.join(VIAS)}")
    results = []
    for label, ref in traces:
        link = {"trace": ref, "trace_resolution": "100ms"} if via == "profile" else {"rate": "10mbit"}
        bench = Bench({"uplink": link}, runtime)
        with bench as (rt, spec):
            for rep in range(repetitions):
                for flow in ("udp", "tcp"):
                    replay = section_replay(rt, spec, via, ref, rep * (seconds + 2.0), dilation)
                    r = world_rates(_one_section(bench, rt, spec, replay, flow, seconds * dilation), dilation)
                    r.update(trace=label, file=ref, repetition=rep, offset_s=rep * (seconds + 2.0), via=via,
                             dilation=dilation)
                    results.append(r)
                    say(f"{label:18s} rep {rep} {flow}: trace mean {r['trace_mean_bps'] / 1e6:6.2f} Mbit/s  wire "
                        f"{r['wire_mean_bps'] / 1e6:6.2f}  MAE {100 * r['mae_fraction']:5.1f}%  r {r['pearson']:.3f}  "
                        f"goodput {(r['goodput_bps'] or 0) / 1e6:6.2f}")
        if bench.problems:
            say(f"teardown problems: {bench.problems}")
    name = f"trace-{runtime}" + ("" if via == "profile" else f"-{via}") + (f"-k{dilation:g}" if dilation != 1 else "")
    out = save_result({**_summary(results, seconds, repetitions, runtime), "via": via}, out_dir, f"{name}.json", say)
    if out_dir is not None:
        say(f"wrote {draw_trace_figure(out, Path(out_dir).parent / 'plots' / f'bench-{name}.png')}")
    return out


def draw_trace_figure(result: dict, path: Path) -> Path:
    """Per trace, its first section: the rate the trace set per 100 ms window, the UDP flow's wire
    rate and the TCP flow's, over time."""
    from matplotlib.figure import Figure

    labels = list(dict.fromkeys(r["trace"] for r in result["results"]))
    fig = Figure(figsize=(11, 2.8 * len(labels)), layout="constrained")
    axes = fig.subplots(len(labels), 1, squeeze=False)[:, 0]
    for ax, label in zip(axes, labels):
        for flow, color in (("udp", "tab:blue"), ("tcp", "tab:orange")):
            r = next((x for x in result["results"] if x["trace"] == label and x["flow"] == flow), None)
            if r is None:
                continue
            w = r["windows"]
            t = [0.1 * k for k in range(len(w["trace_bps"]))]
            if flow == "udp":
                ax.step(t, [v / 1e6 for v in w["trace_bps"]], where="post", color="0.2", lw=1.0, label="trace")
            ax.plot(t, [v / 1e6 for v in w["wire_bps"]], color=color, lw=0.9, alpha=0.8,
                    label=f"{flow.upper()} wire (MAE {100 * r['mae_fraction']:.1f}%, r {r['pearson']:.3f})")
        ax.set_title(f"{label}", fontsize=9, loc="left")
        ax.set_ylabel("Mbit/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("seconds into the section (100 ms windows)")
    fig.suptitle(f"edgebed bench trace ({result['runtime']}, the trace on {result.get('via', 'profile')}): "
                 "the link's wire rate against the replayed trace")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def _summary(results: list[dict], seconds: float, repetitions: int, runtime: str) -> dict:
    per_trace = {}
    for label in dict.fromkeys(r["trace"] for r in results):
        rows = {f: [r for r in results if r["trace"] == label and r["flow"] == f] for f in ("udp", "tcp")}
        per_trace[label] = {
            f"{f}_{k}": [round(r[k], 4) for r in rows[f]] for f in ("udp", "tcp") for k in ("mae_fraction", "pearson")}
        per_trace[label]["tcp_goodput_over_trace_mean"] = [
            round((r["goodput_bps"] or 0) / r["trace_mean_bps"], 4) for r in rows["tcp"]]
    udp = [r for r in results if r["flow"] == "udp"]
    ok = bool(udp) and all(r["mae_fraction"] <= TARGET_MAE and r["pearson"] >= TARGET_PEARSON for r in udp)
    return {"benchmark": "trace", "runtime": runtime, "seconds": seconds, "repetitions": repetitions,
            "resolution_s": 0.1, "targets": {"mae_fraction": TARGET_MAE, "pearson": TARGET_PEARSON},
            "ok": ok, "per_trace": per_trace, "results": results, "kernel": os.uname().release,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "note": "wire = w0's uplink frames (Ethernet headers included, as HTB counts them) per 100 ms window, "
                    "read at each replay tick; UDP sent at 1.3x the section's peak; targets apply to UDP"}
