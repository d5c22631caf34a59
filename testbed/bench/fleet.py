"""`edgebed bench fleet`: FedAvg over N devices on the netns runtime (or swarm: the
two-host lab, `edgebed lab up`), K selected a
round, with `trainers: per_round` (a device's trainer process only while it is selected) or
`always` (every device's trainer for the whole run). While it runs, every second: memory in use
(MemTotal - MemAvailable) and the trainer processes alive; a few seconds in, each running
trainer's USS (its own pages: what one more trainer adds), PSS and RSS from smaps_rollup. After
it: bring-up and teardown seconds, the round times (rounds.csv), what became of the PS's trainer
requests, and the accuracy. On swarm the devices live in the lab's fleet hosts: memory in use is
the machine's (the lab's hosts share it), the trainers alive are not counted, and 30 s after the
nodes are up each fleet host's process that serves its devices (its USS over the devices: what
one more idle device costs) and each trainer are sampled. Needs root; run it with nothing else on the machine."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import pandas as pd
import yaml

from testbed.bench.harness import mem_available, save_result
from testbed.kernel.cgroups import NodeCgroup

REPO = Path(__file__).resolve().parents[2]

MiB = 2**20
DEFAULT_RUNTIME = "netns"


def scenario(devices: int, clients: int, trainers: str, seconds: float, model: str,
             runtime: str = DEFAULT_RUNTIME) -> dict:
    # the devices share 2 cores: 0.05 of a core each (10 running at once: half the machine);
    # mnist5k's 4,000 training samples give 1,000 devices 4 each, and past 4,000 some none: full MNIST
    dataset = "mnist5k" if devices <= 1000 else "mnist"
    return {"name": "fleet-training", "seed": 1, "runtime": runtime,
            "workload": {"model": model, "dataset": dataset, "batch_size": 32, "lr": 0.05, "eval_seconds": 5},
            "stop": {"seconds": seconds},
            "algorithm": {"name": "fedavg", "params": {"period": 4, "clients": clients, "over_selection": 1.3,
                                                       "deadline_s": 20, "trainers": trainers}},
            "profiles": {"server": {"cpus": 0.4, "bandwidth": "1gbit"}, "judge": {"cpus": 0.2, "bandwidth": "1gbit"},
                         "device": {"cpus": 0.05, "bandwidth": "20mbit", "latency": "30ms"}},
            "ps": {"profile": "server"}, "evaluator": {"profile": "judge"},
            "workers": [{"count": devices, "profile": "device", "name": "d"}]}


def mem_used() -> int:
    """MemTotal - MemAvailable, in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") - mem_available()


def rollup(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        return {}
    return out


def _memory(pids: list[int]) -> dict[str, int] | None:
    """USS, PSS and RSS of processes `pids` together (None where none could be read)."""
    rows = [r for r in (rollup(p) for p in pids) if r]
    if not rows:
        return None
    return {"uss": sum(r.get("Private_Clean", 0) + r.get("Private_Dirty", 0) for r in rows),
            "pss": sum(r.get("Pss", 0) for r in rows), "rss": sum(r.get("Rss", 0) for r in rows)}


def fleet_host_tree() -> tuple[list[int], list[int]]:
    """The lab's fleet hosts' first processes (each serves all of its host's devices) and their
    trainers, seen from this machine (the lab's hosts share it): every process of a fleet host
    runs `python -m testbed.node.fleet`; the first forks the relay and the forkserver, and
    the forkserver forks the trainers."""
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if b"testbed.node.fleet.host" not in Path(f"/proc/{entry}/cmdline").read_bytes():
                continue
            parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    hosts = [pid for pid, up in parent.items() if up not in parent]
    return hosts, [pid for pid, up in parent.items() if parent.get(up) in hosts]


class Sampler(threading.Thread):
    """Memory in use, trainers alive and the runner's open files each second; the trainers' smaps
    once, `at` s after they run; on swarm, once `fleet_at` s after the nodes are up (`nodes_up`:
    when the runner said so), each fleet host's first process and trainer."""

    def __init__(self, run_id: str, names: list[str], runner_pid: int, at: float = 8.0, fleet_at: float = 30.0):
        super().__init__(daemon=True)
        self.run_id, self.names, self.runner_pid, self.at, self.fleet_at = run_id, names, runner_pid, at, fleet_at
        self.series: list[tuple[float, int, int]] = []  # (time, bytes in use, trainers alive)
        self.runner_files: list[int] = []
        self.trainers: list[dict[str, int]] = []
        self.hosts: list[dict[str, int]] = []  # a swarm fleet's hosts' first processes (all their devices)
        self.nodes_up: float | None = None  # when the runner said its nodes were made
        self.stop = threading.Event()
        self.local = False  # whether a node's cgroup was found here (a swarm's are in its hosts' engines)

    def alive(self) -> dict[str, list[int]]:
        out = {}
        for n in self.names:
            cg = NodeCgroup(self.run_id, n)
            self.local = self.local or any(d.is_dir() for d in cg.dirs())
            pids = [p for p in cg.pids()]
            if pids:
                out[n] = pids
        return out

    def run(self) -> None:
        t0 = time.time()
        while not self.stop.wait(1.0):
            alive = self.alive()
            self.series.append((round(time.time() - t0, 1), mem_used(), len(alive)))
            try:
                self.runner_files.append(len(os.listdir(f"/proc/{self.runner_pid}/fd")))
            except OSError:
                pass
            if not self.trainers and time.time() - t0 >= self.at and alive:
                self.trainers = [m for pids in alive.values() if (m := _memory(pids))]
            up = self.nodes_up
            if up is not None and not self.local and not self.hosts and time.time() >= up + self.fleet_at:
                self._fleet_hosts()

    def _fleet_hosts(self) -> None:
        hosts, trainers = fleet_host_tree()
        self.hosts = [m for p in hosts if (m := _memory([p]))]
        self.trainers = self.trainers or [m for p in trainers if (m := _memory([p]))]


def median_mib(values: list[int]) -> float | None:
    return round(statistics.median(values) / MiB, 1) if values else None


def measure(devices: int, clients: int, trainers: str, seconds: float, model: str,
            runtime: str = DEFAULT_RUNTIME) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="edgebed-fleet-training-"))
    path = scratch / "s.yaml"
    path.write_text(yaml.safe_dump(scenario(devices, clients, trainers, seconds, model, runtime)))
    run_dir = scratch / "run"
    before = mem_used()
    t0 = time.time()
    up = subprocess.Popen([sys.executable, "-m", "testbed.cli", "up", str(path), "--out", str(run_dir)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    names = [f"d{i}" for i in range(devices)]
    sampler = None
    lines = []
    assert up.stdout is not None
    nodes_up = None
    for line in up.stdout:
        lines.append(line.rstrip())
        if re.match(r"made \d+ nodes in", line):
            nodes_up = time.time()
        if sampler is None and line.startswith("run ") and (run_dir / "meta.json").exists():
            run_id = json.loads((run_dir / "meta.json").read_text())["run_id"]
            sampler = Sampler(run_id, names, up.pid)
            sampler.start()
        if sampler is not None:
            sampler.nodes_up = nodes_up
    up.wait()
    wall = time.time() - t0
    if sampler is not None:
        sampler.stop.set()
        sampler.join()
    made = [float(m.group(1)) for line in lines if (m := re.match(r"made \d+ nodes in ([0-9.]+) s", line))]
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    rounds = pd.read_csv(run_dir / "rounds.csv") if (run_dir / "rounds.csv").exists() else pd.DataFrame()
    series = sampler.series if sampler is not None else []
    counted = sampler is not None and sampler.local  # the nodes' cgroups are this machine's (not swarm's)
    tr = sampler.trainers if sampler is not None else []
    return {"benchmark": "fleet-training", "runtime": runtime, "devices": devices, "clients": clients,
            "trainers": trainers, "model": model, "seconds": seconds, "wall_seconds": round(wall, 1),
            "bring_up_seconds": made[0] if made else None, "teardown_seconds": summary.get("teardown_seconds"),
            "memory_in_use_before_mib": round(before / MiB),
            "memory_in_use_peak_mib": round(max(m for _, m, _ in series) / MiB) if series else None,
            "trainers_alive_max": max((a for _, _, a in series), default=None) if counted else None,
            "trainers_alive_median": statistics.median([a for _, _, a in series]) if series and counted else None,
            "trainer_uss_median_mib": median_mib([t["uss"] for t in tr]),
            "trainer_pss_median_mib": median_mib([t["pss"] for t in tr]),
            "trainer_rss_median_mib": median_mib([t["rss"] for t in tr]), "trainers_sampled": len(tr),
            **_fleet_hosts(sampler.hosts if sampler is not None else [], devices),
            "runner_open_files_max": max(sampler.runner_files, default=None) if sampler is not None else None,
            "rounds": len(rounds),
            "round_seconds_median": round(float(rounds.open_seconds.median()), 2) if len(rounds) else None,
            "rounds_by_reason": rounds.reason.value_counts().to_dict() if len(rounds) else {},
            "trainer_requests": summary.get("trainers"), "status": summary.get("status"),
            "final_accuracy": summary.get("final_accuracy"),
            "ok": summary.get("status") == "completed" and len(rounds) > 0,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "output_tail": lines[-3:] if summary.get("status") == "completed" else lines[-40:]}  # a failure's why


def _fleet_hosts(sampled: list[dict[str, int]], devices: int) -> dict:
    """A swarm fleet's hosts' first processes, when sampled: their USS (all of a host's idle
    devices are in it) and that over the devices (what one more idle device adds)."""
    if not sampled:
        return {}
    total = sum(m["uss"] for m in sampled)
    return {"fleet_hosts_sampled": len(sampled), "fleet_host_uss_mib": [round(m["uss"] / MiB) for m in sampled],
            "idle_device_uss_mib": round(total / devices / MiB, 3)}


def fleet_benchmark(devices: int, clients: int, *, trainers: str = "per_round", seconds: float = 90,
                    model: str = "mlp", runtime: str = DEFAULT_RUNTIME, out_dir: Path | None = None,
                    say: Callable[[str], None] = print) -> dict:
    """One fleet run measured (module docstring); its JSON goes to out_dir."""
    out = measure(devices, clients, trainers, seconds, model, runtime)
    say(json.dumps({k: v for k, v in out.items() if k != "output_tail"}, indent=1))
    model_part = "" if model == "mlp" else f"-{model}"
    runtime_part = "" if runtime == DEFAULT_RUNTIME else f"-{runtime}"  # the files before --runtime keep their names
    return save_result(out, out_dir, f"fleet-{devices}-{clients}-{trainers}{model_part}{runtime_part}.json", say)
