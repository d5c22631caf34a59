"""The soak benchmark: a long run with a random fault every minute (seeded), then a check that the
records are consistent and nothing is left behind (`edgebed bench soak`).

Each minute one fault hits a random worker at a random second of the minute's first half and is
undone 10-25 s later: a link change (rate, latency, loss), a CPU quota cut, background stress, a
kill (restart), a freeze (resume) or a partition from the PS (heal). The run is a real
`edgebed up` in a child process; afterwards the records are read like any user would and held
to what the faults should have done.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Callable, Optional

FAULTS = ("link", "cpu", "stress", "kill", "pause", "partition")
UNDO = {"link": "link", "cpu": "cpu", "stress": "stress", "kill": "restart", "pause": "resume", "partition": "heal"}


def soak_events(minutes: int, workers: int, seed: int, base_rate: str, base_cpus: float) -> list[dict]:
    """One fault per minute from minute 1 on (the first minute trains undisturbed), each undone
    before the next minute starts, all drawn from `random.Random(seed)`."""
    rng = random.Random(seed)
    events = []
    for minute in range(1, minutes):
        start = 60 * minute + rng.randint(0, 30)
        end = start + rng.randint(10, 25)
        kind = rng.choice(FAULTS)
        target = f"w{rng.randrange(workers)}"
        fault: dict = {"at": f"{start}s", "target": target, "action": kind}
        undo: dict = {"at": f"{end}s", "target": target, "action": UNDO[kind]}
        if kind == "link":
            fault.update(rate=f"{rng.choice([1, 2, 5])}mbit", latency=f"{rng.choice([0, 20, 80])}ms",
                         loss=f"{rng.choice([0, 0.5, 2])}%")
            undo.update(rate=base_rate, latency="0ms", loss="0%")
        elif kind == "cpu":
            fault["cpus"] = round(base_cpus * rng.choice([0.25, 0.5]), 3)
            undo["cpus"] = base_cpus
        elif kind == "stress":
            fault["load"] = rng.choice([0.5, 1.0, 2.0])
            undo["load"] = 0
        elif kind == "partition":
            fault["peers"] = ["ps"]
        events += [fault, undo]
    return events


def soak_scenario(minutes: int, workers: int, seed: int, runtime: str, algorithm: str) -> dict:
    base_rate, base_cpus = "50mbit", 0.25
    return {
        "name": f"soak-{minutes}min-seed{seed}", "seed": seed, "runtime": runtime,
        "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05,
                     "eval_interval": 100},
        "stop": {"seconds": 60 * minutes},
        "algorithm": {"name": algorithm},
        "faults": {"worker_timeout": "5s", "on_worker_loss": "continue"},
        "profiles": {"server": {"cpus": 0.4, "bandwidth": "1gbit"},
                     "edge": {"cpus": base_cpus, "bandwidth": base_rate}},
        "ps": {"profile": "server"}, "evaluator": {"profile": "server"},
        "workers": [{"count": workers, "profile": "edge"}],
        "events": soak_events(minutes, workers, seed, base_rate, base_cpus),
    }


def check_soak_run(run_dir: Path, scenario: dict) -> dict:
    """Hold a finished soak run's records to what its faults should have done; the findings."""
    import pandas as pd

    from testbed.records.reader import load_run

    rec = load_run(run_dir)
    problems: list[str] = []
    summary = rec.summary or {}
    if summary.get("status") != "completed":
        problems.append(f"summary: status {summary.get('status')} ({summary.get('reason')})")
    planned = scenario["events"]
    ev = rec.events
    applied = ev[ev.scheduled_time.notna()]
    failed = applied[applied.detail.str.contains("FAILED", na=False)]
    if len(applied) != len(planned):
        problems.append(f"events: {len(applied)} applied of {len(planned)} planned")
    if len(failed):
        problems.append(f"events: {len(failed)} failed: {failed.detail.tolist()[:3]}")
    late = (applied.time - applied.scheduled_time)
    if len(late) and late.abs().max() > 0.1:
        problems.append(f"events: applied up to {late.abs().max() * 1000:.0f} ms off schedule")
    # steps: per node in time order; none from a worker while it was killed, frozen or cut off
    steps = rec.steps
    silent = []
    for fault, undo in zip(planned[::2], planned[1::2]):
        if fault["action"] not in ("kill", "pause", "partition"):
            continue
        a, b = float(fault["at"][:-1]), float(undo["at"][:-1])
        w = steps[(steps.node == fault["target"]) & (steps.time > a + 1.0) & (steps.time < b)]
        silent.append(len(w))
        if len(w) > 1:  # one step may have been on its way
            problems.append(f"steps: {fault['target']} made {len(w)} steps during its "
                            f"{fault['action']} {a:.0f}-{b:.0f} s")
    last_undo: dict[str, float] = {}
    for e in planned[1::2]:
        last_undo[e["target"]] = max(last_undo.get(e["target"], 0.0), float(e["at"][:-1]))
    for node in sorted({f"w{i}" for i in range(scenario["workers"][0]["count"])}):
        t_back = last_undo.get(node, 0.0)
        after = steps[(steps.node == node) & (steps.time > t_back + 10)]
        if t_back < 60 * (len(planned) // 2) and len(after) == 0 and t_back + 40 < rec.steps.time.max():
            problems.append(f"steps: {node} never trained after its last recovery at {t_back:.0f} s")
    # traffic samples: one about every second, no gap (the monitor kept going through every fault)
    tr = rec.traffic
    times = sorted(set(tr.time.round(1)))
    gaps = [b - a for a, b in zip(times, times[1:])]
    if gaps and max(gaps) > 3.0:
        problems.append(f"traffic.csv: a {max(gaps):.1f} s gap in the samples")
    negative = tr[tr.delta_bytes < 0]
    if len(negative):
        problems.append(f"traffic.csv: {len(negative)} negative deltas")
    evals = rec.evals
    acc = evals.accuracy.dropna()
    if len(acc) < 2 or acc.iloc[-1] <= acc.iloc[0]:
        problems.append("eval.csv: accuracy did not improve")
    lost = ev[ev.action == "lost"]
    rejoined = ev[ev.action == "rejoined"]
    kinds = pd.Series([e["action"] for e in planned[::2]]).value_counts().to_dict()
    return {
        "ok": not problems, "problems": problems,
        "status": summary.get("status"), "reason": summary.get("reason"),
        "wall_seconds": summary.get("wall_seconds"),
        "faults": kinds, "events_applied": int(len(applied)), "events_planned": len(planned),
        "lateness_ms": {"median": float(late.abs().median() * 1000) if len(late) else None,
                        "max": float(late.abs().max() * 1000) if len(late) else None},
        "steps": int(len(steps)), "steps_per_worker": {k: int(v) for k, v in steps.node.value_counts().items()},
        "steps_while_down_max": max(silent) if silent else 0,
        "lost": int(len(lost)), "rejoined": int(len(rejoined)),
        "accuracy_first": float(acc.iloc[0]) if len(acc) else None,
        "accuracy_final": float(acc.iloc[-1]) if len(acc) else None,
        "accuracy_best": float(acc.max()) if len(acc) else None,
        "traffic_samples": len(times), "traffic_max_gap_s": max(gaps) if gaps else None,
    }


def leftover_resources() -> list[str]:
    from testbed.runtimes import load_backends
    from testbed.runtimes.state import leftovers

    load_backends()
    found = list(leftovers())
    try:
        from testbed.runtimes.engine.client import docker_client

        client = docker_client(timeout=3)
        if client is not None:
            found += [f"container {c.name}"
                      for c in client.containers.list(all=True, filters={"label": "edgebed"}, ignore_removed=True)]
            found += [f"network {n.name}" for n in client.networks.list(filters={"label": "edgebed"})]
    except Exception:
        pass
    netns = Path("/run/netns")
    if netns.is_dir():
        found += [f"netns {p.name}" for p in netns.iterdir() if p.name.startswith("eb-")]
    return found


def soak_benchmark(*, minutes: int = 30, workers: int = 4, seed: int = 1, runtime: str = "netns",
                   algorithm: str = "bsp", out_dir: Optional[Path] = Path("benchmarks/results"),
                   run_dir: Optional[Path] = None, say: Callable[[str], None] = print) -> dict:
    import yaml

    from testbed.bench.harness import run_child, save_result

    if minutes < 2:
        raise ValueError("--minutes: at least 2 (the first minute has no fault)")
    before = leftover_resources()
    sc = soak_scenario(minutes, workers, seed, runtime, algorithm)
    run_dir = Path(run_dir or f"runs/soak-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    path = run_dir.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(sc, sort_keys=False))
    say(f"soak: {minutes} min, {workers} workers, {algorithm}, {runtime}, seed {seed}: "
        f"{len(sc['events']) // 2} faults; scenario {path}, records {run_dir}")
    t0 = time.time()
    r = run_child([sys.executable, "-m", "testbed.cli", "up", str(path), "--out", str(run_dir), "-q"])
    res = check_soak_run(run_dir, sc)
    res.update(benchmark="soak", minutes=minutes, workers=workers, seed=seed, runtime=runtime, algorithm=algorithm,
               runner_exit=r.returncode, elapsed_seconds=round(time.time() - t0, 1), run_dir=str(run_dir),
               date=time.strftime("%Y-%m-%d %H:%M"))
    left = [x for x in leftover_resources() if x not in before]
    res["leftovers"] = left
    if left:
        res["ok"] = False
        res["problems"].append(f"left behind: {left}")
    if r.returncode != 0:
        res["ok"] = False
        res["problems"].append(f"edgebed up exited {r.returncode}: {r.stderr[-500:]}")
    for line in res["problems"]:
        say(f"PROBLEM {line}")
    say(f"soak {'ok' if res['ok'] else 'FAILED'}: {res['events_applied']}/{res['events_planned']} events, "
        f"lateness max {res['lateness_ms']['max']:.0f} ms, {res['steps']} steps, lost {res['lost']} rejoined "
        f"{res['rejoined']}, accuracy {res['accuracy_first']} -> {res['accuracy_final']}, leftovers {len(left)}")
    return save_result(res, out_dir, f"soak-{runtime}-{minutes}min-seed{seed}.json", say)
