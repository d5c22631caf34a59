"""What every role shares: its configuration, the model and data, torch set-up, the evaluator
feed, and the worker's batches."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
import zmq

from testbed.node import channel, transport
from testbed.node.gpu import StepPacer, cap_error, is_out_of_memory, pick_device
from testbed.node.pacing import DevicePace
from testbed.node.wire import Message
from testbed.scenario.devices.step_time import StepTime
from testbed.scenario.dilation import wall_scenario
from testbed.scenario.schema import Scenario


@dataclass
class PeerLink:
    """Another worker as this worker's link to it sees it (plan.cluster.peer_table): where it
    listens, the path's bottleneck rate (None: nothing on the path is shaped), and whether it
    shares this worker's site (LAN) or is across a WAN."""

    address: str = ""
    rate_bps: Optional[float] = None
    same_site: bool = True


@dataclass
class RateTrace:
    """A device's stream rate over the run: `rates[i]` samples/s from `times[i]` seconds on."""

    times: list[float]
    rates: list[float]


@dataclass
class StreamConfig:
    """A streaming run's data plane (ScaDLES): the broker, each device's topic, its nominal rate
    and its rate over the run."""

    bootstrap: str  # the broker's ADDRESS:PORT
    kind: str  # the broker: tansu | kafka | external
    topics: dict[str, str]
    rates: dict[str, float]
    schedules: dict[str, RateTrace]

    def __post_init__(self):
        self.schedules = {w: s if isinstance(s, RateTrace) else RateTrace(**s) for w, s in self.schedules.items()}


@dataclass
class RoleConfig:
    """Everything a role needs, picklable (it crosses the forkserver) and a mapping of plain values
    as `dataclasses.asdict` (it reaches a container as JSON): built again from that mapping, its
    parts are dataclasses again (`__post_init__`)."""

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
    # Decentralized strategies: every other worker -> its link
    peers: dict[str, PeerLink] = field(default_factory=dict)
    # Streaming (ScaDLES): the broker and every device's topic and rate; None when not streaming
    stream: Optional[StreamConfig] = None
    # What runs the role, `module:function` (testbed.node.roles.role_target): the algorithm picks it.
    target: str = ""
    # Every node of the run -> its address: receivers hear a node only from its own address.
    addresses: dict = field(default_factory=dict)
    # The runner's hub on the control network (testbed.node.channel): where records and reports
    # go up ("tcp://ADDRESS:PORT"; "" outside a run: tables are appended to in run_dir) and
    # where the runner's beats, delays and replicas come down.
    records: str = ""
    control: str = ""
    # Where a command workload's program writes its output: a file of the runner's (netns: the same
    # host), or "" for the node's own output (a container's log, saved at teardown).
    log_path: str = ""
    # A paced device (profile `pace_steps`, run/devices.py): its calibrated step time for a batch
    # of step_target_batch samples (0: not paced)
    step_target_s: float = 0.0
    step_target_batch: int = 0
    step_target_shape: dict = field(default_factory=dict)  # its StepTime for other batches (empty: proportional)
    # Per-round trainers (fedavg `trainers: per_round`), the PS only: each device's offline
    # intervals in run seconds (plan/availability.py), so that it selects among those online
    offline: dict[str, list[list[float]]] = field(default_factory=dict)
    # A per-round trainer (a worker of such a run): its node outlives it, and a container's
    # supervisor waits for the next round's start when it ends (node/supervisor.py)
    per_round: bool = False
    # Virtual time (scenario.dilation): `scenario` is the world's, the role runs on the wall k
    # times slower, and its records are written in the world's units
    dilation: float = 1.0

    def __post_init__(self):
        """The parts given as mappings (the runner's tables, or JSON in a container) as dataclasses."""
        if isinstance(self.delay, Mapping):
            self.delay = transport.DelaySpec(**self.delay)
        self.peers = {n: p if isinstance(p, PeerLink) else PeerLink(**p) for n, p in self.peers.items()}
        if isinstance(self.stream, Mapping):
            self.stream = StreamConfig(**self.stream) if self.stream else None

    def scenario_model(self) -> Scenario:
        """The scenario as this node runs it: on the wall (scenario.dilation.wall_scenario)."""
        return wall_scenario(Scenario.model_validate(self.scenario), self.dilation)

    def now(self) -> float:
        """Seconds since the run started: the time column of every record."""
        return time.time() - self.t0


def setup_torch(cfg: RoleConfig, sc: Scenario) -> None:
    torch.set_num_threads(cfg.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(sc.seed)


def model_and_data(sc: Scenario):
    from testbed.data.datasets import shared_dataset
    from testbed.data.models import initial_model

    ds = shared_dataset(sc.workload.dataset, seed=sc.seed, test_size=sc.workload.test_size)
    # identical initial model everywhere (built after torch.manual_seed(seed), or a kept copy of it)
    model = initial_model(sc.workload.model, tuple(ds.input_shape), ds.num_classes, sc.seed)
    return model, ds


def frame_limit(model: torch.nn.Module) -> int:
    """The largest frame a role's socket takes: any strategy's payload for the largest parameter
    (a sparse one carries 8-byte indices beside 4-byte values), plus room for a header."""
    largest = max((p.numel() * p.element_size() for p in model.parameters()), default=0)
    return 3 * largest + (1 << 20)


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def load_params(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n in tensors:
                p.copy_(tensors[n])


def send_stop(ep: transport.Endpoint, workers, reason: Optional[str]) -> None:
    for w in sorted(workers):
        try:
            ep.send(Message("stop", meta={"reason": reason}), w)
        except zmq.ZMQError:  # already gone
            pass


class EvalFeed:
    """Model snapshots for the evaluator node, sent one at a time, each when it is ready.

    An evaluator slower than the feed falls behind: snapshots wait in the queue (eval.csv keeps
    each one's own time, so curves are right, but a stop on target comes as late as the backlog).
    `lag` is the longest wait seen; at the end, `finish` keeps the final model's evaluation
    within its limit by skipping the newest queued snapshots before it (`skipped`)."""

    LAG_WARNING = 10.0  # s: a backlog this long is said once, in the node's log

    def __init__(self, ep: transport.Endpoint, now: Callable[[], float]):
        self.ep, self.now = ep, now
        self.queue: deque = deque()
        self.ready = False
        self.sent_at: Optional[float] = None
        self.sent_full = False  # the one in flight carries a model (a repeat costs the evaluator nothing)
        self.longest = 0.0  # s: the longest evaluation so far (bounds the wait for a dead evaluator)
        self.full_seconds: deque = deque(maxlen=20)  # s: the latest evaluations of a model
        self.lag = 0.0  # s: the longest a snapshot waited for the evaluator
        self.skipped = 0

    def add(self, params: dict, meta: dict) -> None:
        self.queue.append((params, meta))

    def on_ready(self) -> None:
        if self.sent_at is not None:
            took = time.time() - self.sent_at
            self.longest = max(self.longest, took)
            if self.sent_full:
                self.full_seconds.append(took)
            self.sent_at = None
        self.ready = True

    def pump(self) -> None:
        if self.ready and self.queue:
            params, meta = self.queue.popleft()
            self.note_lag(self.now() - float(meta.get("time", self.now())))
            self.ep.send(Message("evaluate", params, meta), "eval")
            self.ready = False
            self.sent_at = time.time()
            self.sent_full = not meta.get("repeat")

    def note_lag(self, waited: float) -> None:
        if waited >= self.LAG_WARNING > self.lag:
            print(f"the evaluator is {waited:.0f} s behind the model it is fed: its curve keeps each "
                  f"snapshot's time, but a stop on target comes that late (give it more CPU, or a "
                  f"longer eval_seconds/eval_interval)", flush=True)
        self.lag = max(self.lag, waited)

    def fit(self, seconds: float) -> None:
        """Skip queued snapshots so what is left (the last, the final model, always kept) can be
        evaluated within `seconds`, at the recent pace; the earliest are kept, so the curve has no holes."""
        if not self.full_seconds or len(self.queue) < 2:
            return
        each = sum(self.full_seconds) / len(self.full_seconds)
        budget = seconds - each * (1 + (self.sent_at is not None))  # the final one, and the one in flight
        kept: deque = deque()
        for params, meta in list(self.queue)[:-1]:
            cost = 0.0 if meta.get("repeat") else each
            if cost > budget:
                break
            budget -= cost
            kept.append((params, meta))
        self.skipped += len(self.queue) - 1 - len(kept)
        kept.append(self._final_with_model(kept))
        self.queue = kept

    def _final_with_model(self, kept: deque) -> tuple:
        """The queue's last entry; a repeat whose model was among the skipped carries that model
        (the evaluator has no result of that version to repeat)."""
        params, meta = self.queue[-1]
        if not meta.get("repeat"):
            return params, meta
        for p, m in reversed(self.queue):
            if not m.get("repeat") and m.get("version") == meta.get("version"):
                if any(p is q for q, _ in kept):
                    break
                return p, {**meta, "repeat": False}
        return params, meta

    def finish(self, stop_event, limit: float = 120.0) -> None:
        """Evaluate what is queued (the final model last), then stop the evaluator. An evaluator
        silent for 4x its longest evaluation (20 s at least) is taken for dead (killed, frozen)."""
        deadline = time.time() + limit
        self.fit(limit * 0.9)  # margin: the pace is an estimate
        if self.skipped:
            print(f"{self.skipped} queued snapshot(s) not evaluated: the final model's evaluation "
                  f"kept within {limit:.0f} s", flush=True)
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

    def stats(self) -> dict:
        """For ps.json: the evaluator's longest backlog (s) and the snapshots skipped at the end."""
        return {"evaluator_lag_seconds": round(self.lag, 3), "evaluations_skipped": self.skipped}


class ServingRole:
    """The loop of the node the others report to (the PS, or a decentralized run's coordinator):
    serve messages until there is a reason to stop, feed the evaluator on its schedule, then stop
    the workers, let the evaluator finish, and write ps.json. A subclass gives `stop_reason`,
    `serve`, `snapshot`, `maybe_snapshot`, `active` and `report`; `tend` runs between messages,
    `wind_down` after the workers were told to stop."""

    cfg: RoleConfig
    reason: Optional[str]

    def run(self) -> None:
        try:
            while self.reason is None:
                self.reason = self.stop_reason()
                if self.reason is not None:
                    break
                self.serve(self.ep.recv(self.schedule.wait(self.cfg.now(), 0.05)))  # wakes for a timed feed
                self.maybe_snapshot()
                self.tend()
                self.feed.pump()
            send_stop(self.ep, self.active(), self.reason)  # workers first: they stop computing
            self.wind_down()
            self.snapshot(final=True)
            self.feed.finish(self.stop_event)
        finally:
            channel.report(self.cfg, "ps.json", {**self.report(), **self.feed.stats()})
            time.sleep(0.2)  # let the last stop messages leave
            self.ep.close()
            self.zctx.term()

    def tend(self) -> None:
        """Work between messages (the PS: losing silent workers, admitting restarted ones)."""

    def wind_down(self) -> None:
        """Work after the workers were told to stop, before the final evaluation."""


class Batches:
    """Draw batches from the worker's samples, reshuffled every epoch. With `chunks` (sizes of
    consecutive runs, SelDP), each run is shuffled on its own and the runs keep their order."""

    def __init__(self, n: int, batch: int, seed: int, chunks: Optional[list[int]] = None):
        self.n, self.batch = n, batch
        self.chunks = chunks or [n]
        self.rng = np.random.default_rng(seed)
        self.order = self._epoch()
        self.pos = 0

    def reseed(self, *key: int) -> None:
        """Draw from here on as a sampler seeded by `key` (a per-round trainer: its device and the
        round), a new epoch's order from its start."""
        self.rng = np.random.default_rng(list(key))
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


@dataclass
class WorkerData:
    """A worker's model on its device and its shard of the training set."""
    model: torch.nn.Module
    dataset: object
    device: torch.device
    x: torch.Tensor
    y: torch.Tensor
    batches: Batches
    pacer: StepPacer  # a paced GPU share (node.gpu)
    pace: Optional[DevicePace] = None  # a paced device's step time (node.pacing)


@contextmanager
def device_step(data: WorkerData, node: str, samples: int = 0):
    """One step's work of `samples` on the node's device (end it with a sync, e.g. loss.item()):
    paced to the node's GPU share and to a paced device's time, and past its gpu_memory an error
    that names the cap."""
    t = time.perf_counter()
    try:
        yield
    except RuntimeError as e:  # OutOfMemoryError and the driver's AcceleratorError are RuntimeErrors
        if is_out_of_memory(e):
            raise cap_error(node, e) from e
        raise
    data.pacer.after(time.perf_counter() - t)
    if data.pace is not None and samples > 0:
        data.pace.after(time.perf_counter() - t, samples)


def worker_setup(cfg: RoleConfig, sc: Scenario) -> WorkerData:
    from testbed.data.partition import worker_chunks

    model, ds = model_and_data(sc)
    device = pick_device(cfg.node)
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
    batches = Batches(len(shard), sc.workload.batch_size, sc.seed * 1000 + cfg.rank, [len(c) for c in chunks])
    pace = DevicePace(cfg.step_target_s, cfg.step_target_batch, shape=StepTime.from_dict(cfg.step_target_shape)) \
        if cfg.step_target_s > 0 else None
    return WorkerData(model, ds, device, x, y, batches, StepPacer(device), pace)
