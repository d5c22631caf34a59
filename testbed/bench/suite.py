"""`edgebed bench all`: the benchmark suite, with a --quick CI form that fails when a fidelity
number leaves a generous bound, and one summary of every benchmark's verdict.

The benchmarks of what training sees live in modules of their own (update, overhead, wire,
side_by_side); this module keeps them importable under their old names.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from testbed.bench import cpu, links, startup
from testbed.bench.harness import save_result
from testbed.bench.overhead import overhead_benchmark, stress_benchmark
from testbed.bench.side_by_side import FLOWER_VENV, flower_benchmark, mininet_benchmark
from testbed.bench.update import FRAME_EFFICIENCY, update_benchmark
from testbed.bench.wire import WIRE_PARAMS, wire_benchmark

__all__ = ["FLOWER_VENV", "FRAME_EFFICIENCY", "WIRE_PARAMS", "flower_benchmark", "mininet_benchmark",
           "overhead_benchmark", "run_suite", "stress_benchmark", "suite", "update_benchmark", "wire_benchmark"]


def _docker_available() -> bool:
    try:
        from testbed.runtimes.engine.client import docker_client

        return docker_client(timeout=3) is not None
    except Exception:
        return False


def suite(quick: bool, *, docker: bool | None = None) -> list[tuple[str, Callable[..., dict], dict]]:
    """(label, benchmark, kwargs) in the order they run. --quick: a few minutes, generous bounds
    (catching a broken shaper or quota, not noise); full: the tables of BENCHMARKS.md."""
    docker = _docker_available() if docker is None else docker
    return _quick_suite(docker) if quick else _full_suite(docker)


def _quick_suite(docker: bool) -> list[tuple[str, Callable[..., dict], dict]]:
    # Links: goodput sits 4.4% under the rate (headers), a busy host a few points lower still; a
    # broken shaper is off by far more (an unshaped veth: Gbit/s; bits as bytes: 8x).
    items = [
        ("link 10mbit", links.link_benchmark, {"rate": "10mbit", "seconds": 5.0, "tolerance": 0.12}),
        ("link 100mbit", links.link_benchmark, {"rate": "100mbit", "seconds": 5.0, "tolerance": 0.12}),
        ("cpu 0.25", cpu.cpu_benchmark, {"cpus": 0.25, "seconds": 3.0, "tolerance": 0.05}),
        ("loss 10%", links.loss_benchmark, {"loss": "10%", "packets": 5000}),
        ("delay 20ms", links.delay_benchmark, {"latency": "20ms", "count": 20}),
        ("update 1M params, 100mbit", update_benchmark, {"params": 1_000_000, "rate": "100mbit", "repeats": 2,
                                                         "tolerance": 0.15}),
        ("startup 4 workers", startup.startup_benchmark, {"workers": 4}),
    ]
    if docker:
        items += [("link 10mbit docker", links.link_benchmark,
                   {"rate": "10mbit", "seconds": 5.0, "tolerance": 0.12, "runtime": "docker"}),
                  ("cpu 0.5 docker", cpu.cpu_benchmark,
                   {"cpus": 0.5, "seconds": 3.0, "tolerance": 0.05, "runtime": "docker"})]
    return items


def _full_suite(docker: bool) -> list[tuple[str, Callable[..., dict], dict]]:
    items = []
    for rate in ("1mbit", "10mbit", "100mbit", "1gbit"):
        items.append((f"link {rate}", links.link_benchmark,
                      {"rate": rate, "seconds": 20.0 if rate == "1mbit" else 8.0}))
    for rate in ("10mbit", "100mbit"):
        items.append((f"link {rate} 4 flows", links.link_benchmark, {"rate": rate, "seconds": 8.0, "flows": 4}))
    for c in (0.1, 0.25, 0.5, 1.0, 1.5, 2.0):
        items.append((f"cpu {c:g}", cpu.cpu_benchmark, {"cpus": c, "seconds": 8.0}))
    for loss in ("1%", "10%"):
        items.append((f"loss {loss}", links.loss_benchmark, {"loss": loss}))
    for lat, jit, n in (("0ms", "0ms", 200), ("20ms", "0ms", 200), ("20ms", "5ms", 200), ("50ms", "0ms", 100)):
        items.append((f"delay {lat} jitter {jit}", links.delay_benchmark,
                      {"latency": lat, "jitter": jit, "count": n}))
    for rate, sizes in (("10mbit", (200_000, 1_000_000, 5_000_000)),
                        ("100mbit", (200_000, 1_000_000, 5_000_000, 25_000_000))):
        for p in sizes:
            items.append((f"update {p / 1e6:g}M params, {rate}", update_benchmark, {"params": p, "rate": rate}))
    items.append(("overhead adacomp_cnn 1 CPU", overhead_benchmark, {"cpus": 1.0}))
    items.append(("overhead adacomp_cnn 0.5 CPU", overhead_benchmark, {"cpus": 0.5}))
    items.append(("stress 0.5 of 1 CPU", stress_benchmark, {"cpus": 1.0, "stress": 0.5}))
    items.append(("stress 0.25 of 0.5 CPU", stress_benchmark, {"cpus": 0.5, "stress": 0.25}))
    for c in (0.25, 0.5, 1.0):
        items.append((f"cpu {c:g}, another node busy", cpu.cpu_benchmark, {"cpus": c, "seconds": 8.0,
                                                                        "others_busy": True}))
    for n in (8, 32):
        items.append((f"mininet side by side, {n} hosts", mininet_benchmark, {"hosts": n, "rate": "10mbit"}))
    for n in (4, 16):  # needs .venv-flower (make flower-venv); without it, an error row, the rest still run
        items.append((f"flower side by side, {n} clients", flower_benchmark, {"clients": n}))
    for n in (1, 8, 16, 32, 64, 128, 256):  # 64 the aim, 256 the most tried
        items.append((f"startup {n} workers", startup.startup_benchmark, {"workers": n}))
    from testbed.strategies import strategies

    for name in sorted(strategies()):
        items.append((f"wire {name}", wire_benchmark, {"algorithm": name}))
    items.append(("topology 1gbit/100mbit", links.topology_benchmark, {"lan": "1gbit", "wan": "100mbit"}))
    if docker:
        for rate in ("10mbit", "100mbit"):
            items.append((f"link {rate} docker", links.link_benchmark,
                          {"rate": rate, "seconds": 8.0, "runtime": "docker"}))
        for c in (0.25, 0.5, 1.0):
            items.append((f"cpu {c:g} docker", cpu.cpu_benchmark,
                          {"cpus": c, "seconds": 8.0, "runtime": "docker"}))
        for n in (1, 8, 16, 32):
            items.append((f"startup {n} workers docker", startup.startup_benchmark,
                          {"workers": n, "runtime": "docker"}))
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
    return save_result(out, out_dir, f"suite-{'quick' if quick else 'full'}.json", say)
