"""Start-up benchmark: how long N workers take from `edgebed up` to training, and what they cost in memory."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import mem_available, run_for_records, save_result
from testbed.plan import parse_scenario


class _LowestMemory:
    """The host's MemAvailable at its lowest, sampled every 0.25 s from a thread until stop()."""

    def __init__(self) -> None:
        self.before = mem_available()
        self.lowest = self.before
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.25):
            self.lowest = min(self.lowest, mem_available())

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def startup_benchmark(workers: int, *, runtime: str = "netns", out_dir: Path | None = None,
                      say: Callable[[str], None] = print, cpus: float = 0.5, window: float = 0.0) -> dict:
    """Seconds from `edgebed up` to the first training step, to every worker's first step, and to
    tear down, for N workers; and what the cluster costs in memory: the host's MemAvailable drop at
    its lowest during the run and each worker's peak (its cgroup's memory, resources.csv). ASGD
    trains the small CNN (adacomp_cnn) for a window that grows with N (10 s + 0.3 s a worker: a
    budget of updates would end the run before the last workers start), and the run counts how
    many workers trained in it (all of them: the machine holds the cluster)."""
    import pandas as pd

    sc = parse_scenario({"name": f"startup-{workers}", "runtime": runtime,
                         "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "eval_interval": 100000},
                         "stop": {"seconds": window or 10 + 0.3 * workers}, "algorithm": {"name": "asgd"},
                         "profiles": {"edge": {"bandwidth": "100mbit", **({"cpus": cpus} if cpus else {})}},
                         "workers": [{"count": workers, "profile": "edge"}]})
    watcher = _LowestMemory()
    t = time.time()
    try:
        summary, records = run_for_records(sc, "bench-startup", "steps.csv", "resources.csv")
    finally:
        total = time.time() - t
        watcher.stop()
    steps, res = records["steps.csv"], records["resources.csv"]
    stepped = int(steps.node.nunique()) if len(steps) else 0
    # every worker's first step, from `edgebed up` (steps.csv times count from the run's t0)
    all_stepping = None
    if stepped == workers and summary["startup_seconds"] is not None:
        first_of_each = steps.groupby("node").time.min()
        all_stepping = round(summary["startup_seconds"] - float(first_of_each.min()) + float(first_of_each.max()), 3)
    peaks = res[res.node.str.match(r"^w\d+$")].groupby("node").memory_bytes.max() if len(res) else pd.Series()
    per_worker = float(peaks.mean()) if len(peaks) else None
    host_used = watcher.before - watcher.lowest
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
    name = f"startup-{runtime}-{workers}" + ("" if cpus == 0.5 else f"-{cpus:g}cpu") + ".json"
    return save_result(out, out_dir, name, say)
