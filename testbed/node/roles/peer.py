"""A worker of a decentralized strategy (DLion, Gaia, Ako): no parameter server.

Each worker keeps a replica, receives on its own ROUTER socket and sends to each peer on a
DEALER of its own, so every peer pair is its own TCP flow, shaped by the paths between them
(access links, `links:` pairs, WAN links between sites). What travels on each link is the
strategy's choice (strategies/peer.py); peers.csv records it per step and link. The coordinator
(coordinator.py) starts and stops the workers; they hand it their replicas (replicas.py), and a
small "progress" message every `eval_interval` steps tells it how far each got.

Protocol:
  worker -> coordinator   hello | progress{step, loss} | bye
  coordinator -> worker   go | stop
  worker -> worker        grad{step, loss, cap, seen, batch_size} + payload | weights + model | bye
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.nn.functional as F
import zmq

from testbed.node import channel, transport, untrusted
from testbed.node.roles.common import RoleConfig, device_step, frame_limit, setup_torch, worker_setup
from testbed.node.roles.replicas import replica_schedule, send_replica
from testbed.node.wire import Message
from testbed.strategies import make_strategy
from testbed.strategies.peer import PeerContext, PeerInfo, apply_payload

EWMA = 0.3  # smoothing of the loss and capacity a worker reports to its peers


def smooth(old: Optional[float], new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


class PeerWorker:
    def __init__(self, cfg: RoleConfig, stop_event):
        self.cfg, self.stop_event = cfg, stop_event
        self.sc = sc = cfg.scenario_model()
        setup_torch(cfg, sc)
        self.data = worker_setup(cfg, sc)
        self.strategy = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed)
        self.peers = {name: PeerInfo(name, link.rate_bps, link.same_site) for name, link in cfg.peers.items()}
        self.params = dict(self.data.model.named_parameters())
        self.model_entries = sum(p.numel() for p in self.params.values())  # what a dense gradient carries
        self.zctx = zmq.Context()
        self.ctl = transport.node_endpoint(self.zctx, cfg.ps_address, cfg.node, cfg.delay, seed=sc.seed)
        self.inbox = transport.peer_inbox(self.zctx, cfg.node, cfg.delay, seed=sc.seed,
                                          max_frame=frame_limit(self.data.model))
        self.inbox.senders = transport.known_senders(cfg.peers, cfg.addresses)
        self.outbox = {p: transport.peer_outbox(self.zctx, link.address, cfg.node, cfg.delay)
                       for p, link in cfg.peers.items()}
        self.log = channel.open_table(cfg, "steps.csv")
        self.links = channel.open_table(cfg, "peers.csv")
        self.replicas = replica_schedule(sc)
        self.latest = {p: 0 for p in self.peers}  # the last step heard from each peer
        self.gone: set[str] = set()
        self.ctx = PeerContext(worker=cfg.node, step=0, lr=sc.workload.lr, n_workers=len(cfg.workers),
                               peers=dict(self.peers), model_params=self.params, base_batch=sc.workload.batch_size)
        self.seen = {cfg.node: 0}  # samples each worker has trained on (DLion's epoch count)
        self.stopped = False
        self.received = 0
        self.compute_avg: Optional[float] = None
        self.loss_avg: Optional[float] = None

    def run(self) -> None:
        max_steps = self.sc.stop.steps
        try:
            if not self.wait_for_go():
                return
            while (not self.stop_event.is_set() and not self.stopped
                   and (max_steps is None or self.ctx.step < max_steps)):
                self.step()
            send_replica(self.cfg, self.params, self.ctx.step)  # for the final evaluation
        finally:
            self.close()

    def wait_for_go(self) -> bool:
        """Everyone starts together, as with a PS; False when the run stops first."""
        self.ctl.send(Message("hello"))
        while not self.stop_event.is_set():
            msgs = self.ctl.recv(0.1)
            if any(m.kind == "stop" for _, m, _ in msgs):
                return False
            if any(m.kind == "go" for _, m, _ in msgs):
                return True
        return True  # the loop will not start: the stop event is set

    def step(self) -> None:
        cfg, ctx, strategy = self.cfg, self.ctx, self.strategy
        ctx.step += 1
        step = ctx.step
        t_start = time.time()
        loss, grads, batch = self.compute(strategy.batch_size(ctx))
        t_computed = time.time()
        self.observe(t_computed - t_start, loss, batch)
        lr = strategy.learning_rate(ctx)
        meta = {"step": step, "loss": self.loss_avg, "cap": ctx.capacities[cfg.node], "seen": self.seen[cfg.node],
                "batch_size": batch}
        before = self.received
        sent, compressed = self.send_gradients(grads, meta)
        apply_payload(self.params, grads, lr * strategy.weight(meta, ctx))  # own gradient, at once
        self.absorb(self.inbox.recv(0))
        while self.behind() and not self.stop_event.is_set() and not self.stopped:
            self.absorb(self.inbox.recv(0.05))
            self.control()
        sent += self.send_weights()
        self.control()
        t_done = time.time()
        self.log.write(time=t_done - cfg.t0, node=cfg.node, step=step, loss=loss, batch_size=batch, lr=lr,
                       bytes_sent=sent, bytes_received=self.received - before, compute_seconds=t_computed - t_start,
                       comm_seconds=t_done - t_computed, model_version=step, compressed=int(compressed))
        if self.replicas.due(step, cfg.now()):  # before the progress message: the coordinator may read it
            send_replica(cfg, self.params, step)
        if step % self.sc.workload.eval_interval == 0:
            self.ctl.send(Message("progress", meta={"step": step, "loss": self.loss_avg,
                                                    "dropped": dict(self.inbox.dropped)}))

    def compute(self, size: int) -> tuple[float, dict, int]:
        """(loss, gradients on the CPU, batch size) of one batch of `size`."""
        d = self.data
        idx = torch.from_numpy(d.batches.next(size))
        xb, yb = d.x[idx], d.y[idx]
        with device_step(d, self.cfg.node, len(yb)):
            d.model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(d.model(xb.to(d.device)), yb.to(d.device))
            loss.backward()
            loss_value = loss.item()
        grads = {n: p.grad.detach().cpu() for n, p in d.model.named_parameters() if p.grad is not None}
        return loss_value, grads, len(yb)

    def observe(self, compute: float, loss: float, batch: int) -> None:
        """What this worker tells its peers about itself: smoothed loss and capacity, samples seen."""
        ctx, node = self.ctx, self.cfg.node
        self.compute_avg = smooth(self.compute_avg, compute)
        self.loss_avg = smooth(self.loss_avg, loss)
        self.seen[node] += batch
        ctx.compute_seconds = self.compute_avg
        ctx.losses[node] = self.loss_avg
        ctx.capacities[node] = batch / max(self.compute_avg, 1e-6)
        ctx.batch_sizes[node] = batch
        ctx.epoch = sum(self.seen.values()) / len(self.data.dataset.train_y)

    def send_gradients(self, grads: dict, meta: dict) -> tuple[int, bool]:
        """Each peer's share of this step's gradient: (bytes sent, whether any was compressed)."""
        sent, compressed = 0, False
        for p, payload in self.strategy.outgoing(grads, self.ctx).items():
            n = self.outbox[p].send(Message("grad", payload, dict(meta)))
            sent += n
            entries, threshold = self.strategy.link_log.get(p, (None, None))
            compressed |= entries is not None and entries < self.model_entries
            self.links.write(time=self.cfg.now(), node=self.cfg.node, peer=p, step=meta["step"], kind="grad",
                             bytes=n, entries=entries, threshold=threshold)
        return sent, compressed

    def send_weights(self) -> int:
        sent = 0
        for p in self.strategy.weights_to(self.ctx):
            if p in self.outbox and p not in self.gone:
                n = self.outbox[p].send(Message("weights", {k: v.detach().cpu() for k, v in self.params.items()},
                                                {"step": self.ctx.step}))
                sent += n
                self.links.write(time=self.cfg.now(), node=self.cfg.node, peer=p, step=self.ctx.step,
                                 kind="weights", bytes=n, entries=sum(v.numel() for v in self.params.values()))
        return sent

    def absorb(self, msgs) -> None:
        """Apply what peers sent: gradients at once (async), weights by the strategy's merge. A
        malformed message is dropped and counted (a peer's bytes never end this worker)."""
        for sender, msg, nbytes in msgs:
            self.received += nbytes
            try:
                self.take(sender, msg)
            except (KeyError, ValueError, TypeError, IndexError, RuntimeError, OverflowError) as e:
                self.inbox.dropped.add("refused", f"{msg.kind[:20]} from {sender}: {type(e).__name__}")
            except Exception as e:  # nor does a handler's error: that message is dropped, and counted
                self.inbox.dropped.add(untrusted.error_reason(e), f"{msg.kind[:20]} from {sender}: {e}")

    def take(self, sender: str, msg: Message) -> None:
        ctx, m = self.ctx, msg.meta
        if msg.kind == "grad":
            self.latest[sender] = max(self.latest.get(sender, 0), int(m["step"]))
            if m["loss"] is not None:  # (a peer whose loss is not a number sends null)
                ctx.losses[sender] = float(m["loss"])
            ctx.capacities[sender] = float(m["cap"])
            ctx.batch_sizes[sender] = int(m["batch_size"])
            self.seen[sender] = int(m["seen"])
            apply_payload(self.params, msg.tensors, self.strategy.learning_rate(ctx) * self.strategy.weight(m, ctx))
        elif msg.kind == "weights":
            self.strategy.merge_weights(self.params, {k: v.to(self.data.device) for k, v in msg.tensors.items()},
                                        ctx)
        elif msg.kind == "bye":
            self.gone.add(sender)
            ctx.peers.pop(sender, None)

    def control(self) -> None:
        for _, msg, _ in self.ctl.recv(0):
            if msg.kind == "stop":
                self.stopped = True

    def behind(self) -> bool:
        """Whether a peer this worker must wait for has not reached the step it needs."""
        for p, info in self.peers.items():
            bound = self.strategy.wait_bound(info)
            if p not in self.gone and bound is not None and self.latest[p] < self.ctx.step - bound:
                return True
        return False

    def close(self) -> None:
        for ep in self.outbox.values():
            try:
                ep.send(Message("bye"))
            except zmq.ZMQError:
                pass
        try:
            self.ctl.send(Message("bye", meta={"step": self.ctx.step, "dropped": dict(self.inbox.dropped)}))
            time.sleep(0.05)
        except zmq.ZMQError:
            pass
        for ep in self.outbox.values():  # let what is queued for a peer still leave (it was recorded as sent)
            ep.sock.close(linger=2000)
        for ep in [self.ctl, self.inbox]:
            ep.close()
        self.zctx.term()


def run_peer_worker(cfg: RoleConfig, stop_event) -> None:
    PeerWorker(cfg, stop_event).run()
