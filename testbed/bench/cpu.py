"""CPU fidelity benchmark: does a node's CPU quota give it its share, alone or contended?"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import Bench, save_result
from testbed.node import mailbox


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
    bench = Bench(shaped, runtime, scenario=scenario)
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
    return save_result(out, out_dir, f"{name}.json", say)
