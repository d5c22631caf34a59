"""The training roles that run inside the nodes: parameter server, worker, evaluator.

Each is a plain function started by a runtime inside its node (namespace + cgroup).
They talk only through transport.py and write only through metrics.py.

Protocol (every message is a wire.Message):
  worker -> ps   hello | push{base_version, step} + update tensors | bye
  ps -> worker   model{version} + parameter tensors | stop
  eval -> ps     hello | eval_ready | target_reached{accuracy, version}
  ps -> eval     evaluate{version, updates_received, time, final, repeat} + parameters | stop
                 (repeat: the model of the previous evaluate, unchanged: no parameters)
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
import zmq

from testbed.records import metrics
from testbed.node import transport
from testbed.node.eval_schedule import EvalSchedule
from testbed.scenario.schema import Scenario
from testbed.node.wire import Message


@dataclass
class RoleConfig:
    """Everything a role needs, picklable (it crosses the forkserver)."""

    node: str
    role: str
    rank: int
    run_dir: str
    t0: float  # wall-clock start of the run; record times are time.time() - t0
    scenario: dict
    ps_address: str
    threads: int
    delay: transport.DelaySpec = field(default_factory=transport.DelaySpec)
    workers: list[str] = field(default_factory=list)
    # Decentralized strategies: every other worker -> {address, rate_bps, same_site}
    peers: dict = field(default_factory=dict)
    # Streaming (ScaDLES): bootstrap, per-worker topic and rate, the broker's ready file.
    stream: dict = field(default_factory=dict)


def _setup_torch(cfg: RoleConfig, sc: Scenario) -> None:
    torch.set_num_threads(cfg.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(sc.seed)


def _model_and_data(sc: Scenario, *, need_data: bool = True):
    from testbed.data.datasets import shared_dataset
    from testbed.data.models import build_model

    ds = shared_dataset(sc.workload.dataset, seed=sc.seed, test_size=sc.workload.test_size)
    torch.manual_seed(sc.seed)  # identical initial model everywhere
    model = build_model(sc.workload.model, tuple(ds.input_shape), ds.num_classes)
    return model, ds


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _load(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in tensors:
                p.copy_(tensors[n])


def _device() -> torch.device:
    """CUDA when the node sees a GPU (a `gpus:` profile in the docker runtime), else CPU."""
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        print(f"training on {torch.cuda.get_device_name(dev)}", flush=True)
        return dev
    return torch.device("cpu")


def _now(cfg: RoleConfig) -> float:
    return time.time() - cfg.t0


# --------------------------------------------------------------------------------------------
# parameter server


def send_stop(ep: transport.Endpoint, workers, reason: Optional[str]) -> None:
    for w in sorted(workers):
        try:
            ep.send(Message("stop", meta={"reason": reason}), w)
        except zmq.ZMQError:  # already gone
            pass


class EvalFeed:
    """Model snapshots for the evaluator node, sent one at a time, each when it is ready."""

    def __init__(self, ep: transport.Endpoint):
        self.ep = ep
        self.queue: deque = deque()
        self.ready = False
        self.sent_at: Optional[float] = None
        self.longest = 0.0  # s: the longest evaluation so far (bounds the wait for a dead evaluator)

    def add(self, params: dict, meta: dict) -> None:
        self.queue.append((params, meta))

    def on_ready(self) -> None:
        if self.sent_at is not None:
            self.longest = max(self.longest, time.time() - self.sent_at)
            self.sent_at = None
        self.ready = True

    def pump(self) -> None:
        if self.ready and self.queue:
            params, meta = self.queue.popleft()
            self.ep.send(Message("evaluate", params, meta), "eval")
            self.ready = False
            self.sent_at = time.time()

    def finish(self, stop_event, limit: float = 120.0) -> None:
        """Evaluate what is queued (the final model last), then stop the evaluator. An evaluator
        silent for 4x its longest evaluation (20 s at least) is taken for dead (killed, frozen)."""
        deadline = time.time() + limit
        while (self.queue or not self.ready) and time.time() < deadline and not stop_event.is_set():
            self.pump()
            for _, msg, _ in self.ep.recv(0.05):
                if msg.kind == "eval_ready":
                    self.on_ready()
            if self.sent_at is not None and time.time() - self.sent_at > max(20.0, 4 * self.longest):
                print("evaluator silent: the final evaluation is skipped", flush=True)
                break
        try:
            self.ep.send(Message("stop"), "eval")
        except zmq.ZMQError:
            pass


def run_ps(cfg: RoleConfig, stop_event) -> None:
    from testbed.strategies import ServerState, get_strategy_class, make_strategy

    sc = Scenario.model_validate(cfg.scenario)
    if get_strategy_class(sc.algorithm.name).decentralized:
        from testbed.node.peer_roles import run_coordinator

        return run_coordinator(cfg, stop_event)
    _setup_torch(cfg, sc)
    model, _ = _model_and_data(sc)
    server = ServerState(params=_params(model), lr=sc.workload.lr, n_workers=len(cfg.workers),
                         workers=list(cfg.workers))
    strategy = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed)
    zctx = zmq.Context()
    ep = transport.ps_endpoint(zctx, cfg.ps_address, cfg.delay, seed=sc.seed)
    log = metrics.open_table(Path(cfg.run_dir), "server.csv")
    schedule = EvalSchedule(sc.workload.eval_interval, sc.workload.eval_seconds)
    feed = EvalFeed(ep)
    last_eval_version = -1
    joined: set[str] = set()
    left: set[str] = set()
    reason: Optional[str] = None
    ingress_payload = 0
    start = time.time()

    events = metrics.open_table(Path(cfg.run_dir), "events.csv")
    faults = sc.faults
    heard: dict[str, float] = {}  # when each worker last sent anything
    waiting: set[str] = set()  # workers that pushed or voted and wait for the PS's answer
    lost_pending: list[tuple[str, str]] = []

    def send(msg: Message, to: str) -> None:
        try:
            ep.send(msg, to)
            if to in waiting:  # it has work again: its silence counts from now
                waiting.discard(to)
                heard[to] = time.time()
        except zmq.ZMQError:  # its connection is gone (killed, crashed): it is lost
            lost_pending.append((to, "unreachable"))

    def send_model(to: str) -> None:
        send(Message("model", server.params, {"version": server.version,
                                              **strategy.server_reply_meta(server, to)}), to)

    def lose(w: str, why: str) -> None:
        """A worker stopped answering: go on without it (or stop), and say so in events.csv."""
        nonlocal reason
        if w in left or w not in joined:
            return
        events.write(time=_now(cfg), target=w, action="lost", detail=f"{why}; {faults.on_worker_loss}")
        if faults.on_worker_loss == "stop":
            reason = reason or f"worker {w} lost ({why})"
            return
        left.add(w)
        waiting.discard(w)
        for x in strategy.server_on_leave(server, w):
            send_model(x)
        tell(strategy.server_on_vote(server, None, False))

    def rejoin(w: str, why: str) -> None:
        left.discard(w)
        strategy.server_on_join(server, w)
        events.write(time=_now(cfg), target=w, action="rejoined", detail=f"{why}; model version {server.version}")

    held: set[str] = set()  # restarted workers waiting for the end of the current round

    def admit() -> None:
        if held and not strategy.round_open():
            for w in sorted(held):
                rejoin(w, "restarted")
                send_model(w)
            held.clear()

    def check_lost() -> None:
        while lost_pending:
            lose(*lost_pending.pop(0))
        if not strategy.synchronous or faults.worker_timeout is None:
            return
        now = time.time()
        for w in sorted(joined - left - waiting):
            if now - heard.get(w, now) > faults.worker_timeout:
                lose(w, f"silent for {faults.worker_timeout:g} s while the others waited")

    def snapshot(final: bool = False, again: bool = False) -> None:
        """Queue the model for the evaluator, once per version. A timed feed (`again`) of an unchanged
        version is queued as a repeat without tensors: the evaluator writes the last result again at
        this time, so eval.csv keeps a row every eval_seconds without re-sending or re-evaluating."""
        nonlocal last_eval_version
        repeat = server.version == last_eval_version
        if repeat and not again:
            return
        last_eval_version = server.version
        feed.add({} if repeat else {k: v.clone() for k, v in server.params.items()},
                 {"version": server.version, "updates_received": server.updates_received,
                  "time": _now(cfg), "final": final, "repeat": repeat})

    def maybe_snapshot() -> None:
        if schedule.due(server.version, _now(cfg)):
            snapshot(again=schedule.timed)

    def tell(result) -> None:
        """Send a completed vote's outcome (SelSync's all-gathered flags) to the voters."""
        if result is not None:
            voters, outcome = result
            for w in voters:
                send(Message("decision", meta={"sync": outcome, "version": server.version}), w)

    def serve(msgs) -> None:
        nonlocal reason, ingress_payload
        for sender, msg, nbytes in msgs:
            if sender != "eval":
                heard[sender] = time.time()
            if msg.kind == "hello":
                if sender == "eval":
                    feed.on_ready()
                    if server.version == 0:
                        snapshot()  # accuracy of the initial model: the curves start at step 0
                elif sender in joined:  # a restarted worker: what it had pending died with it
                    if sender not in left:
                        left.add(sender)
                        for x in strategy.server_on_leave(server, sender):
                            send_model(x)
                        tell(strategy.server_on_vote(server, None, False))
                    held.add(sender)  # admitted between rounds (admit())
                else:
                    joined.add(sender)
                    send_model(sender)
                continue
            if sender in left and sender in joined and msg.kind in ("push", "vote"):
                rejoin(sender, "answered again")  # it was lost (frozen, cut off) and is back
            if msg.kind == "push":
                if reason is not None:
                    continue
                ingress_payload += nbytes
                server.updates_received += 1
                waiting.add(sender)
                before = len(server.log)
                server.push_meta = msg.meta
                answer = strategy.server_on_push(server, sender, msg.tensors, int(msg.meta["base_version"]))
                for w, staleness, lr in server.log[before:]:
                    log.write(time=_now(cfg), version=server.version, worker=w, staleness=staleness, lr=lr,
                              payload_bytes=nbytes if w == sender else None)
                del server.log[:]
                for w in answer:
                    send_model(w)
                maybe_snapshot()
            elif msg.kind == "eval_ready":
                feed.on_ready()
            elif msg.kind == "target_reached":
                reason = reason or "target_accuracy"
            elif msg.kind == "vote":
                waiting.add(sender)
                tell(strategy.server_on_vote(server, sender, bool(msg.meta["flag"])))
            elif msg.kind == "bye":
                left.add(sender)
                waiting.discard(sender)
                for w in strategy.server_on_leave(server, sender):
                    send_model(w)
                tell(strategy.server_on_vote(server, None, False))  # a vote may now be complete

    try:
        while reason is None:
            if stop_event.is_set():
                reason = "interrupted"
                break
            if sc.stop.steps is not None and server.version >= sc.stop.steps:
                reason = "steps"
                break
            if sc.stop.seconds is not None and time.time() - start >= sc.stop.seconds:
                reason = "seconds"
                break
            if joined and left >= joined:
                reason = "all workers left"
                break
            serve(ep.recv(schedule.wait(_now(cfg), 0.05)))  # wakes for a timed feed
            maybe_snapshot()
            check_lost()
            admit()
            feed.pump()
        # Tell workers first (they stop computing), then let the evaluator finish.
        send_stop(ep, joined - left, reason)
        snapshot(final=True)
        feed.finish(stop_event)
    finally:
        (Path(cfg.run_dir) / "ps.json").write_text(json.dumps({
            "version": server.version,
            "updates_received": server.updates_received,
            "stop_reason": reason,
            "ingress_payload_bytes": ingress_payload,
            "transport_bytes_sent": ep.bytes_sent,
            "transport_bytes_received": ep.bytes_received,
            "workers_joined": sorted(joined),
            "strategy": strategy.report(),
        }, default=str))
        time.sleep(0.2)  # let the last stop messages leave
        ep.close()
        zctx.term()


# --------------------------------------------------------------------------------------------
# worker


class _Batches:
    """Draw batches from the worker's samples, reshuffled every epoch. With `chunks` (sizes of
    consecutive runs, SelDP), each run is shuffled on its own and the runs keep their order."""

    def __init__(self, n: int, batch: int, seed: int, chunks: Optional[list[int]] = None):
        self.n, self.batch = n, batch
        self.chunks = chunks or [n]
        self.rng = np.random.default_rng(seed)
        self.order = self._epoch()
        self.pos = 0

    def _epoch(self) -> np.ndarray:
        starts = np.cumsum([0] + self.chunks[:-1])
        return np.concatenate([s + self.rng.permutation(c) for s, c in zip(starts, self.chunks)])

    def next(self, size: Optional[int] = None) -> np.ndarray:
        out = []
        need = min(self.batch if size is None else size, self.n)
        while need:
            if self.pos >= self.n:
                self.order = self._epoch()
                self.pos = 0
            take = self.order[self.pos:self.pos + need]
            self.pos += len(take)
            need -= len(take)
            out.append(take)
        return np.concatenate(out)


def _crash(cfg: RoleConfig, sc: Scenario, step: int) -> None:
    """A fail-stop crash drawn after a push (faults.crash_per_push): the runner freezes (or kills) this
    node through the same request path as `edgebed pause`, and records it in events.csv."""
    from testbed.run.timeline import CONTROL_DIR

    control = Path(cfg.run_dir) / CONTROL_DIR
    control.mkdir(exist_ok=True)
    rid = f"{time.time():.6f}-crash-{cfg.node}"
    tmp = control / f".{rid}.tmp"
    tmp.write_text(json.dumps({"id": rid, "node": cfg.node, "action": sc.faults.crash_action, "fields": {},
                               "source": f"crash after push at step {step} (p={sc.faults.crash_per_push:g})"}))
    os.replace(tmp, control / f"{rid}.json")
    time.sleep(5.0)  # frozen or killed meanwhile; should the runner be gone, go on


def worker_setup(cfg: RoleConfig, sc: Scenario):
    """(model on its device, dataset, device, the worker's shard as tensors x and y, its batches)."""
    from testbed.data.partition import worker_chunks

    model, ds = _model_and_data(sc)
    device = _device()
    model.to(device)
    keep = np.arange(len(ds.train_y))
    if sc.workload.train_fraction is not None:  # the same seeded subset on every worker, then partitioned
        keep = np.sort(np.random.default_rng(sc.seed).permutation(len(keep))[:max(1, round(
            sc.workload.train_fraction * len(keep)))])
    chunks = [keep[c] for c in worker_chunks(ds.train_y[keep], len(cfg.workers), sc.workload.partition, sc.seed,
                                             cfg.rank)]
    shard = np.concatenate(chunks)
    x = torch.from_numpy(np.ascontiguousarray(ds.train_x[shard]))
    y = torch.from_numpy(np.ascontiguousarray(ds.train_y[shard]))
    batches = _Batches(len(shard), sc.workload.batch_size, sc.seed * 1000 + cfg.rank, [len(c) for c in chunks])
    return model, ds, device, x, y, batches


def run_worker(cfg: RoleConfig, stop_event) -> None:
    from testbed.strategies import WorkerContext, get_strategy_class, make_strategy

    sc = Scenario.model_validate(cfg.scenario)
    if get_strategy_class(sc.algorithm.name).decentralized:
        from testbed.node.peer_roles import run_peer_worker

        return run_peer_worker(cfg, stop_event)
    _setup_torch(cfg, sc)
    model, ds, device, x, y, batches = worker_setup(cfg, sc)
    feeder = _start_feeder(cfg, sc, int(ds.train_x[0].nbytes)) if sc.streaming is not None else None
    strategy = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed)
    lr = sc.workload.lr
    zctx = zmq.Context()
    ep = transport.node_endpoint(zctx, cfg.ps_address, cfg.node, cfg.delay, seed=sc.seed)
    log = metrics.open_table(Path(cfg.run_dir), "steps.csv")
    stream_log = metrics.open_table(Path(cfg.run_dir), "stream.csv") if feeder is not None else None
    inject, own_batch = None, sc.workload.batch_size
    if sc.workload.injection is not None:
        from testbed.data.injection import DataInjection, local_batch

        if feeder is None:  # Eq. 3; a stream's batch follows its rate instead
            own_batch = local_batch(sc.workload.injection, sc.workload.batch_size, len(cfg.workers))
        inject = DataInjection(cfg, sc.workload.injection, sc.seed, zctx, own_batch)
    version = -1
    crash = random.Random(f"crash-{sc.seed}-{cfg.rank}") if sc.faults.crash_per_push > 0 else None

    def wait_reply(kinds=("model", "stop")) -> Optional[Message]:
        """The next message of `kinds` (or 'stop') from the PS; None when the runner says stop."""
        while not stop_event.is_set():
            for _, msg, _ in ep.recv(0.1):
                if msg.kind in kinds or msg.kind == "stop":
                    return msg
        return None

    try:
        ep.send(Message("hello"))
        reply = wait_reply()
        if reply is None or reply.kind == "stop":
            return
        _load(model, reply.tensors)
        strategy.worker_on_model(reply.meta)
        version = int(reply.meta["version"])
        step = 0
        while not stop_event.is_set():
            step += 1
            t_start = time.time()
            if feeder is None:
                idx = torch.from_numpy(batches.next(own_batch))
                xb, yb = x[idx], y[idx]
            else:
                xb, yb = _stream_batch(feeder, cfg, step, stream_log, stop_event)
                if xb is None:
                    break
            sent = received = 0
            if inject is not None:  # share some of this batch, train on what others shared
                sent += inject.share(step, xb, yb, _now(cfg))
                xi, yi, got = inject.take()
                received += got
                if xi is not None:
                    xb, yb = torch.cat([xb, xi.to(xb.dtype)]), torch.cat([yb, yi.to(yb.dtype)])
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb.to(device, non_blocking=True)), yb.to(device, non_blocking=True))
            loss.backward()
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            ctx = WorkerContext(worker=cfg.node, rank=cfg.rank, step=step, base_version=version, lr=lr,
                                model_params=dict(model.named_parameters()), n_workers=len(cfg.workers))
            t_computed = time.time()
            vote = strategy.worker_vote(grads, ctx)
            if vote is not None:  # every worker's flag, gathered through the PS, decides this step
                before = ep.bytes_received
                sent += ep.send(Message("vote", meta={"flag": bool(vote), "step": step}))
                decision = wait_reply(("decision",))
                received += ep.bytes_received - before
                if decision is None or decision.kind == "stop":
                    break
                ctx.sync = bool(decision.meta["sync"])
            payload = strategy.worker_payload(grads, ctx)
            if payload is None:  # the strategy keeps this step local
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        if p.grad is not None:
                            p.sub_(p.grad, alpha=lr)
            else:
                before = ep.bytes_received
                sent += ep.send(Message("push", payload, {"base_version": version, "step": step,
                                                          "batch_size": len(yb), "loss": loss.item()}))
                reply = wait_reply()
                received += ep.bytes_received - before
                if crash is not None and crash.random() < sc.faults.crash_per_push:
                    _crash(cfg, sc, step)
            t_done = time.time()
            log.write(time=t_done - cfg.t0, node=cfg.node, step=step, loss=loss.item(), batch_size=len(yb), lr=lr,
                      bytes_sent=sent, bytes_received=received, compute_seconds=t_computed - t_start,
                      comm_seconds=t_done - t_computed, model_version=version,
                      compressed=_flag(strategy.last_compressed))
            if payload is not None:
                if reply is None or reply.kind == "stop":
                    break
                _load(model, reply.tensors)
                strategy.worker_on_model(reply.meta)
                version = int(reply.meta["version"])
    finally:
        if feeder is not None:
            feeder.stop()
            feeder.join(timeout=5)
        if inject is not None:
            inject.close()
        try:
            ep.send(Message("bye"))
            time.sleep(0.05)
        except zmq.ZMQError:
            pass
        ep.close()
        zctx.term()


def _flag(v: Optional[bool]) -> Optional[int]:
    return None if v is None else int(v)


def _start_feeder(cfg: RoleConfig, sc: Scenario, sample_bytes: int):
    """The device's stream: a consumer thread filling a persistence or truncation buffer."""
    from testbed.data.streaming.buffer import FixedBatch, StreamBuffer, parse_batch_policy
    from testbed.data.streaming.consumer import StreamFeeder
    from testbed.data.streaming.rates import RateSchedule

    st = sc.streaming
    sched = cfg.stream["schedules"][cfg.node]
    schedule = RateSchedule(sched["times"], sched["rates"])
    buf = StreamBuffer(st.buffer, schedule.rate_at(0.0), cap_samples=st.buffer_cap, sample_bytes_hint=sample_bytes)
    table = metrics.open_table(Path(cfg.run_dir), "buffer.csv")
    policy = FixedBatch(sc.workload.batch_size) if st.batch == "fixed" else parse_batch_policy(st.batch)
    feeder = StreamFeeder(cfg.stream["bootstrap"], cfg.stream["topics"][cfg.node], buf, cfg.t0,
                          on_snapshot=lambda row: table.write(node=cfg.node, **row), schedule=schedule,
                          batch_policy=policy)
    feeder.start()
    return feeder


def _stream_batch(feeder, cfg: RoleConfig, step: int, stream_log, stop_event):
    """The next batch from the stream buffer: wait for it (the streaming latency), record the wait."""
    want, at_least = feeder.next_take()  # follows the device's rate (constant, or a trace)
    samples, waited = feeder.take(want, at_least, stop_event)
    if feeder.error:
        raise RuntimeError(f"stream of {cfg.node}: {feeder.error}")
    if not samples:
        return None, None
    xb = torch.from_numpy(np.stack([s[0] for s in samples]).astype(np.float32, copy=False))
    yb = torch.tensor([s[1] for s in samples], dtype=torch.int64)
    stream_log.write(time=feeder.now(), node=cfg.node, step=step, wait_seconds=waited, batch_size=len(samples),
                     buffered=feeder.left_after_take)
    return xb, yb


# --------------------------------------------------------------------------------------------
# broker node (streaming)


def run_broker_node(cfg: RoleConfig, stop_event) -> None:
    """The stream source: one producer process per device topic, and (role broker) the embedded
    Tansu broker beside them, as ScaDLES ran its producers beside Kafka. Role producer publishes
    to a broker elsewhere (a kafka node, or an external one)."""
    import multiprocessing as mp

    from testbed.data.partition import partition_indices
    from testbed.data.streaming.broker import BrokerError, create_topics, start_tansu, wait_for_port
    from testbed.data.streaming.producer import produce_stream

    sc = Scenario.model_validate(cfg.scenario)
    bootstrap = cfg.stream["bootstrap"]
    address, port = bootstrap.rsplit(":", 1)
    tansu = None
    if cfg.role == "broker":
        tansu = start_tansu(address, int(port), log_path=str(Path(cfg.run_dir) / "logs" / "broker.log"))
    else:
        wait = 150.0 if cfg.stream["kind"] == "kafka" else 20.0
        if not wait_for_port(address, int(port), wait, stop_event):
            raise BrokerError(f"{cfg.stream['kind']} broker at {bootstrap} did not accept connections within "
                              f"{wait:.0f} s" + (" (an external broker must be reachable from the run's subnet, "
                                                  "e.g. on this host at the run's gateway address)"
                                                  if cfg.stream["kind"] == "external" else ""))
    producers = []
    try:
        topics = cfg.stream["topics"]
        create_topics(bootstrap, list(topics.values()))
        from testbed.data.datasets import shared_dataset

        ds = shared_dataset(sc.workload.dataset, seed=sc.seed, test_size=sc.workload.test_size)
        shards = partition_indices(ds.train_y, len(cfg.workers), sc.workload.partition, sc.seed)
        ctx = mp.get_context("fork")  # this process is single-threaded: forking shares the dataset pages
        for rank, worker in enumerate(cfg.workers):
            p = ctx.Process(target=produce_stream, name=f"producer-{worker}",
                            args=(bootstrap, topics[worker], ds.train_x[shards[rank]],
                                  ds.train_y[shards[rank]], cfg.stream["schedules"][worker], stop_event,
                                  sc.seed * 1000 + rank, cfg.t0))
            p.start()
            producers.append(p)
        Path(cfg.stream["ready_file"]).touch()
        while not stop_event.is_set():
            if tansu is not None and tansu.poll() is not None:
                raise BrokerError(f"the broker (tansu) exited with code {tansu.returncode}")
            dead = [p.name for p in producers if not p.is_alive()]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited")
            time.sleep(0.2)
    finally:
        for p in producers:
            p.join(timeout=3)
            if p.is_alive():
                p.kill()
        if tansu is not None:
            tansu.terminate()
            try:
                tansu.wait(timeout=5)
            except Exception:
                tansu.kill()


# --------------------------------------------------------------------------------------------
# evaluator


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
    _load(model, msg.tensors)
    return (version, *evaluate(model, x, y))


def run_evaluator(cfg: RoleConfig, stop_event) -> None:
    sc = Scenario.model_validate(cfg.scenario)
    _setup_torch(cfg, sc)
    model, ds = _model_and_data(sc)
    device = _device()
    model.to(device)
    n = len(ds.test_y) if sc.workload.eval_samples is None else min(len(ds.test_y), sc.workload.eval_samples)
    x = torch.from_numpy(np.array(ds.test_x[:n])).to(device)  # a writable copy of the shared, read-only set
    y = torch.from_numpy(np.array(ds.test_y[:n])).to(device)
    zctx = zmq.Context()
    ep = transport.node_endpoint(zctx, cfg.ps_address, "eval", cfg.delay, seed=sc.seed)
    log = metrics.open_table(Path(cfg.run_dir), "eval.csv")
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
                              samples=n)
                    if target is not None and acc >= target:
                        ep.send(Message("target_reached", meta={"accuracy": acc, "version": msg.meta["version"]}))
                ep.send(Message("eval_ready"))
    finally:
        ep.close()
        zctx.term()


# --------------------------------------------------------------------------------------------
# background stress


def run_stress(load: float, stop_event, period: float = 0.1) -> None:
    """Busy-loop `load` of every `period` seconds (load >= 1 means always busy)."""
    busy = min(1.0, load) * period
    while not stop_event.is_set():
        end = time.monotonic() + busy
        while time.monotonic() < end:
            pass
        if load < 1.0:
            time.sleep(period - busy)


ROLE_TARGETS = {"ps": run_ps, "worker": run_worker, "evaluator": run_evaluator, "broker": run_broker_node,
                "producer": run_broker_node}
"""What each role's node runs (a `kafka` node runs its image's own entrypoint instead)."""
