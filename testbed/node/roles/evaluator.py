"""The evaluator: tests each model the PS (or the coordinator) feeds it; eval.csv gets a row each."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
import zmq

from testbed.node import channel, transport
from testbed.node.gpu import pick_device
from testbed.node.roles.common import RoleConfig, load_params, model_and_data, setup_torch
from testbed.node.wire import Message


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 500) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `model` on (x, y)."""
    model.eval()
    correct = 0
    total_loss = 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = model(x[i:i + batch])
            total_loss += float(F.cross_entropy(out, y[i:i + batch], reduction="sum"))
            correct += int((out.argmax(1) == y[i:i + batch]).sum())
    model.train()
    return correct / len(x), total_loss / len(x)


def _evaluate_message(model: torch.nn.Module, x, y, msg: Message,
                      last: Optional[tuple[int, float, float]]) -> Optional[tuple[int, float, float]]:
    """(version, accuracy, loss) of an `evaluate` message's model. A repeat (the PS's model has not
    changed since its last feed) reuses the last result, which is that same model's."""
    version = int(msg.meta["version"])
    if msg.meta.get("repeat"):
        return last if last is not None and last[0] == version else None
    load_params(model, msg.tensors)
    return (version, *evaluate(model, x, y))


def run_evaluator(cfg: RoleConfig, stop_event) -> None:
    sc = cfg.scenario_model()
    setup_torch(cfg, sc)
    model, ds = model_and_data(sc)
    device = pick_device(cfg.node)
    model.to(device)
    n = len(ds.test_y) if sc.workload.eval_samples is None else min(len(ds.test_y), sc.workload.eval_samples)
    x = torch.from_numpy(np.array(ds.test_x[:n])).to(device)  # a writable copy of the shared, read-only set
    y = torch.from_numpy(np.array(ds.test_y[:n])).to(device)
    zctx = zmq.Context()
    ep = transport.node_endpoint(zctx, cfg.ps_address, "eval", cfg.delay, seed=sc.seed)
    log = channel.open_table(cfg, "eval.csv")
    target = sc.stop.target_accuracy
    last: Optional[tuple[int, float, float]] = None  # (version, accuracy, loss) of the last evaluation
    try:
        ep.send(Message("hello"))
        while not stop_event.is_set():
            msgs = ep.recv(0.2)
            if any(m.kind == "stop" for _, m, _ in msgs):
                break
            for _, msg, _ in msgs:
                if msg.kind != "evaluate":
                    continue
                last = _evaluate_message(model, x, y, msg, last)
                if last is not None:  # None: a repeat this evaluator has no result for (it restarted)
                    _, acc, loss = last
                    log.write(time=float(msg.meta["time"]), step=int(msg.meta["version"]),
                              updates_received=int(msg.meta["updates_received"]), accuracy=acc, loss=loss,
                              samples=n, evaluated_at=cfg.now(), node=cfg.node)
                    if target is not None and acc >= target:
                        ep.send(Message("target_reached", meta={"accuracy": acc, "version": msg.meta["version"]}))
                ep.send(Message("eval_ready"))
    finally:
        ep.close()
        zctx.term()
