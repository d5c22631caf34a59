"""Benchmarks of what training sees: one update's transfer time against the ideal, edgebed's
overhead on a worker's compute step, and `edgebed bench all` (the suite, with a --quick CI form
that fails when a fidelity number leaves a generous bound).

Like bench.py, each builds the objects a run does through a runtime, measures, tears down and
writes a JSON result under benchmarks/results/ (benchmarks/report.py turns them into tables and
plots).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from testbed.bench.fidelity import _Bench, _save, run_for_records
from testbed.node import mailbox
from testbed.scenario import units

# --------------------------------------------------------------------------- one update's transfer


def _update_server(address: str, count: int) -> None:
    """The PS side: take each update whole, answer a small ack (what a PS's model reply starts with)."""
    import zmq

    from testbed.node import transport
    from testbed.node.wire import Message

    ctx = zmq.Context()
    ep = transport.ps_endpoint(ctx, address, transport.DelaySpec())
    answered = 0
    deadline = time.monotonic() + 600
    while answered < count and time.monotonic() < deadline:
        for sender, _msg, _ in ep.recv(0.1):
            ep.send(Message("ack"), sender)
            answered += 1
    time.sleep(0.2)
    ep.close()
    ctx.term()


def _update_client(ps_address: str, params: int, repeats: int, result_path: str) -> None:
    """The worker side: a ping (connection set-up), then `repeats` dense updates of `params` float32s,
    each timed from send to the PS's ack."""
    import torch
    import zmq

    from testbed.node import transport
    from testbed.node.wire import Message

    ctx = zmq.Context()
    ep = transport.node_endpoint(ctx, ps_address, "w0", transport.DelaySpec())

    def round_trip(tensors: dict) -> tuple[float, int]:
        t = time.monotonic()
        sent = ep.send(Message("push", tensors))
        while not ep.recv(0.5):
            pass
        return time.monotonic() - t, sent

    round_trip({})  # connect
    rtts = [round_trip({})[0] for _ in range(5)]
    update = {"g": torch.zeros(params, dtype=torch.float32)}
    times, wire_bytes = [], 0
    for _ in range(repeats):
        time.sleep(0.5)  # let the shaper's bucket refill, as a worker's compute step would
        dt, wire_bytes = round_trip(update)
        times.append(dt)
    mailbox.write_text(result_path, json.dumps({"rtt": statistics.median(rtts), "times": times,
                                             "message_bytes": wire_bytes}))
    ep.close()
    ctx.term()


# TCP over Ethernet at MTU 1500 carries 1448 payload bytes (timestamps on) per 1514-byte frame
# counted by the shaper: the best a shaped link can give a message is rate * 1448/1514.
FRAME_EFFICIENCY = 1448 / 1514


def update_benchmark(params: int, rate: str, *, repeats: int = 3, out_dir: Path | None = None,
                     say: Callable[[str], None] = print, tolerance: float = 0.10, runtime: str = "netns") -> dict:
    """Time for the PS to receive one full update of `params` parameters over w0's `rate` uplink,
    against the ideal 32 * params / rate + one round trip."""
    configured = units.parse_rate(rate)
    bench = _Bench({"bandwidth": rate}, runtime)
    with bench as (rt, spec):
        res_file = bench.result("update.json")
        srv = rt.start("ps", _update_server, {"address": spec.ps.address, "count": repeats + 6})
        cli = rt.start("w0", _update_client, {"ps_address": spec.ps.address, "params": params, "repeats": repeats,
                                              "result_path": str(res_file)})
        cli.join(120 + repeats * (64 * params / configured + 5))
        srv.join(10)
        res = json.loads(res_file.read_text())
    measured = statistics.median(res["times"])
    ideal = 32 * params / configured + res["rtt"]
    framed = 8 * res["message_bytes"] / (configured * FRAME_EFFICIENCY) + res["rtt"]
    ratio = measured / ideal
    ok = abs(ratio - 1) <= tolerance and not bench.problems
    say(f"{params / 1e6:g}M parameters ({res['message_bytes'] / 1e6:.2f} MB message) over {units.format_rate(configured)}: "
        f"{measured:.3f} s; ideal 32P/B + RTT {ideal:.3f} s ({100 * (ratio - 1):+.1f}%), with TCP/IP/Ethernet "
        f"framing {framed:.3f} s ({100 * (measured / framed - 1):+.1f}%)")
    out = {"benchmark": "update", "runtime": runtime, "params": params, "configured_bps": configured,
           "repeats": repeats, "times_s": res["times"], "median_s": measured, "rtt_s": res["rtt"],
           "message_bytes": res["message_bytes"], "ideal_s": ideal, "ratio": ratio, "framed_ideal_s": framed,
           "ratio_to_framed": measured / framed, "ok": ok, "tolerance": tolerance, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "ideal = 32 * params / rate + RTT (payload only); framed = the message's bytes at "
                   f"{FRAME_EFFICIENCY:.4f} of the rate (1448 TCP payload bytes per 1514-byte frame) + RTT"}
    return _save(out, out_dir, f"update-{runtime}-{params}-{units.format_rate(configured)}.json", say)


# --------------------------------------------------------------------------- overhead on a compute step


def _bare_loop(model: str, batch_size: int, steps: int, threads: int, seed: int) -> list[float]:
    """The worker's compute step without edgebed: sample a batch, forward, loss, backward."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from testbed.data.datasets import load_dataset
    from testbed.data.models import build_model

    torch.set_num_threads(threads)  # as the worker role sets them
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    ds = load_dataset("mnist5k", seed=seed)
    x = torch.from_numpy(np.ascontiguousarray(ds.train_x))
    y = torch.from_numpy(np.ascontiguousarray(ds.train_y))
    torch.manual_seed(seed)
    net = build_model(model, tuple(ds.input_shape), ds.num_classes)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)  # weights move as in training (their values matter to speed)
    rng = np.random.default_rng(seed)
    times = []
    for _ in range(steps):
        t = time.time()
        idx = torch.from_numpy(rng.integers(0, len(y), batch_size))
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(x[idx]), y[idx]).backward()
        times.append(time.time() - t)
        opt.step()  # untimed: the PS applies updates in edgebed
    return times


def _bare_job(model: str, batch_size: int, steps: int, threads: int, seed: int, result_path: str) -> None:
    """_bare_loop in a node, its times put in a mailbox slot."""
    mailbox.write_text(result_path, json.dumps({"times": _bare_loop(model, batch_size, steps, threads, seed)}))


def _bare_process(model: str, batch_size: int, steps: int, threads: int, seed: int, path: str) -> None:
    """_bare_loop in a process of this machine, its times written to `path`."""
    Path(path).write_text(json.dumps({"times": _bare_loop(model, batch_size, steps, threads, seed)}))


def _edgebed_compute_steps(cpus: float, model: str, batch_size: int, steps: int, stress: float = 0.0):
    """One ASGD worker at `cpus` (and `stress` cores of background load in its cgroup) for `steps`
    steps: (scenario, summary, compute_seconds of the steps after the first 10)."""
    from testbed.plan import parse_scenario

    edge = {"cpus": cpus} | ({"stress": {"cpu": stress}} if stress else {})
    sc = parse_scenario({"name": "overhead", "runtime": "netns", "seed": 1,
                         "workload": {"model": model, "dataset": "mnist5k", "batch_size": batch_size,
                                      "eval_interval": 100000},
                         "stop": {"steps": steps, "seconds": 900}, "algorithm": {"name": "asgd"},
                         "profiles": {"edge": edge, "server": {"cpus": 0.5}},
                         "ps": {"profile": "server"}, "evaluator": {"profile": "server"},
                         "workers": [{"count": 1, "profile": "edge"}]})
    summary, records = run_for_records(sc, "bench-overhead", "steps.csv")
    return sc, summary, records["steps.csv"].sort_values("step").compute_seconds.iloc[10:].tolist()


def stress_benchmark(*, cpus: float = 1.0, stress: float = 0.5, model: str = "adacomp_cnn", batch_size: int = 32,
                     steps: int = 50, out_dir: Path | None = None, say: Callable[[str], None] = print,
                     tolerance: float = 0.15) -> dict:
    """A profile's background stress: the worker's compute step with `stress` cores of busy-looping in
    its own cgroup against the same worker without. Bound: were training alone to fill the quota,
    it would keep cpus - stress of it and a step would take cpus / (cpus - stress) as long; a
    worker that idles while it waits for the PS leaves quota the stress uses, so the slowdown sits
    between 1 and that bound. ok: stress slows the step (by over 5%), and by no more than the bound."""
    _, s0, calm = _edgebed_compute_steps(cpus, model, batch_size, steps)
    _, s1, loaded = _edgebed_compute_steps(cpus, model, batch_size, steps, stress)
    # the mean, not the median: a quota throttles whole periods, which a median of 20-ms steps skips over
    m0, m1 = statistics.fmean(calm), statistics.fmean(loaded)
    expected = cpus / (cpus - stress)
    slowdown = m1 / m0
    ok = s0["status"] == s1["status"] == "completed" and 1.05 < slowdown <= expected * (1 + tolerance)
    say(f"{model}, {cpus:g} CPU: mean compute step {1000 * m0:.1f} ms without stress, {1000 * m1:.1f} ms with "
        f"{stress:g} cores of stress: {slowdown:.2f}x (bound {cpus:g}/({cpus:g}-{stress:g}) = {expected:.2f}x)")
    out = {"benchmark": "stress", "model": model, "cpus": cpus, "stress": stress, "steps": steps,
           "calm_mean_s": m0, "stressed_mean_s": m1, "slowdown": slowdown, "expected_slowdown": expected,
           "ok": ok, "tolerance": tolerance, "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return _save(out, out_dir, f"stress-{model}-{cpus:g}cpu-{stress:g}.json", say)


def overhead_benchmark(*, cpus: float = 1.0, model: str = "adacomp_cnn", batch_size: int = 32, steps: int = 60,
                       repeats: int = 3, out_dir: Path | None = None, say: Callable[[str], None] = print,
                       tolerance: float = 0.05) -> dict:
    """A worker's compute step in an edgebed run (ASGD, one worker at `cpus`, steps.csv's
    compute_seconds) against the same step in a bare PyTorch loop in a node with the same CPU quota
    and threads. The two alternate `repeats` times (single runs differ by up to 15% here); the first
    10 steps of each are warm-up; the overhead compares the medians of the runs' medians."""
    from testbed.plan.cluster import build_cluster

    runs_edgebed, runs_bare, statuses = [], [], []
    threads = 1
    for _ in range(repeats):
        sc, summary, in_edgebed = _edgebed_compute_steps(cpus, model, batch_size, steps)
        statuses.append(summary["status"])
        runs_edgebed.append(statistics.median(in_edgebed))
        threads = sc.workload.threads or build_cluster(sc, "x").node("w0").threads
        bench = _Bench({"cpus": cpus}, "netns")
        with bench as (rt, spec):
            res_file = bench.result("bare.json")
            p = rt.start("w0", _bare_job, {"model": model, "batch_size": batch_size, "steps": steps,
                                            "threads": threads, "seed": 1, "result_path": str(res_file)})
            p.join(600)
            runs_bare.append(statistics.median(json.loads(res_file.read_text())["times"][10:]))
        statuses += ["problems"] if bench.problems else []
    m_edgebed, m_bare = statistics.median(runs_edgebed), statistics.median(runs_bare)
    overhead = m_edgebed / m_bare - 1
    ok = all(s == "completed" for s in statuses) and overhead <= tolerance
    say(f"{model}, batch {batch_size}, {cpus:g} CPU ({threads} thread(s)), {repeats} runs each: compute step in "
        f"edgebed {1000 * m_edgebed:.1f} ms (runs {', '.join(f'{1000 * v:.1f}' for v in runs_edgebed)}), bare "
        f"PyTorch loop {1000 * m_bare:.1f} ms (runs {', '.join(f'{1000 * v:.1f}' for v in runs_bare)}): "
        f"{100 * overhead:+.1f}%")
    out = {"benchmark": "overhead", "runtime": "netns", "model": model, "batch_size": batch_size, "cpus": cpus,
           "threads": threads, "steps": steps, "repeats": repeats, "edgebed_median_s": m_edgebed,
           "bare_median_s": m_bare, "edgebed_runs_s": runs_edgebed, "bare_runs_s": runs_bare,
           "overhead": overhead, "ok": ok, "tolerance": tolerance,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "compute step = batch sampling + forward + loss + backward (steps.csv compute_seconds); "
                   "the bare loop runs in a node with the same CPU quota and torch threads, and takes an "
                   "untimed SGD step after each (edgebed's weights change every step too)"}
    return _save(out, out_dir, f"overhead-{model}-{cpus:g}cpu.json", say)


# --------------------------------------------------------------------------- wire bytes per strategy

# Each strategy as the papers' experiments run it, made short: parameters that would leave a
# 20-s run without any exchange (ADSP's 60-s check period) are scaled down.
WIRE_PARAMS: dict[str, dict] = {
    "adacomp": {"c": 0.01}, "comp_asgd": {"c": 0.01}, "scadles": {"cr": 0.1, "delta": 0.3},
    "selsync": {"delta": 0.3}, "adsp": {"check_period": 4.0, "trial_seconds": 8.0}, "local_sgd": {"period": 4},
    "dlion": {"total_batch": 128},
}


def wire_benchmark(algorithm: str, *, workers: int = 4, seconds: float = 20.0, rate: str = "100mbit",
                   out_dir: Path | None = None, say: Callable[[str], None] = print) -> dict:
    """What a strategy puts on the wire against the payload its records count: a short run (the
    AdaComp CNN, 211,690 parameters, on mnist5k) with `workers` workers on `rate` links; payload =
    the workers' steps.csv bytes_sent / bytes_received (edgebed's messages: header + tensors),
    wire = their access links' counters (traffic.csv: IP packets + Ethernet headers, TCP ACKs,
    connection set-up, and what a run sends outside steps: join, first pull, stop)."""
    from testbed.plan import parse_scenario

    sc = parse_scenario({"name": f"wire-{algorithm}", "runtime": "netns", "seed": 1,
                         "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05,
                                      "eval_interval": 100000},
                         "stop": {"seconds": seconds},
                         "algorithm": {"name": algorithm, "params": WIRE_PARAMS.get(algorithm, {})},
                         "profiles": {"server": {"cpus": 0.4, "bandwidth": "1gbit"},
                                      "device": {"cpus": 0.3, "bandwidth": rate}},
                         "ps": {"profile": "server"}, "evaluator": {"profile": "server"},
                         "workers": [{"count": workers, "profile": "device"}]})
    summary, records = run_for_records(sc, f"bench-wire-{algorithm}", "steps.csv", "traffic.csv")
    steps, traffic = records["steps.csv"], records["traffic.csv"]
    workers_ = [name for name, _ in sc.worker_names()]
    worker_rows = traffic[(traffic.link == "access") & traffic.node.isin(workers_)]
    last = worker_rows.sort_values("time").groupby(["node", "direction"]).bytes.last()
    wire_up, wire_down = float(last.xs("up", level="direction").sum()), float(last.xs("down", level="direction").sum())
    payload_up, payload_down = float(steps.bytes_sent.sum()), float(steps.bytes_received.sum())
    n_steps = int(len(steps))
    up_ratio = wire_up / payload_up if payload_up else None
    down_ratio = wire_down / payload_down if payload_down else None
    # Sanity, not a goal: the counters see at least what the records say was sent. There is no
    # upper bound: a sparse push's link also carries the TCP ACKs of the dense pull coming down,
    # which can outweigh the push itself.
    ok = summary["status"] == "completed" and n_steps > 0 and all(
        r is not None and r >= 0.99 for r in (up_ratio, down_ratio))
    per_step = max(n_steps, 1)
    say(f"{algorithm}: {n_steps} steps; up: payload {payload_up / 1e6:.2f} MB, wire {wire_up / 1e6:.2f} MB "
        f"({up_ratio if up_ratio is None else f'{up_ratio:.3f}'}x); down: payload {payload_down / 1e6:.2f} MB, "
        f"wire {wire_down / 1e6:.2f} MB ({down_ratio if down_ratio is None else f'{down_ratio:.3f}'}x); a step sends "
        f"{payload_up / per_step / 1e3:.1f} KB of payload and {(wire_up - payload_up) / per_step / 1e3:.1f} KB more "
        f"on the wire")
    out = {"benchmark": "wire", "runtime": "netns", "algorithm": algorithm, "params": WIRE_PARAMS.get(algorithm, {}),
           "workers": workers, "rate": rate, "seconds": seconds, "steps": n_steps,
           "payload_up_bytes": payload_up, "wire_up_bytes": wire_up, "wire_over_payload_up": up_ratio,
           "payload_down_bytes": payload_down, "wire_down_bytes": wire_down, "wire_over_payload_down": down_ratio,
           "payload_up_per_step_bytes": payload_up / per_step,
           "wire_overhead_up_per_step_bytes": (wire_up - payload_up) / per_step,
           "wire_overhead_down_per_step_bytes": (wire_down - payload_down) / per_step,
           "status": summary["status"], "ok": ok,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "payload = workers' steps.csv bytes (edgebed messages); wire = their access links' counters "
                   "over the whole run (IP + Ethernet headers, ACKs, join/first pull/stop)"}
    return _save(out, out_dir, f"wire-{algorithm}.json", say)


# --------------------------------------------------------------------------- the suite


def _docker_available() -> bool:
    try:
        from testbed.runtimes.docker import docker_client

        return docker_client(timeout=3) is not None
    except Exception:
        return False


def suite(quick: bool, *, docker: bool | None = None) -> list[tuple[str, Callable[..., dict], dict]]:
    """(label, benchmark, kwargs) in the order they run. --quick: a few minutes, generous bounds
    (catching a broken shaper or quota, not noise); full: the tables of BENCHMARKS.md."""
    from testbed.bench import fidelity as b

    docker = _docker_available() if docker is None else docker
    if quick:
        items = [
            ("link 10mbit", b.link_benchmark, {"rate": "10mbit", "seconds": 3.0, "tolerance": 0.08}),
            ("link 100mbit", b.link_benchmark, {"rate": "100mbit", "seconds": 3.0, "tolerance": 0.08}),
            ("cpu 0.25", b.cpu_benchmark, {"cpus": 0.25, "seconds": 3.0, "tolerance": 0.05}),
            ("loss 10%", b.loss_benchmark, {"loss": "10%", "packets": 5000}),
            ("delay 20ms", b.delay_benchmark, {"latency": "20ms", "count": 20}),
            ("update 1M params, 100mbit", update_benchmark, {"params": 1_000_000, "rate": "100mbit", "repeats": 2,
                                                             "tolerance": 0.15}),
            ("startup 4 workers", b.startup_benchmark, {"workers": 4}),
        ]
        if docker:
            items += [("link 10mbit docker", b.link_benchmark, {"rate": "10mbit", "seconds": 3.0, "tolerance": 0.08,
                                                                "runtime": "docker"}),
                      ("cpu 0.5 docker", b.cpu_benchmark, {"cpus": 0.5, "seconds": 3.0, "tolerance": 0.05,
                                                           "runtime": "docker"})]
        return items
    items = []
    for rate in ("1mbit", "10mbit", "100mbit", "1gbit"):
        items.append((f"link {rate}", b.link_benchmark, {"rate": rate, "seconds": 20.0 if rate == "1mbit" else 8.0}))
    for rate in ("10mbit", "100mbit"):
        items.append((f"link {rate} 4 flows", b.link_benchmark, {"rate": rate, "seconds": 8.0, "flows": 4}))
    for c in (0.1, 0.25, 0.5, 1.0, 1.5, 2.0):
        items.append((f"cpu {c:g}", b.cpu_benchmark, {"cpus": c, "seconds": 8.0}))
    for loss in ("1%", "10%"):
        items.append((f"loss {loss}", b.loss_benchmark, {"loss": loss}))
    for lat, jit, n in (("0ms", "0ms", 200), ("20ms", "0ms", 200), ("20ms", "5ms", 200), ("50ms", "0ms", 100)):
        items.append((f"delay {lat} jitter {jit}", b.delay_benchmark, {"latency": lat, "jitter": jit, "count": n}))
    for rate, sizes in (("10mbit", (200_000, 1_000_000, 5_000_000)),
                        ("100mbit", (200_000, 1_000_000, 5_000_000, 25_000_000))):
        for p in sizes:
            items.append((f"update {p / 1e6:g}M params, {rate}", update_benchmark, {"params": p, "rate": rate}))
    items.append(("overhead adacomp_cnn 1 CPU", overhead_benchmark, {"cpus": 1.0}))
    items.append(("overhead adacomp_cnn 0.5 CPU", overhead_benchmark, {"cpus": 0.5}))
    items.append(("stress 0.5 of 1 CPU", stress_benchmark, {"cpus": 1.0, "stress": 0.5}))
    items.append(("stress 0.25 of 0.5 CPU", stress_benchmark, {"cpus": 0.5, "stress": 0.25}))
    for c in (0.25, 0.5, 1.0):
        items.append((f"cpu {c:g}, another node busy", b.cpu_benchmark, {"cpus": c, "seconds": 8.0,
                                                                        "others_busy": True}))
    for n in (8, 32):
        items.append((f"mininet side by side, {n} hosts", mininet_benchmark, {"hosts": n, "rate": "10mbit"}))
    for n in (4, 16):  # needs .venv-flower (make flower-venv); without it, an error row, the rest still run
        items.append((f"flower side by side, {n} clients", flower_benchmark, {"clients": n}))
    for n in (1, 8, 16, 32, 64, 128, 256):  # 256: the most tried here (9.6 GiB); the goal is 64
        items.append((f"startup {n} workers", b.startup_benchmark, {"workers": n}))
    from testbed.strategies import strategies

    for name in sorted(strategies()):
        items.append((f"wire {name}", wire_benchmark, {"algorithm": name}))
    items.append(("topology 1gbit/100mbit", b.topology_benchmark, {"lan": "1gbit", "wan": "100mbit"}))
    if docker:
        for rate in ("10mbit", "100mbit"):
            items.append((f"link {rate} docker", b.link_benchmark, {"rate": rate, "seconds": 8.0, "runtime": "docker"}))
        for c in (0.25, 0.5, 1.0):
            items.append((f"cpu {c:g} docker", b.cpu_benchmark, {"cpus": c, "seconds": 8.0, "runtime": "docker"}))
        for n in (1, 8, 16, 32):
            items.append((f"startup {n} workers docker", b.startup_benchmark, {"workers": n, "runtime": "docker"}))
    return items


def run_suite(quick: bool, out_dir: Path, say: Callable[[str], None] = print) -> dict:
    """Run the suite; every benchmark's verdict in one summary (and benchmarks/results/suite-*.json)."""
    results = []
    t0 = time.time()
    for label, fn, kwargs in suite(quick):
        say(f"== {label}")
        t = time.time()
        try:
            res = fn(**kwargs, out_dir=out_dir, say=lambda s: say("   " + s))
            ok, error = bool(res.get("ok", True)), None
        except Exception as e:  # one broken benchmark must not hide the others' numbers
            ok, error = False, f"{type(e).__name__}: {e}"
            say(f"   error: {error}")
        results.append({"benchmark": label, "ok": ok, "seconds": round(time.time() - t, 1), "error": error})
    failed = [r["benchmark"] for r in results if not r["ok"]]
    say(f"{len(results) - len(failed)}/{len(results)} within bounds in {time.time() - t0:.0f} s"
        + (f"; outside: {', '.join(failed)}" if failed else ""))
    out = {"benchmark": "suite", "quick": quick, "results": results, "ok": not failed, "failed": failed,
           "seconds": round(time.time() - t0, 1), "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return _save(out, out_dir, f"suite-{'quick' if quick else 'full'}.json", say)


# --------------------------------------------------------------------------- side by side with Mininet


def mininet_benchmark(hosts: int = 8, *, rate: str = "10mbit", cpus: float = 0.25, seconds: float = 6.0,
                      out_dir: Path | None = None, say: Callable[[str], None] = print) -> dict:
    """The same N hosts on one switch, each link at `rate` and each host capped at `cpus`, in
    Mininet (CPULimitedHost + TCLink, Debian's package, run by testbed/bench/mininet_probe.py under the
    system Python) and in edgebed's netns runtime: seconds to bring up and to stop, host memory in
    use with the cluster up and idle, TCP goodput between two hosts. Ratios are edgebed / Mininet."""
    import shutil
    import subprocess

    from testbed.bench.fidelity import _mem_available, _transfer

    py = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    probe = Path(__file__).with_name("mininet_probe.py")
    configured = units.parse_rate(rate)
    if subprocess.run([py, "-c", "import mininet"], capture_output=True).returncode != 0:
        raise RuntimeError(f"Mininet does not import under {py}: apt-get install mininet bridge-utils iperf3")
    r = subprocess.run([py, str(probe), "--hosts", str(hosts), "--rate", f"{configured / 1e6:g}", "--cpu", f"{cpus:g}",
                        "--seconds", f"{seconds:g}"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        subprocess.run(["mn", "-c"], capture_output=True)  # Mininet's own cleanup after a failed probe
        raise RuntimeError(f"mininet probe failed: {r.stderr.strip()[-500:]}")
    mn = json.loads(r.stdout.strip().splitlines()[-1])

    # edgebed: hosts = ps + evaluator + (hosts - 2) workers, every one shaped and capped the same way
    profile = {"bandwidth": rate, "cpus": cpus}
    scenario = {"name": "bench", "profiles": {"p": profile}, "ps": {"profile": "p"}, "evaluator": {"profile": "p"},
                "workers": [{"count": max(1, hosts - 2), "profile": "p"}]}
    bench = _Bench({}, "netns", scenario=scenario)  # (imports the runtime: not the cluster's memory)
    before = _mem_available()
    t0 = time.time()
    with bench as (rt, spec):
        up_s = time.time() - t0
        used = before - _mem_available()
        w0, w1 = spec.node("w0"), spec.node("w1") if hosts > 2 else spec.node("ps")
        goodput, _wire = _transfer(bench, w0, w1, seconds, 1, "mn", lambda: rt.link_counter("w0", "up_bytes"))
        t1 = time.time()
    stop_s = time.time() - t1
    eb = {"hosts": len(spec.nodes), "up_seconds": up_s, "stop_seconds": stop_s, "memory_used_bytes": used,
          "goodput_bps": goodput}
    ratios = {k: (eb[k] / mn[k] if mn.get(k) else None) for k in ("up_seconds", "stop_seconds", "goodput_bps")}
    ok = not bench.problems and mn.get("goodput_bps") is not None
    say(f"{hosts} hosts at {units.format_rate(configured)}, {cpus:g} CPU each:")
    for name, d in (("mininet", mn), ("edgebed", eb)):
        say(f"  {name:8s} up {d['up_seconds']:6.2f} s  stop {d['stop_seconds']:6.2f} s  memory "
            f"{d['memory_used_bytes'] / 2**20:7.1f} MiB  goodput {(d['goodput_bps'] or 0) / 1e6:7.3f} Mbit/s "
            f"({100 * (d['goodput_bps'] or 0) / configured:.1f}%)")
    say("  edgebed / mininet: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None))
    out = {"benchmark": "mininet", "hosts": hosts, "configured_bps": configured, "cpus": cpus, "seconds": seconds,
           "mininet": mn, "edgebed": eb, "ratios": ratios, "ok": ok, "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "up = building and starting the hosts, links and limits (Mininet: Mininet() + start(); edgebed: "
                   "the runtime's create); memory = MemAvailable drop with the cluster up and idle; goodput = one "
                   "TCP flow between two hosts (Mininet: iperf3; edgebed: its own sender/receiver)"}
    return _save(out, out_dir, f"mininet-{hosts}-{units.format_rate(configured)}.json", say)


# --------------------------------------------------------------------------- Flower, side by side

FLOWER_VENV = Path(__file__).resolve().parents[2] / ".venv-flower"  # make flower-venv


def _edgebed_fedavg_rounds(clients: int, rounds: int, local_steps: int, batch_size: int, model: str,
                           dataset: str, lr: float, seed: int) -> dict:
    """The same FedAvg rounds in edgebed (netns, local_sgd with period = local steps, no CPU caps or
    shaping, one torch thread a worker, no evaluation): each round's wall time from server.csv
    (one model version a round), the workers' compute_seconds in it from steps.csv."""
    from testbed.plan import parse_scenario

    sc = parse_scenario({"name": "bench-fedavg", "runtime": "netns", "seed": seed,
                         "workload": {"model": model, "dataset": dataset, "batch_size": batch_size, "lr": lr,
                                      "threads": 1, "eval_interval": 10_000_000},
                         "stop": {"steps": rounds, "seconds": 900},
                         "algorithm": {"name": "local_sgd", "params": {"period": local_steps}},
                         "workers": [{"count": clients}]})
    t0 = time.monotonic()
    summary, records = run_for_records(sc, "bench-flower", "server.csv", "steps.csv")
    total = time.monotonic() - t0
    server, steps = records["server.csv"].sort_values("time"), records["steps.csv"]
    ends = server.groupby("version").time.max().sort_index().to_numpy()
    out_rounds = []
    first = steps.sort_values("time").head(1)  # the first step's start: when round 1 began
    start = float(first.time.iloc[0] - first.compute_seconds.iloc[0]) if len(first) else 0.0
    for r, end in enumerate(ends, start=1):
        in_round = steps[(steps.step >= (r - 1) * local_steps) & (steps.step < r * local_steps)]
        per_worker = in_round.groupby("node").compute_seconds.sum()
        out_rounds.append({"round": r, "start": start, "end": float(end), "seconds": float(end) - start,
                           "clients": int(in_round.node.nunique()), "compute_s_sum": float(per_worker.sum()),
                           "compute_s_max": float(per_worker.max()) if len(per_worker) else 0.0})
        start = float(end)
    return {"framework": "edgebed", "status": summary["status"], "clients": clients, "rounds": out_rounds,
            "total_seconds": total}


def _bare_fedavg_round(clients: int, local_steps: int, batch_size: int, model: str, cores: int) -> float:
    """The ideal round on this machine: the clients' local steps and nothing else, spread over
    `cores` processes (one torch thread each) and run at once; the slowest process's time."""
    import multiprocessing as mp
    import tempfile

    per = [clients // cores + (1 if i < clients % cores else 0) for i in range(cores)]
    with tempfile.TemporaryDirectory(prefix="edgebed-bare-") as tmp:
        paths = [str(Path(tmp) / f"{i}.json") for i in range(cores)]
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_bare_process, args=(model, batch_size, 10 + n * local_steps, 1, 1, path))
                 for n, path in zip(per, paths) if n]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
        # the first 10 steps warm up (allocator, lazy init); the rest are the clients' work
        return max(sum(json.loads(Path(path).read_text())["times"][10:]) for n, path in zip(per, paths) if n)


def flower_benchmark(clients: int = 4, *, rounds: int = 11, local_steps: int = 10, batch_size: int = 32,
                     model: str = "adacomp_cnn", dataset: str = "mnist5k", lr: float = 0.05, seed: int = 1,
                     venv: Path = FLOWER_VENV, out_dir: Path | None = None,
                     say: Callable[[str], None] = print) -> dict:
    """FedAvg rounds of the same work in Flower's simulation engine (flwr + Ray, run by
    testbed/bench/flower_probe.py under `venv`) and in edgebed (netns): each round every client takes
    `local_steps` steps of `batch_size` on the same model and data, then the server averages.
    Per-round overhead = the round's wall time minus the ideal round (the same steps alone, spread
    over this machine's cores). The first round is not averaged in (Flower starts its Ray actors
    in it; edgebed's processes start before it). The whole run, from the call to the end, counts
    both start-ups: Ray's, and edgebed's namespaces, links and processes. Ratios are edgebed / Flower."""
    import subprocess

    py = Path(venv) / "bin" / "python"
    if not py.exists():
        raise RuntimeError(f"no Flower venv at {venv}: make flower-venv (PyPI's flwr[simulation])")
    cores = os.cpu_count() or 1
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([str(py), "-m", "testbed.bench.flower_probe", "--clients", str(clients), "--rounds", str(rounds),
                        "--local-steps", str(local_steps), "--batch-size", str(batch_size), "--model", model,
                        "--dataset", dataset, "--lr", str(lr), "--seed", str(seed), "--cpus", str(cores)],
                       capture_output=True, text=True, timeout=900, cwd=repo)
    if r.returncode != 0:
        raise RuntimeError(f"flower probe failed: {r.stderr.strip()[-800:]}")
    fl = json.loads(r.stdout.strip().splitlines()[-1])
    eb = _edgebed_fedavg_rounds(clients, rounds, local_steps, batch_size, model, dataset, lr, seed)
    ideal = _bare_fedavg_round(clients, local_steps, batch_size, model, cores)

    def summary(d: dict) -> dict:
        later = [x["seconds"] for x in d["rounds"][1:]]
        rnd = statistics.median(later) if later else None
        return {"first_round_s": d["rounds"][0]["seconds"] if d["rounds"] else None, "round_s": rnd,
                "overhead_s": None if rnd is None else rnd - ideal, "total_s": d["total_seconds"],
                "rounds_done": len(d["rounds"])}

    s_fl, s_eb = summary(fl), summary(eb)
    ratios = {k: (s_eb[k] / s_fl[k] if s_fl.get(k) and s_eb.get(k) is not None else None)
              for k in ("round_s", "overhead_s", "total_s")}
    ok = s_fl["rounds_done"] == s_eb["rounds_done"] == rounds and eb["status"] == "completed"
    say(f"FedAvg, {clients} clients x {local_steps} steps of {batch_size} ({model}, {dataset}) a round, {rounds} rounds, "
        f"{cores} cores; ideal round (the steps alone) {ideal:.2f} s")
    for name, s in (("flower", s_fl), ("edgebed", s_eb)):
        say(f"  {name:8s} round {s['round_s']:.2f} s (overhead {s['overhead_s']:+.2f} s), first round "
            f"{s['first_round_s']:.2f} s, whole run {s['total_s']:.1f} s")
    say("  edgebed / flower: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None))
    out = {"benchmark": "flower", "clients": clients, "rounds": rounds, "local_steps": local_steps,
           "batch_size": batch_size, "model": model, "dataset": dataset, "cores": cores,
           "flwr_version": fl.get("flwr_version"), "ideal_round_s": ideal, "flower": s_fl, "edgebed": s_eb,
           "flower_rounds": fl["rounds"], "edgebed_rounds": eb["rounds"], "ratios": ratios, "ok": ok,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "round = server sends the model .. server has averaged every client's result; ideal = the "
                   "round's local steps alone (bare PyTorch, one thread, spread over the cores); flower: "
                   "start_simulation with one CPU a client, in-process Ray object store; edgebed: netns nodes, "
                   "the model and the updates over TCP on unshaped veth links, a PS barrier"}
    return _save(out, out_dir, f"flower-{clients}clients.json", say)
