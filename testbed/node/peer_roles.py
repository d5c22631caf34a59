"""Roles of the decentralized strategies (DLion, Gaia, Ako): no parameter server.

Each worker keeps a replica, receives on its own ROUTER socket and sends to each peer on a
DEALER of its own, so every peer pair is its own TCP flow, shaped by the paths between them
(access links, `links:` pairs, WAN links between sites). What travels on each link is the
strategy's choice (strategies/peer.py); peers.csv records it per step and link.

The `ps` node becomes the run's coordinator and carries no training traffic: it starts the
workers together, stops them (seconds, target accuracy, or when all finished `stop.steps`
iterations) and feeds the evaluator the average of the replicas. Workers hand their replicas
over through the run directory (RUN/.replicas, out of band, like a testbed's monitoring plane)
so that evaluation puts no bytes on the emulated links; a small "progress" message every
`eval_interval` steps tells the coordinator how far each got. With `eval_seconds: T` the
coordinator evaluates every T seconds instead, and workers refresh their replicas every
T / REPLICA_REFRESH seconds so that what it averages is at most that (plus a step) old.

Protocol:
  worker -> coordinator   hello | progress{step, loss} | bye
  coordinator -> worker   go | stop
  worker -> worker        grad{step, loss, cap, seen, batch_size} + payload | weights + model | bye
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
import zmq

from testbed.records import metrics
from testbed.node import transport
from testbed.node.eval_schedule import EvalSchedule
from testbed.node.roles import (EvalFeed, RoleConfig, _model_and_data, _now, _params, _setup_torch,
    send_stop, worker_setup)
from testbed.scenario.schema import Scenario
from testbed.node.wire import Message

REPLICAS = ".replicas"
EWMA = 0.3  # smoothing of the loss and capacity a worker reports to its peers
REPLICA_REFRESH = 4  # with eval_seconds: replica writes per evaluation period


def _write_replica(run_dir: str, node: str, params: dict, step: int) -> None:
    d = Path(run_dir) / REPLICAS
    d.mkdir(exist_ok=True)
    tmp = d / f".{node}.tmp"
    torch.save({"step": step, "params": {k: v.detach().cpu() for k, v in params.items()}}, tmp)
    os.replace(tmp, d / f"{node}.pt")  # readers never see half a file


def _read_replicas(run_dir: str) -> dict[str, dict]:
    out = {}
    for f in sorted((Path(run_dir) / REPLICAS).glob("*.pt")):
        try:
            out[f.stem] = torch.load(f, weights_only=True)
        except Exception:  # being replaced right now: the next snapshot will have it
            continue
    return out


def _smooth(old: Optional[float], new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


# --------------------------------------------------------------------------------------------
# worker


def _replica_schedule(sc: Scenario) -> EvalSchedule:
    """When a worker writes its replica: every eval_interval steps, or often enough for eval_seconds."""
    seconds = sc.workload.eval_seconds
    return EvalSchedule(sc.workload.eval_interval, None if seconds is None else seconds / REPLICA_REFRESH)


def run_peer_worker(cfg: RoleConfig, stop_event) -> None:
    from testbed.strategies import make_strategy
    from testbed.strategies.peer import PeerContext, PeerInfo, apply_payload

    sc = Scenario.model_validate(cfg.scenario)
    _setup_torch(cfg, sc)
    model, ds, device, x, y, batches = worker_setup(cfg, sc)
    n_train = len(ds.train_y)
    strategy = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed)
    peers = {name: PeerInfo(name, info.get("rate_bps"), bool(info.get("same_site", True)))
             for name, info in cfg.peers.items()}
    params = dict(model.named_parameters())
    model_entries = sum(p.numel() for p in params.values())  # what a dense gradient message carries
    zctx = zmq.Context()
    ctl = transport.node_endpoint(zctx, cfg.ps_address, cfg.node, cfg.delay, seed=sc.seed)
    inbox = transport.peer_inbox(zctx, cfg.node, cfg.delay, seed=sc.seed)
    outbox = {p: transport.peer_outbox(zctx, info["address"], cfg.node, cfg.delay) for p, info in cfg.peers.items()}
    log = metrics.open_table(Path(cfg.run_dir), "steps.csv")
    links = metrics.open_table(Path(cfg.run_dir), "peers.csv")
    interval = sc.workload.eval_interval
    replicas = _replica_schedule(sc)
    max_steps = sc.stop.steps
    latest = {p: 0 for p in peers}  # the last step heard from each peer
    gone: set[str] = set()
    ctx = PeerContext(worker=cfg.node, step=0, lr=sc.workload.lr, n_workers=len(cfg.workers), peers=dict(peers),
                      model_params=params, base_batch=sc.workload.batch_size)
    seen = {cfg.node: 0}
    stopped = False
    received = 0

    def lr_now() -> float:
        return strategy.learning_rate(ctx)

    def absorb(msgs) -> None:
        """Apply what peers sent: gradients at once (async), weights by the strategy's merge."""
        nonlocal received
        for sender, msg, nbytes in msgs:
            received += nbytes
            m = msg.meta
            if msg.kind == "grad":
                latest[sender] = max(latest.get(sender, 0), int(m["step"]))
                ctx.losses[sender] = float(m["loss"])
                ctx.capacities[sender] = float(m["cap"])
                ctx.batch_sizes[sender] = int(m["batch_size"])
                seen[sender] = int(m["seen"])
                apply_payload(params, msg.tensors, lr_now() * strategy.weight(m, ctx))
            elif msg.kind == "weights":
                strategy.merge_weights(params, {k: v.to(device) for k, v in msg.tensors.items()}, ctx)
            elif msg.kind == "bye":
                gone.add(sender)
                ctx.peers.pop(sender, None)

    def control() -> None:
        nonlocal stopped
        for _, msg, _ in ctl.recv(0):
            if msg.kind == "stop":
                stopped = True

    def behind() -> bool:
        """Whether a peer this worker must wait for has not reached the step it needs."""
        for p, info in peers.items():
            bound = strategy.wait_bound(info)
            if p not in gone and bound is not None and latest[p] < ctx.step - bound:
                return True
        return False

    try:
        ctl.send(Message("hello"))
        while not stop_event.is_set():  # everyone starts together, as with a PS
            msgs = ctl.recv(0.1)
            if any(m.kind == "stop" for _, m, _ in msgs):
                return
            if any(m.kind == "go" for _, m, _ in msgs):
                break
        compute_avg: Optional[float] = None
        loss_avg: Optional[float] = None
        while not stop_event.is_set() and not stopped and (max_steps is None or ctx.step < max_steps):
            ctx.step += 1
            step = ctx.step
            t_start = time.time()
            size = strategy.batch_size(ctx)
            idx = torch.from_numpy(batches.next(size))
            xb, yb = x[idx], y[idx]
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
            loss.backward()
            grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
            t_computed = time.time()
            compute = t_computed - t_start
            compute_avg = _smooth(compute_avg, compute)
            loss_avg = _smooth(loss_avg, loss.item())
            seen[cfg.node] += len(yb)
            ctx.compute_seconds = compute_avg
            ctx.losses[cfg.node] = loss_avg
            ctx.capacities[cfg.node] = len(yb) / max(compute_avg, 1e-6)
            ctx.batch_sizes[cfg.node] = len(yb)
            ctx.epoch = sum(seen.values()) / n_train
            lr = lr_now()
            meta = {"step": step, "loss": loss_avg, "cap": ctx.capacities[cfg.node], "seen": seen[cfg.node],
                    "batch_size": len(yb)}
            sent = 0
            before = received
            compressed = False
            for p, payload in strategy.outgoing(grads, ctx).items():
                n = outbox[p].send(Message("grad", payload, dict(meta)))
                sent += n
                entries, threshold = strategy.link_log.get(p, (None, None))
                compressed |= entries is not None and entries < model_entries
                links.write(time=_now(cfg), node=cfg.node, peer=p, step=step, kind="grad", bytes=n,
                            entries=entries, threshold=threshold)
            apply_payload(params, grads, lr * strategy.weight(meta, ctx))  # own gradient, at once
            absorb(inbox.recv(0))
            while behind() and not stop_event.is_set() and not stopped:
                absorb(inbox.recv(0.05))
                control()
            for p in strategy.weights_to(ctx):
                if p in outbox and p not in gone:
                    n = outbox[p].send(Message("weights", {k: v.detach().cpu() for k, v in params.items()},
                                               {"step": step}))
                    sent += n
                    links.write(time=_now(cfg), node=cfg.node, peer=p, step=step, kind="weights", bytes=n,
                                entries=sum(v.numel() for v in params.values()))
            control()
            t_done = time.time()
            log.write(time=t_done - cfg.t0, node=cfg.node, step=step, loss=loss.item(), batch_size=len(yb), lr=lr,
                      bytes_sent=sent, bytes_received=received - before, compute_seconds=compute,
                      comm_seconds=t_done - t_computed, model_version=step, compressed=int(compressed))
            if replicas.due(step, _now(cfg)):  # before the progress message: the coordinator may read it
                _write_replica(cfg.run_dir, cfg.node, params, step)
            if step % interval == 0:
                ctl.send(Message("progress", meta={"step": step, "loss": loss_avg}))
        _write_replica(cfg.run_dir, cfg.node, params, ctx.step)  # the final replica, for the final evaluation
    finally:
        for p, ep in outbox.items():
            try:
                ep.send(Message("bye"))
            except zmq.ZMQError:
                pass
        try:
            ctl.send(Message("bye", meta={"step": ctx.step}))
            time.sleep(0.05)
        except zmq.ZMQError:
            pass
        for ep in outbox.values():  # let what is queued for a peer still leave (it was recorded as sent)
            ep.sock.close(linger=2000)
        for ep in [ctl, inbox]:
            ep.close()
        zctx.term()


# --------------------------------------------------------------------------------------------
# coordinator (on the ps node)


def run_coordinator(cfg: RoleConfig, stop_event) -> None:
    sc = Scenario.model_validate(cfg.scenario)
    _setup_torch(cfg, sc)
    model, _ = _model_and_data(sc)
    initial = _params(model)
    zctx = zmq.Context()
    ep = transport.ps_endpoint(zctx, cfg.ps_address, cfg.delay, seed=sc.seed)
    feed = EvalFeed(ep)
    workers = set(cfg.workers)
    joined: set[str] = set()
    left: set[str] = set()
    steps = {w: 0 for w in workers}
    schedule = EvalSchedule(sc.workload.eval_interval, sc.workload.eval_seconds)
    fed: tuple[dict, dict] = ({}, {})  # the replica steps and the meta of the last feed
    started = False
    reason: Optional[str] = None
    start = time.time()

    def mean_step() -> float:
        return sum(steps.values()) / len(steps)

    def snapshot(final: bool = False, again: bool = False) -> None:
        """Queue the average of the replicas (the model the workers agree on) for evaluation. A timed
        feed (`again`) of unchanged replicas is a repeat without tensors and with the last feed's
        version: the evaluator writes its last result again at this time (see roles.run_ps)."""
        nonlocal fed
        reps = _read_replicas(cfg.run_dir)
        key = {w: int(r["step"]) for w, r in reps.items()}
        if again and key == fed[0] and fed[1]:
            feed.add({}, {**fed[1], "time": _now(cfg), "repeat": True})
            return
        if not reps:
            return
        for w, step in key.items():
            steps[w] = max(steps.get(w, 0), step)
        avg = {n: sum(r["params"][n] for r in reps.values()) / len(reps) for n in initial}
        meta = {"version": round(mean_step()), "updates_received": sum(steps.values()),
                "time": _now(cfg), "final": final, "replicas": len(reps), "repeat": False}
        fed = (key, meta)
        feed.add(avg, meta)

    def maybe_snapshot() -> None:
        if schedule.due(mean_step(), _now(cfg)):
            snapshot(again=schedule.timed)

    def serve(msgs) -> None:
        nonlocal reason, started, fed
        for sender, msg, _ in msgs:
            if msg.kind == "hello":
                if sender == "eval":
                    feed.on_ready()
                    meta = {"version": 0, "updates_received": 0, "time": _now(cfg), "final": False, "repeat": False}
                    fed = ({}, meta)  # no replicas yet: the initial model
                    feed.add(initial, meta)
                else:
                    joined.add(sender)
            elif msg.kind == "progress":
                steps[sender] = int(msg.meta["step"])
                maybe_snapshot()
            elif msg.kind == "bye":
                left.add(sender)
                if "step" in msg.meta:
                    steps[sender] = int(msg.meta["step"])
            elif msg.kind == "eval_ready":
                feed.on_ready()
            elif msg.kind == "target_reached":
                reason = reason or "target_accuracy"
        if not started and joined >= workers:
            started = True
            for w in sorted(workers):
                ep.send(Message("go"), w)

    try:
        while reason is None:
            if stop_event.is_set():
                reason = "interrupted"
            elif sc.stop.seconds is not None and time.time() - start >= sc.stop.seconds:
                reason = "seconds"
            elif joined and left >= joined:
                done = sc.stop.steps is not None and all(s >= sc.stop.steps for s in steps.values())
                reason = "steps" if done else "all workers left"
            if reason is not None:
                break
            serve(ep.recv(schedule.wait(_now(cfg), 0.05)))  # wakes for a timed feed
            maybe_snapshot()
            feed.pump()
        send_stop(ep, joined - left, reason)
        # the workers write their final replicas as they stop
        deadline = time.time() + 10
        while left < joined and time.time() < deadline and not stop_event.is_set():
            serve(ep.recv(0.05))
        snapshot(final=True)
        feed.finish(stop_event)
    finally:
        (Path(cfg.run_dir) / "ps.json").write_text(json.dumps({
            "version": max(steps.values()) if steps else 0,
            "updates_received": sum(steps.values()),
            "stop_reason": reason,
            "decentralized": True,
            "ingress_payload_bytes": 0,
            "transport_bytes_sent": ep.bytes_sent,
            "transport_bytes_received": ep.bytes_received,
            "workers_joined": sorted(joined),
        }))
        time.sleep(0.2)
        ep.close()
        zctx.term()
