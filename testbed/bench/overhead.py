"""edgebed's overhead on a worker's compute step: the same steps in a run and in a bare PyTorch
loop (overhead), and with a profile's background stress in the worker's cgroup (stress)."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import Bench, run_for_records, save_result
from testbed.node import mailbox


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


def bare_process(model: str, batch_size: int, steps: int, threads: int, seed: int, path: str) -> None:
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
    return save_result(out, out_dir, f"stress-{model}-{cpus:g}cpu-{stress:g}.json", say)


def overhead_benchmark(*, cpus: float = 1.0, model: str = "adacomp_cnn", batch_size: int = 32, steps: int = 60,
                       repeats: int = 3, out_dir: Path | None = None, say: Callable[[str], None] = print,
                       tolerance: float = 0.05) -> dict:
    """A worker's compute step in an edgebed run (ASGD, one worker at `cpus`, steps.csv's
    compute_seconds) against the same step in a bare PyTorch loop in a node with the same CPU quota
    and threads. The two alternate `repeats` times (one run alone varies by more than `tolerance`);
    the first 10 steps of each are warm-up; the overhead compares the medians of the runs' medians."""
    from testbed.plan.cluster import build_cluster

    runs_edgebed, runs_bare, statuses = [], [], []
    threads = 1
    for _ in range(repeats):
        sc, summary, in_edgebed = _edgebed_compute_steps(cpus, model, batch_size, steps)
        statuses.append(summary["status"])
        runs_edgebed.append(statistics.median(in_edgebed))
        threads = sc.workload.threads or build_cluster(sc, "x").node("w0").threads
        bench = Bench({"cpus": cpus}, "netns")
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
    return save_result(out, out_dir, f"overhead-{model}-{cpus:g}cpu.json", say)
