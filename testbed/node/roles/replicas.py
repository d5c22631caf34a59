"""How decentralized workers hand their replicas to the coordinator for evaluation: through the
run directory (RUN/.replicas, out of band like a testbed's monitoring plane), so that evaluation
puts no bytes on the emulated links."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from testbed.node.eval_schedule import EvalSchedule
from testbed.scenario.schema import Scenario

REPLICAS = ".replicas"
REPLICA_REFRESH = 4  # with eval_seconds: replica writes per evaluation period


def write_replica(run_dir: str, node: str, params: dict, step: int) -> None:
    d = Path(run_dir) / REPLICAS
    d.mkdir(exist_ok=True)
    tmp = d / f".{node}.tmp"
    torch.save({"step": step, "params": {k: v.detach().cpu() for k, v in params.items()}}, tmp)
    os.replace(tmp, d / f"{node}.pt")  # readers never see half a file


def read_replicas(run_dir: str) -> dict[str, dict]:
    out = {}
    for f in sorted((Path(run_dir) / REPLICAS).glob("*.pt")):
        try:
            out[f.stem] = torch.load(f, weights_only=True)
        except Exception:  # being replaced right now: the next snapshot will have it
            continue
    return out


def replica_schedule(sc: Scenario) -> EvalSchedule:
    """When a worker writes its replica: every eval_interval steps, or often enough for eval_seconds."""
    seconds = sc.workload.eval_seconds
    return EvalSchedule(sc.workload.eval_interval, None if seconds is None else seconds / REPLICA_REFRESH)
