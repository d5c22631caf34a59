"""summary.json: how a run ended and what it reached, read from its records."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from testbed.plan.cluster import ClusterSpec
from testbed.run.dilation import enough_dilation, host_cores
from testbed.scenario.dilation import factor
from testbed.scenario.schema import Scenario


def ps_info(run_dir: Path) -> dict:
    """RUN/ps.json, what the parameter server (or coordinator) wrote at its end; {} when missing."""
    try:
        return json.loads((run_dir / "ps.json").read_text())
    except (OSError, ValueError):
        return {}


def summarize(sc: Scenario, spec: Optional[ClusterSpec], run_dir: Path, counters: dict, *, t0: float, status: str,
              reason: str) -> dict:
    """The run's summary from its records, ps.json and the last counters (`_first_step_time`: for
    the runner's startup_seconds, not kept). Its times are the world's (a dilated run's wall / k),
    but `wall_seconds`."""
    from testbed.records.reader import load_run

    k = factor(sc)
    rec = load_run(run_dir)
    ev = rec.evals.sort_values("step") if len(rec.evals) else rec.evals
    ps = ps_info(run_dir)
    target = sc.stop.target_accuracy
    ttt = None
    if target is not None and len(ev):
        hit = ev[ev["accuracy"] >= target]
        ttt = float(hit["time"].min()) if len(hit) else None
    return {
        "status": status,
        "reason": reason,
        "final_accuracy": float(ev["accuracy"].iloc[-1]) if len(ev) else None,
        "best_accuracy": float(ev["accuracy"].max()) if len(ev) else None,
        "time_to_target_seconds": ttt,
        "steps": ps.get("version"),
        "updates_received": ps.get("updates_received"),
        "worker_steps": int(len(rec.steps)),
        "_first_step_time": float(rec.steps["time"].min()) if len(rec.steps) else None,
        "wall_seconds": round(time.time() - t0, 3),
        "seconds": round((time.time() - t0) / k, 3),  # the world's: wall / k
        "dilation": k,
        "ps_ingress_bytes": counters.get("ps", {}).get("down_bytes"),  # wire bytes into the PS
        "ps_ingress_payload_bytes": ps.get("ingress_payload_bytes"),
        # messages the PS (or coordinator) dropped unread or refused: malformed, or from no node of the run
        "messages_dropped": sum((ps.get("messages_dropped") or {}).values()),
        "ps_egress_bytes": counters.get("ps", {}).get("up_bytes"),
        # wire bytes out of all workers (a decentralized run's whole exchange)
        "worker_egress_bytes": sum(counters.get(n.name, {}).get("up_bytes", 0) for n in spec.workers) if spec else None,
        # the evaluator's longest backlog (s; a stop on target comes this late) and the snapshots
        # skipped at the end to keep the final model's evaluation within its limit
        "evaluator_lag_seconds": _world(ps.get("evaluator_lag_seconds"), k),
        "evaluations_skipped": ps.get("evaluations_skipped"),
        "decentralized": bool(ps.get("decentralized", False)),
        "workers": len(spec.workers) if spec else sc.n_workers,
        "algorithm": sc.algorithm.name,
        "fidelity": fidelity_of(run_dir, k, float(rec.steps["time"].min()) if len(rec.steps) else None),
        "energy": energy_of(run_dir),
        "run_dir": str(run_dir),
    }


def _world(seconds, k: float):
    return seconds / k if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else seconds


def fidelity_of(run_dir: Path, dilation: float = 1.0, first_step: Optional[float] = None) -> dict:
    """summary.json's `fidelity` (records.fidelity's rule over resources.csv, judged from the first
    training step on); fidelity.csv beside it; the k that would have been enough (run.dilation)."""
    from testbed.records import fidelity

    intervals = fidelity.assess_run(run_dir, dilation, first_step)
    fidelity.write_table(run_dir, intervals)
    out = fidelity.summarize(intervals)
    out["dilation"] = enough_dilation(intervals, dilation, host_cores(run_dir))
    return out


def energy_of(run_dir: Path) -> dict:
    """summary.json's `energy` (records.energy: the device nodes' joules); energy.csv beside it."""
    from testbed.records import energy

    return energy.assess_run(run_dir)


def control_drops(hub) -> dict[str, int]:
    """What the control channel dropped, by reason: the hub's, and each supervisor's as it last
    said ("w1 supervisor: not JSON")."""
    out = dict(hub.drops)
    for node, counts in sorted(hub.node_drops.items()):
        out.update({f"{node} supervisor: {reason}": n for reason, n in counts.items()})
    return out
