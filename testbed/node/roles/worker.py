"""A worker of a parameter-server algorithm: trains on its shard (or its stream), and pushes,
votes or steps locally as the strategy says; steps.csv gets a row per step."""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
import zmq

from testbed.errors import RunFailed
from testbed.node import channel, transport
from testbed.node.roles.common import RoleConfig, device_step, load_params, setup_torch, worker_setup
from testbed.node.wire import Message
from testbed.scenario.schema import Scenario
from testbed.strategies import PushMeta, WorkerContext, make_strategy


class Worker:
    def __init__(self, cfg: RoleConfig, stop_event):
        self.cfg, self.stop_event = cfg, stop_event
        self.sc = sc = cfg.scenario_model()
        setup_torch(cfg, sc)
        self.data = worker_setup(cfg, sc)
        self.model = self.data.model
        self.feeder = (start_feeder(cfg, sc, int(self.data.dataset.train_x[0].nbytes))
                       if sc.streaming is not None else None)
        self.strategy = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed)
        self.lr = sc.workload.lr
        self.zctx = zmq.Context()
        self.ep = transport.node_endpoint(self.zctx, cfg.ps_address, cfg.node, cfg.delay, seed=sc.seed)
        self.log = channel.open_table(cfg, "steps.csv")
        self.stream_log = channel.open_table(cfg, "stream.csv") if self.feeder is not None else None
        self.inject, self.own_batch = None, sc.workload.batch_size
        if sc.workload.injection is not None:
            from testbed.node.roles.injection import DataInjection, local_batch

            if self.feeder is None:  # Eq. 3; a stream's batch follows its rate instead
                self.own_batch = local_batch(sc.workload.injection, sc.workload.batch_size, len(cfg.workers))
            self.inject = DataInjection(cfg, sc.workload.injection, sc.seed, self.zctx, self.own_batch)
        self.version = -1
        self.parked = False  # a per-round trainer that was not selected: it ends without a bye
        self.waits = False  # ... or, parked, waits for a round that selects it (the PS said so)
        self.inbox: deque[Message] = deque()  # received, not yet read by wait_reply
        self.crash = random.Random(f"crash-{sc.seed}-{cfg.rank}") if sc.faults.crash_per_push > 0 else None

    def run(self) -> None:
        try:
            self.ep.send(Message("hello"))
            step = 0
            while self.await_round():
                while not self.stop_event.is_set():
                    step += 1
                    if not self.step(step):
                        break
                if not (self.parked and self.waits):  # the run is over for it, or it ends not selected
                    return
        finally:
            self.close()

    def await_round(self) -> bool:
        """Take models until one to train on comes (hello's answer, or a parked trainer's next
        round); False when the run is over for this trainer (stopped, or not selected and not
        asked to wait)."""
        while True:
            reply = self.wait_reply()
            if reply is None or reply.kind == "stop":
                return False
            self.take_model(reply)
            if not self.parked:
                return True
            if not self.waits:
                return False

    def step(self, step: int) -> bool:
        """One training step; False when the run is over for this worker."""
        t_start = time.time()
        xb, yb = self.next_batch(step)
        if xb is None:
            return False
        xb, yb, sent, received = self.mix_injected(step, xb, yb)
        loss, grads = self.compute(xb, yb)
        ctx = WorkerContext(worker=self.cfg.node, rank=self.cfg.rank, step=step, base_version=self.version,
                            lr=self.lr, model_params=dict(self.model.named_parameters()),
                            n_workers=len(self.cfg.workers))
        t_computed = time.time()
        vote = self.strategy.worker_vote(grads, ctx)
        if vote is not None:  # every worker's flag, gathered through the PS, decides this step
            before = self.ep.bytes_received
            sent += self.ep.send(Message("vote", meta={"flag": bool(vote), "step": step}))
            decision = self.wait_reply(("decision",))
            received += self.ep.bytes_received - before
            if decision is None or decision.kind == "stop":
                return False
            ctx.sync = bool(decision.meta["sync"])
        payload = self.strategy.worker_payload(grads, ctx)
        reply = None
        if payload is None:  # the strategy keeps this step local
            self.local_update()
        else:
            before = self.ep.bytes_received
            sent += self.ep.send(Message("push", payload, PushMeta(self.version, step, len(yb), loss).to_wire()))
            reply = self.wait_reply()
            received += self.ep.bytes_received - before
            if self.crash is not None and self.crash.random() < self.sc.faults.crash_per_push:
                request_crash(self.cfg, self.sc, step)
        t_done = time.time()
        self.log.write(time=t_done - self.cfg.t0, node=self.cfg.node, step=step, loss=loss, batch_size=len(yb),
                       lr=self.lr, bytes_sent=sent, bytes_received=received, compute_seconds=t_computed - t_start,
                       comm_seconds=t_done - t_computed, model_version=self.version,
                       compressed=_flag(self.strategy.last_compressed))
        if payload is None:
            return True
        if reply is None or reply.kind == "stop":
            return False
        self.take_model(reply)
        return not self.parked

    def next_batch(self, step: int):
        if self.feeder is None:
            idx = torch.from_numpy(self.data.batches.next(self.own_batch))
            return self.data.x[idx], self.data.y[idx]
        return stream_batch(self.feeder, self.cfg, step, self.stream_log, self.stop_event)

    def mix_injected(self, step: int, xb, yb):
        """Share some of this batch, train on what others shared: (x, y, bytes sent, bytes received)."""
        if self.inject is None:
            return xb, yb, 0, 0
        sent = self.inject.share(step, xb, yb, self.cfg.now())
        xi, yi, received = self.inject.take()
        if xi is not None:
            xb, yb = torch.cat([xb, xi.to(xb.dtype)]), torch.cat([yb, yi.to(yb.dtype)])
        return xb, yb, sent, received

    def compute(self, xb, yb) -> tuple[float, dict]:
        """(loss, gradients) of one batch."""
        device = self.data.device
        with device_step(self.data, self.cfg.node, len(yb)):
            self.model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(xb.to(device, non_blocking=True)), yb.to(device, non_blocking=True))
            loss.backward()
            loss_value = loss.item()
        return loss_value, {n: p.grad for n, p in self.model.named_parameters() if p.grad is not None}

    def local_update(self) -> None:
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
                    p.sub_(p.grad, alpha=self.lr)

    def wait_reply(self, kinds=("model", "stop")) -> Optional[Message]:
        """The next message of `kinds` (or 'stop') from the PS; None when the runner says stop.
        Messages that arrived together wait in `inbox` for the next call: a 'stop' sent right
        after a reply must not be lost with it (the worker would wait for a PS that has stopped)."""
        while not self.stop_event.is_set():
            while self.inbox:
                msg = self.inbox.popleft()
                if msg.kind in kinds or msg.kind == "stop":
                    return msg
            self.inbox.extend(msg for _, msg, _ in self.ep.recv(0.1))
        return None

    def take_model(self, reply: Message) -> None:
        load_params(self.model, reply.tensors)
        self.strategy.worker_on_model(reply.meta)
        self.version = int(reply.meta["version"])
        if self.strategy.per_round:  # a trainer's batches: its device's shard, drawn for this round
            self.data.batches.reseed(self.sc.seed, self.cfg.rank, self.version)
            self.parked = self.strategy.worker_parks(self.version)
            self.waits = self.parked and reply.meta.get("park") is True

    def close(self) -> None:
        if self.feeder is not None:
            self.feeder.stop()
            self.feeder.join(timeout=5)
        if self.inject is not None:
            self.inject.close()
        try:
            if not self.parked:  # a parked trainer's device stays in the fleet
                self.ep.send(Message("bye"))
                time.sleep(0.05)
        except zmq.ZMQError:
            pass
        self.ep.close()
        self.zctx.term()


def run_worker(cfg: RoleConfig, stop_event) -> None:
    Worker(cfg, stop_event).run()


def _flag(v: Optional[bool]) -> Optional[int]:
    return None if v is None else int(v)


def request_crash(cfg: RoleConfig, sc: Scenario, step: int) -> None:
    """A fail-stop crash drawn after a push (faults.crash_per_push): the runner freezes (or kills) this
    node through the same request path as `edgebed pause`, and records it in events.csv."""
    rid = f"{time.time():.6f}-crash-{cfg.node}"
    channel.send_json(cfg.records, "request", {
        "id": rid, "node": cfg.node, "action": sc.faults.crash_action, "fields": {},
        "source": f"crash after push at step {step} (p={sc.faults.crash_per_push:g})"})
    time.sleep(5.0)  # frozen or killed meanwhile; should the runner be gone, go on


def start_feeder(cfg: RoleConfig, sc: Scenario, sample_bytes: int):
    """The device's stream: a consumer thread filling a persistence or truncation buffer."""
    from testbed.data.streaming.buffer import FixedBatch, StreamBuffer, parse_batch_policy
    from testbed.data.streaming.consumer import StreamFeeder
    from testbed.data.streaming.rates import RateSchedule

    st = sc.streaming
    sched = cfg.stream.schedules[cfg.node]
    schedule = RateSchedule(sched.times, sched.rates)
    buf = StreamBuffer(st.buffer, schedule.rate_at(0.0), cap_samples=st.buffer_cap, sample_bytes_hint=sample_bytes)
    table = channel.open_table(cfg, "buffer.csv")
    policy = FixedBatch(sc.workload.batch_size) if st.batch == "fixed" else parse_batch_policy(st.batch)
    feeder = StreamFeeder(cfg.stream.bootstrap, cfg.stream.topics[cfg.node], buf, cfg.t0,
                          on_snapshot=lambda row: table.write(node=cfg.node, **row), schedule=schedule,
                          batch_policy=policy, dilation=cfg.dilation)
    feeder.start()
    return feeder


def stream_batch(feeder, cfg: RoleConfig, step: int, stream_log, stop_event):
    """The next batch from the stream buffer: wait for it (the streaming latency), record the wait."""
    want, at_least = feeder.next_take()  # follows the device's rate (constant, or a trace)
    samples, waited = feeder.take(want, at_least, stop_event)
    if feeder.error:
        raise RunFailed(f"stream of {cfg.node}: {feeder.error}")
    if not samples:
        return None, None
    xb = torch.from_numpy(np.stack([s[0] for s in samples]).astype(np.float32, copy=False))
    yb = torch.tensor([s[1] for s in samples], dtype=torch.int64)
    stream_log.write(time=feeder.now(), node=cfg.node, step=step, wait_seconds=waited, batch_size=len(samples),
                     buffered=feeder.left_after_take)
    return xb, yb
