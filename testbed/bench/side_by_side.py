"""edgebed side by side with other tools on the same machine: Mininet (start-up, stop, memory,
goodput of the same hosts and links) and Flower's simulation engine (per-round overhead of the
same FedAvg rounds). Ratios are edgebed / the other tool."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import Bench, measure_transfer, mem_available, run_for_records, save_result
from testbed.bench.overhead import bare_process
from testbed.errors import HostCannot, RunFailed
from testbed.scenario import units


def mininet_benchmark(hosts: int = 8, *, rate: str = "10mbit", cpus: float = 0.25, seconds: float = 6.0,
                      out_dir: Path | None = None, say: Callable[[str], None] = print) -> dict:
    """The same N hosts on one switch, each link at `rate` and each host capped at `cpus`, in
    Mininet (CPULimitedHost + TCLink, Debian's package, run by testbed/bench/mininet_probe.py under the
    system Python) and in edgebed's netns runtime: seconds to bring up and to stop, host memory in
    use with the cluster up and idle, TCP goodput between two hosts. Ratios are edgebed / Mininet."""
    import shutil
    import subprocess

    py = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    probe = Path(__file__).with_name("mininet_probe.py")
    configured = units.parse_rate(rate)
    if subprocess.run([py, "-c", "import mininet"], capture_output=True).returncode != 0:
        raise HostCannot(f"Mininet does not import under {py}: apt-get install mininet bridge-utils iperf3")
    r = subprocess.run([py, str(probe), "--hosts", str(hosts), "--rate", f"{configured / 1e6:g}", "--cpu", f"{cpus:g}",
                        "--seconds", f"{seconds:g}"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        subprocess.run(["mn", "-c"], capture_output=True)  # Mininet's own cleanup after a failed probe
        raise RunFailed(f"mininet probe failed: {r.stderr.strip()[-500:]}")
    mn = json.loads(r.stdout.strip().splitlines()[-1])

    # edgebed: hosts = ps + evaluator + (hosts - 2) workers, every one shaped and capped the same way
    profile = {"bandwidth": rate, "cpus": cpus}
    scenario = {"name": "bench", "profiles": {"p": profile}, "ps": {"profile": "p"}, "evaluator": {"profile": "p"},
                "workers": [{"count": max(1, hosts - 2), "profile": "p"}]}
    bench = Bench({}, "netns", scenario=scenario)  # (imports the runtime: not the cluster's memory)
    before = mem_available()
    t0 = time.time()
    with bench as (rt, spec):
        up_s = time.time() - t0
        used = before - mem_available()
        w0, w1 = spec.node("w0"), spec.node("w1") if hosts > 2 else spec.node("ps")
        goodput, _wire = measure_transfer(bench, w0, w1, seconds, 1, "mn", lambda: rt.link_counter("w0", "up_bytes"))
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
    return save_result(out, out_dir, f"mininet-{hosts}-{units.format_rate(configured)}.json", say)


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
        # a worker's steps count from 1: round r is its steps (r-1)H+1 .. rH, the last one the push
        in_round = steps[(steps.step > (r - 1) * local_steps) & (steps.step <= r * local_steps)]
        per_worker = in_round.groupby("node").compute_seconds.sum()
        out_rounds.append({"round": r, "start": start, "end": float(end), "seconds": float(end) - start,
                           "clients": int(in_round.node.nunique()), "compute_s_sum": float(per_worker.sum()),
                           "compute_s_max": float(per_worker.max()) if len(per_worker) else 0.0})
        start = float(end)
    return {"framework": "edgebed", "status": summary["status"], "clients": clients, "rounds": out_rounds,
            "total_seconds": total}


def _edgebed_fleet_rounds(devices: int, per_round: int, rounds: int, local_steps: int, batch_size: int, model: str,
                          dataset: str, lr: float, seed: int, bandwidth: str, parked: int = 0) -> dict:
    """K of N devices a round in edgebed (netns, fedavg with per-round trainers: a selected device's
    trainer starts with its round; each device's link shaped to `bandwidth` both ways, if given):
    each round's time from rounds.csv (open to close), the reports in it."""
    from testbed.plan import parse_scenario

    profile = {"bandwidth": bandwidth} if bandwidth else {}
    sc = parse_scenario({"name": "bench-fleet-fedavg", "runtime": "netns", "seed": seed,
                         "workload": {"model": model, "dataset": dataset, "batch_size": batch_size, "lr": lr,
                                      "threads": 1, "eval_interval": 10_000_000},
                         "stop": {"steps": rounds, "seconds": 3600},
                         "algorithm": {"name": "fedavg", "params": {"period": local_steps, "clients": per_round,
                                                                    "trainers": "per_round", "deadline_s": 600,
                                                                    "parked": parked}},
                         "profiles": {"device": profile}, "workers": [{"count": devices, "profile": "device"}]})
    t0 = time.monotonic()
    summary, records = run_for_records(sc, "bench-flower", "rounds.csv")
    total = time.monotonic() - t0
    rows = records["rounds.csv"].sort_values("round")
    # rounds.csv counts from 0, Flower from 1: numbered as Flower's here
    out_rounds = [{"round": int(r["round"]) + 1, "seconds": float(r.open_seconds), "clients": int(r.n_finished)}
                  for _, r in rows.iterrows()]
    return {"framework": "edgebed", "status": summary["status"], "clients": devices, "per_round": per_round,
            "rounds": out_rounds, "total_seconds": total}


def _bare_fedavg_round(clients: int, local_steps: int, batch_size: int, model: str, cores: int) -> float:
    """The ideal round on this machine: the clients' local steps and nothing else, spread over
    `cores` processes (one torch thread each) and run at once; the slowest process's time."""
    import multiprocessing as mp
    import tempfile

    per = [clients // cores + (1 if i < clients % cores else 0) for i in range(cores)]
    with tempfile.TemporaryDirectory(prefix="edgebed-bare-") as tmp:
        paths = [str(Path(tmp) / f"{i}.json") for i in range(cores)]
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=bare_process, args=(model, batch_size, 10 + n * local_steps, 1, 1, path))
                 for n, path in zip(per, paths) if n]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
        # the first 10 steps warm up (allocator, lazy init); the rest are the clients' work
        return max(sum(json.loads(Path(path).read_text())["times"][10:]) for n, path in zip(per, paths) if n)


def flower_benchmark(clients: int = 4, *, rounds: int = 11, local_steps: int = 10, batch_size: int = 32,
                     model: str = "adacomp_cnn", dataset: str = "mnist5k", lr: float = 0.05, seed: int = 1,
                     per_round: int = 0, bandwidth: str = "", parked: int = 0, venv: Path = FLOWER_VENV,
                     out_dir: Path | None = None, say: Callable[[str], None] = print) -> dict:
    """FedAvg rounds of the same work in Flower's simulation engine (flwr + Ray, run by
    testbed/bench/flower_probe.py under `venv`) and in edgebed (netns): each round every client takes
    `local_steps` steps of `batch_size` on the same model and data, then the server averages.
    Per-round overhead = the round's wall time minus the ideal round (the same steps alone, spread
    over this machine's cores). The first round is not averaged in (Flower starts its Ray actors
    in it; edgebed's processes start before it). The whole run, from the call to the end, counts
    both start-ups: Ray's, and edgebed's namespaces, links and processes. Ratios are edgebed / Flower.

    `per_round` K (a fleet): K of the `clients` a round, Flower's FedAvg sampling them, edgebed's
    fedavg selecting them and starting their trainers for the round (trainers: per_round);
    `bandwidth`: edgebed's device links shaped to it (Flower has no network); `parked`: up to this
    many trainers a round left out wait for a later one (fedavg's `parked`)."""
    import subprocess

    py = Path(venv) / "bin" / "python"
    if not py.exists():
        raise HostCannot(f"no Flower venv at {venv}: make flower-venv (PyPI's flwr[simulation])")
    cores = os.cpu_count() or 1
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([str(py), "-m", "testbed.bench.flower_probe", "--clients", str(clients), "--rounds", str(rounds),
                        "--local-steps", str(local_steps), "--batch-size", str(batch_size), "--model", model,
                        "--dataset", dataset, "--lr", str(lr), "--seed", str(seed), "--cpus", str(cores),
                        "--per-round", str(per_round)],
                       capture_output=True, text=True, timeout=900, cwd=repo)
    if r.returncode != 0:
        raise RunFailed(f"flower probe failed: {r.stderr.strip()[-800:]}")
    fl = json.loads(r.stdout.strip().splitlines()[-1])
    if per_round:
        eb = _edgebed_fleet_rounds(clients, per_round, rounds, local_steps, batch_size, model, dataset, lr, seed,
                                   bandwidth, parked)
    else:
        eb = _edgebed_fedavg_rounds(clients, rounds, local_steps, batch_size, model, dataset, lr, seed)
    ideal = _bare_fedavg_round(per_round or clients, local_steps, batch_size, model, cores)

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
    who = f"{per_round} of {clients} clients" if per_round else f"{clients} clients"
    say(f"FedAvg, {who} x {local_steps} steps of {batch_size} ({model}, {dataset}) a round, {rounds} rounds, "
        f"{cores} cores{', edgebed links ' + bandwidth if bandwidth else ''}; "
        f"ideal round (the steps alone) {ideal:.2f} s")
    for name, s in (("flower", s_fl), ("edgebed", s_eb)):
        say(f"  {name:8s} round {s['round_s']:.2f} s (overhead {s['overhead_s']:+.2f} s), first round "
            f"{s['first_round_s']:.2f} s, whole run {s['total_s']:.1f} s")
    say("  edgebed / flower: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if v is not None))
    out = {"benchmark": "flower", "clients": clients, "per_round": per_round or clients,
           "edgebed_trainers": "per_round" if per_round else "always", "edgebed_bandwidth": bandwidth or None,
           "edgebed_parked": parked,
           "rounds": rounds, "local_steps": local_steps,
           "batch_size": batch_size, "model": model, "dataset": dataset, "cores": cores,
           "flwr_version": fl.get("flwr_version"), "ideal_round_s": ideal, "flower": s_fl, "edgebed": s_eb,
           "flower_rounds": fl["rounds"], "edgebed_rounds": eb["rounds"], "ratios": ratios, "ok": ok,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "note": "round = server sends the model .. server has averaged every client's result; ideal = the "
                   "round's local steps alone (bare PyTorch, one thread, spread over the cores); flower: "
                   "start_simulation with one CPU a client, in-process Ray object store; edgebed: netns nodes, "
                   "the model and the updates over TCP on unshaped veth links, a PS barrier"}
    name = f"flower-{clients}clients-{per_round}a-round{f'-parked{parked}' if parked else ''}.json" if per_round \
        else f"flower-{clients}clients.json"
    return save_result(out, out_dir, name, say)
