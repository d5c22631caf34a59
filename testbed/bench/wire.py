"""Wire bytes per strategy: what a strategy puts on its access links against the payload its
records count."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import run_for_records, save_result

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
    return save_result(out, out_dir, f"wire-{algorithm}.json", say)
