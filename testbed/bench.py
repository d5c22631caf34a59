"""Fidelity benchmarks: does a shaped link carry its rate, does a quota give its share?

Both build the same objects a run does (namespaces, veth, HTB, cgroups) through the
netns runtime, measure, tear down, and write a JSON result.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Callable

from . import units
from .cluster import build_cluster
from .scenario import parse_scenario
from .state import RunState

BENCH_PORT = 5201


def _sink(port: int, seconds: float, flows: int, result_path: str) -> None:
    """TCP receiver: count goodput bytes over the measuring window."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(flows)
    conns = [srv.accept()[0] for _ in range(flows)]
    for c in conns:
        c.setblocking(False)
    import selectors

    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    total = 0
    warm = 1.0  # skip slow start and the bucket's initial burst
    start = time.monotonic()
    t_first = None
    open_conns = len(conns)
    while open_conns and time.monotonic() - start < seconds + warm + 2:
        for key, _ in sel.select(timeout=0.2):
            try:
                data = key.fileobj.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                open_conns -= 1
                continue
            now = time.monotonic()
            if now - start >= warm:
                if t_first is None:
                    t_first = now
                if now - t_first <= seconds:
                    total += len(data)
    elapsed = min(seconds, time.monotonic() - (t_first or start))
    Path(result_path).write_text(json.dumps({"bytes": total, "seconds": elapsed}))


def _source(addr: str, port: int, seconds: float, flows: int) -> None:
    import threading

    buf = b"\0" * (1 << 16)
    deadline = time.monotonic() + seconds + 1.5

    def one() -> None:
        for _ in range(100):
            try:
                s = socket.create_connection((addr, port), timeout=2)
                break
            except OSError:
                time.sleep(0.05)
        else:
            return
        while time.monotonic() < deadline:
            s.sendall(buf)
        s.close()

    ts = [threading.Thread(target=one) for _ in range(flows)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def _cluster(profile: dict, run_id: str):
    from .runtimes.netns import NetnsRuntime

    sc = parse_scenario({"name": "bench", "profiles": {"shaped": profile}, "workers": [{"count": 1, "profile": "shaped"}]})
    state = RunState(run_id=run_id, runner_pid=os.getpid(), run_dir="", scenario="bench")
    state.save()
    rt = NetnsRuntime(state)
    rt.set_preload([])
    spec = build_cluster(sc, run_id)
    return rt, spec


def link_benchmark(rate: str, *, seconds: float = 5.0, flows: int = 1, out_dir: Path | None = None,
                   say: Callable[[str], None] = print, tolerance: float = 0.05) -> dict:
    """Shape w0's access link to `rate` both ways, saturate each direction with TCP between w0 and ps."""
    configured = units.parse_rate(rate)
    run_id = secrets.token_hex(3)
    rt, spec = _cluster({"bandwidth": rate}, run_id)
    results = []
    try:
        rt.create(spec)
        w0, ps = spec.node("w0"), spec.node("ps")
        for direction, sender, receiver in (("up", w0, ps), ("down", ps, w0)):
            res_file = f"/tmp/edgebed-bench-{run_id}-{direction}.json"
            before = rt.counters()["w0"]
            sink = rt.start(receiver.name, _sink, {"port": BENCH_PORT, "seconds": seconds, "flows": flows,
                                                   "result_path": res_file})
            time.sleep(0.3)
            t_start = time.monotonic()
            src = rt.start(sender.name, _source, {"addr": receiver.address, "port": BENCH_PORT,
                                                  "seconds": seconds, "flows": flows})
            src.join(seconds + 30)
            sink.join(seconds + 30)
            wall = time.monotonic() - t_start
            after = rt.counters()["w0"]
            good = json.loads(Path(res_file).read_text())
            os.unlink(res_file)
            goodput = good["bytes"] * 8 / good["seconds"]
            wire = (after[f"{direction}_bytes"] - before[f"{direction}_bytes"]) * 8 / wall
            results.append({"direction": direction, "goodput_bps": goodput, "wire_bps_avg": wire,
                            "goodput_ratio": goodput / configured})
            say(f"{direction:4s} configured {units.format_rate(configured):>8s}  goodput {goodput / 1e6:8.3f} Mbit/s "
                f"({100 * goodput / configured:5.1f}%)  wire incl. headers and warm-up {wire / 1e6:8.3f} Mbit/s")
    finally:
        problems = rt.teardown()
    ok = all(abs(1 - r["goodput_ratio"]) <= tolerance for r in results) and not problems
    out = {"benchmark": "link", "configured_bps": configured, "flows": flows, "seconds": seconds,
           "results": results, "ok": ok, "tolerance": tolerance, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "shaper": "htb (egress of each veth end)",
           "note": "goodput = TCP payload bytes received per second after a 1 s warm-up; "
                   "TCP/IP + Ethernet headers are ~4.4% of a 1514-byte frame, so goodput "
                   "sits below the configured wire rate by about that much"}
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / f"link-{units.format_rate(configured)}-{flows}flow.json"
        path.write_text(json.dumps(out, indent=1))
        say(f"wrote {path}")
    return out


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        x += 1


def cpu_benchmark(cpus: float, *, seconds: float = 5.0, out_dir: Path | None = None,
                  say: Callable[[str], None] = print, tolerance: float = 0.03) -> dict:
    """Run one busy loop per core in a node capped at `cpus`; compare the CPU it got to the quota."""
    run_id = secrets.token_hex(3)
    rt, spec = _cluster({"cpus": cpus}, run_id)
    try:
        rt.create(spec)
        h = rt.handles["w0"]
        n_loops = max(1, min(os.cpu_count() or 1, int(cpus) + 1))
        before = h.cgroup.cpu_seconds()
        t = time.monotonic()
        procs = [rt.start("w0", _busy, {"seconds": seconds}) for _ in range(n_loops)]
        for p in procs:
            p.join(seconds + 30)
        wall = time.monotonic() - t
        used = h.cgroup.cpu_seconds() - before
        # Process start-up (fork from the server, joining the cgroup) is inside `wall`, so
        # measure against the loop's own duration, which is the window the quota acted on.
        achieved = used / seconds
        say(f"quota {cpus:.2f} cores  achieved {achieved:.3f} cores  ({n_loops} busy loop(s), {seconds:.0f} s, "
            f"wall {wall:.2f} s)")
    finally:
        problems = rt.teardown()
    ok = abs(achieved - cpus) <= tolerance and not problems
    out = {"benchmark": "cpu", "quota_cores": cpus, "achieved_cores": achieved, "seconds": seconds,
           "busy_loops": n_loops, "ok": ok, "tolerance": tolerance, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / f"cpu-{cpus:g}.json"
        path.write_text(json.dumps(out, indent=1))
        say(f"wrote {path}")
    return out
