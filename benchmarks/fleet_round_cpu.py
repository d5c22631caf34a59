"""Where a fleet's CPU goes while it trains: the runner's own threads (the monitor's samples, the
control hub, the trainer starts, the timeline) against everything else on the machine, second by
second, during a FedAvg run of K of N devices with per-round trainers (the run `edgebed bench
flower --clients N --per-round K --bandwidth 100mbit` times against Flower).

The runner runs in this process (as the bench runs it), so each of its threads' CPU is read from
/proc/self/task/TID/stat and named by its Python thread (`threading.Thread.native_id`); the
machine's busy time from /proc/stat. What the runner takes of the machine while rounds run is
what the devices' trainers and the PS cannot have: on 2 cores, a second of runner CPU a second is
half the machine.

    sudo .venv/bin/python benchmarks/fleet_round_cpu.py [--devices 1000] [--per-round 10] [--rounds 11] [--parked P]
        [--out benchmarks/results/fleet-round-cpu-1000.json] [--keep RUN_DIR]

Root (netns runtime); run it alone. Results: BENCHMARKS.md, "Side by side with Flower".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each of this process's threads, by Python thread name (else its kernel name)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # ended between the listing and the read
            continue
        comm_end = stat.rindex(")")
        fields = stat[comm_end + 2:].split()
        name = names.get(int(tid), "native:" + stat[stat.index("(") + 1:comm_end])
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    return out


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = v[3] + v[4]
    return (sum(v) - idle) / TICK, sum(v) / TICK


def sample_loop(samples: list, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        samples.append({"t": time.time(), "threads": thread_cpu(), "machine": machine_busy()})


def fleet_scenario(devices: int, per_round: int, rounds: int, parked: int = 0):
    """The scenario `edgebed bench flower --clients N --per-round K --bandwidth 100mbit` runs."""
    from testbed.plan import parse_scenario

    return parse_scenario({"name": "bench-fleet-fedavg", "runtime": "netns", "seed": 1,
                           "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05,
                                        "threads": 1, "eval_interval": 10_000_000},
                           "stop": {"steps": rounds, "seconds": 3600},
                           "algorithm": {"name": "fedavg", "params": {"period": 10, "clients": per_round,
                                                                      "trainers": "per_round", "deadline_s": 600,
                                                                      "parked": parked}},
                           "profiles": {"device": {"bandwidth": "100mbit"}},
                           "workers": [{"count": devices, "profile": "device"}]})


def _t0(lines: list[tuple[float, str]]) -> float:
    """The run's clock origin, from its first progress line `[  12.3s] ...`."""
    for at, line in lines:
        m = re.match(r"^\[\s*([\d.]+)s\]", line)
        if m:
            return at - float(m.group(1))
    raise SystemExit("no progress line: cannot place the rounds on this clock")


def window(samples: list, start: float, end: float) -> dict:
    """Each runner thread's and the machine's cores busy between the samples nearest start and end."""
    a = min(samples, key=lambda s: abs(s["t"] - start))
    b = min(samples, key=lambda s: abs(s["t"] - end))
    wall = b["t"] - a["t"]
    per_thread = {k: (b["threads"].get(k, 0.0) - a["threads"].get(k, 0.0)) / wall for k in b["threads"]}
    machine = (b["machine"][0] - a["machine"][0]) / wall
    runner = sum(per_thread.values())
    return {"seconds": wall, "machine_cores_busy": machine, "runner_cores": runner,
            "runner_share_of_busy": runner / machine if machine else None,
            "runner_threads_cores": dict(sorted(per_thread.items(), key=lambda kv: -kv[1])[:12])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--parked", type=int, default=0, help="trainers a round left out that wait for a later one")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the run's records in this folder")
    args = ap.parse_args()
    import pandas as pd

    from testbed.run.runner import run

    samples: list = []
    lines: list[tuple[float, str]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_loop, args=(samples, stop), name="bench-sampler", daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory(prefix="edgebed-round-cpu-") as tmp:
        run_dir = args.keep or Path(tmp) / "run"
        started = time.time()
        summary = run(fleet_scenario(args.devices, args.per_round, args.rounds, args.parked), "round-cpu", run_dir,
                      say=lambda line: lines.append((time.time(), line)))
        ended = time.time()
        rounds = pd.read_csv(run_dir / "rounds.csv").sort_values("round")
    stop.set()
    sampler.join()
    t0 = _t0(lines)
    opened, closed = t0 + float((rounds.time - rounds.open_seconds).min()), t0 + float(rounds.time.max())
    out = {"devices": args.devices, "per_round": args.per_round, "parked": args.parked, "status": summary["status"],
           "reason": summary.get("reason"), "trainers": summary.get("trainers"),
           "last_lines": [line for _, line in lines[-8:]], "cores": os.cpu_count(),
           "round_seconds": [float(x) for x in rounds.open_seconds], "whole_run_s": ended - started,
           "before_rounds": window(samples, started, opened), "rounds": window(samples, opened, closed)}
    print(json.dumps({k: out[k] for k in ("status", "reason", "round_seconds", "rounds")}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
