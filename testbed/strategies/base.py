"""The algorithm seam: a strategy decides what a worker sends and how the PS applies it.

In the spirit of Flower strategies (server-side aggregation policy) and PyTorch DDP
communication hooks (worker-side transformation of gradients before they travel):

worker side   `worker_payload(grads, ctx)` -> tensors to push, or None to apply locally
server side   `server_on_push(server, worker, payload, base_version)` -> workers to answer now

`Strategy` is an ABC: `server_on_push` is what every strategy must say (a decentralized one says
there is no PS); the other hooks are optional, with defaults. What a push keeps of the update is
a `Compressor` (compressors.py) held apart from the protocol, as DDP's comm hooks keep theirs:
`worker_payload` compresses with it and `dense_update` decodes with it on the PS.

The parameter server owns the model as a dict of tensors (`ServerState.params`) and
answers a worker with the full dense model. One file per algorithm in this package,
each citing the equations of its paper that it implements.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import ClassVar, Optional

import torch
from pydantic import BaseModel, ConfigDict

from testbed.errors import BadInput

Tensors = dict[str, torch.Tensor]


class StrategyError(BadInput):
    pass


class StrategyParams(BaseModel):
    """Base of every strategy's parameters: unknown names are errors."""

    model_config = ConfigDict(extra="forbid")


class NoParams(StrategyParams):
    pass


def _number(value, kind: type):
    """A header's number as `kind`, None where it has none (null: a loss that was not a number)."""
    if value is None:
        return None
    if type(value) not in (int, float):  # a bool or a string is no number
        raise ValueError(f"{value!r} is not a number")
    return kind(value)


@dataclass(frozen=True)
class PushMeta:
    """What a worker says with each push (its header's meta): the model version it computed on,
    its step, and that step's samples and loss (None: not a number, or not said)."""

    base_version: int = 0
    step: int = 0
    batch_size: Optional[int] = None
    loss: Optional[float] = None

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, meta: dict) -> "PushMeta":
        """From a push's header (a malformed one raises before anything changes at the PS)."""
        return cls(base_version=_number(meta["base_version"], int), step=_number(meta.get("step", 0), int) or 0,
                   batch_size=_number(meta.get("batch_size"), int), loss=_number(meta.get("loss"), float))


@dataclass
class ServerState:
    """What the PS knows. `version` counts model updates applied (the global step)."""

    params: Tensors
    lr: float
    n_workers: int
    version: int = 0
    updates_received: int = 0
    workers: list[str] = field(default_factory=list)  # every worker's name (some may not have pushed yet)
    push_meta: PushMeta = field(default_factory=PushMeta)  # what the push being handled said (e.g. batch_size)
    # Per-push log the PS writes to server.csv: (worker, staleness, lr applied).
    log: list[tuple[str, int, float]] = field(default_factory=list)
    # Per-round records the PS writes to rounds.csv (strategies with client selection: fedavg.py).
    rounds: list[dict] = field(default_factory=list)
    # Per-round trainers (fedavg's `trainers: per_round`): the workers whose trainers the PS asks
    # the runner to start, and the devices offline now (their availability), never selected.
    starts: list[str] = field(default_factory=list)
    offline: set[str] = field(default_factory=set)

    def apply(self, update: Tensors, lr: float) -> None:
        """Plain SGD step W <- W - lr * update on the tensors present in `update`."""
        with torch.no_grad():
            for name, u in update.items():
                self.params[name].sub_(u.to(self.params[name].dtype), alpha=lr)
        self.version += 1

    def shapes(self) -> dict[str, torch.Size]:
        return {n: p.shape for n, p in self.params.items()}


class Compressor(ABC):
    """What a worker's push keeps of its update, and how the PS reads it back: one object per
    strategy instance, holding the compression's own state (compressors.py has the built-ins)."""

    name: ClassVar[str] = ""
    # whether the last payload was compressed (steps.csv `compressed`); None: always, not recorded
    last_compressed: Optional[bool] = None

    @abstractmethod
    def compress(self, grads: Tensors) -> Tensors:
        """Worker side: the payload standing for this step's update."""

    @abstractmethod
    def decompress(self, payload: Tensors, shapes: dict[str, torch.Size], fill_missing: bool = False) -> Tensors:
        """Server side: the dense update (a tensor the push left out: absent, or zeros with fill_missing)."""


@dataclass
class WorkerContext:
    worker: str
    rank: int
    step: int
    base_version: int
    lr: float
    model_params: Optional[Tensors] = None  # the worker's current parameters (before this step's update)
    n_workers: int = 1
    sync: Optional[bool] = None  # the outcome of this step's vote, for strategies that vote


class Strategy(ABC):
    """Base class. Subclasses set `name`, `summary`, `Params`, implement `server_on_push` and
    override the optional hooks they need."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    # True: a worker that stops answering can hold the others up (a BSP barrier, SSP's bound,
    # SelSync's vote), so the PS declares a silent worker lost after faults.worker_timeout
    synchronous: ClassVar[bool] = False
    decentralized: ClassVar[bool] = False  # True: no PS, workers exchange directly (strategies/peer.py)
    # True: a worker's trainer runs only while it is selected (the runner starts it when the PS
    # asks, server.starts; it ends when worker_parks says so): fedavg's `trainers: per_round`
    per_round: bool = False
    parked: int = 0  # per-round trainers: how many wait, idle, between their rounds (node/roles/parking.py)
    Params: ClassVar[type[BaseModel]] = NoParams
    # whether this worker's last payload was compressed (steps.csv `compressed`); None: not compressing
    last_compressed: Optional[bool] = None

    seed: int = 0  # the run's seed (make_strategy sets it): the same on the PS and every worker
    # what a push keeps of the update (compressors.py); None: dense pushes
    compressor: Optional[Compressor] = None

    def __init__(self, params: Optional[dict] = None):
        self.params = self.Params(**(params or {}))
        self.compressor = self.make_compressor()

    def make_compressor(self) -> Optional[Compressor]:
        """The compressor this strategy's pushes go through (default: none, dense pushes)."""
        return None

    # -- worker side --------------------------------------------------------------------
    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Optional[Tensors]:
        """Tensors to push for this step (default: the gradients, through the compressor if any)."""
        if self.compressor is None:
            return grads
        payload = self.compressor.compress(grads)
        self.last_compressed = self.compressor.last_compressed
        return payload

    def worker_vote(self, grads: Tensors, ctx: WorkerContext) -> Optional[bool]:
        """A flag to share with every worker before this step's payload (SelSync's "synchronize
        now?"); None: this strategy does not vote. The outcome arrives as ctx.sync."""
        return None

    # -- server side --------------------------------------------------------------------
    def server_on_vote(self, server: ServerState, worker: Optional[str],
                       flag: bool) -> Optional[tuple[list[str], bool]]:
        """Collect a vote (worker None: only check, e.g. after a worker left); once every active
        worker voted, return (workers to tell, outcome)."""
        return None

    @abstractmethod
    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        """Take a worker's push (made on model `base_version`); return the workers to answer now."""

    def dense_update(self, server: ServerState, payload: Tensors, fill_missing: bool = False) -> Tensors:
        """A push as the dense update it stands for: decoded by the compressor, if any (a tensor
        the push left out: absent, or zeros with fill_missing)."""
        if self.compressor is None:
            return payload
        return self.compressor.decompress(payload, server.shapes(), fill_missing=fill_missing)

    def server_reply_meta(self, server: ServerState, worker: str) -> dict:
        """Extra meta for the model the PS sends `worker` (e.g. ADSP's commit rate)."""
        return {}

    def worker_on_model(self, meta: dict) -> None:  # noqa: B027  (an optional hook)
        """A worker received the model with this meta (see server_reply_meta)."""

    def trainers_at_once(self, n_workers: int) -> int:
        """How many of `n_workers` workers' trainers train at once, at most (the CPU they are promised)."""
        return n_workers

    def trainers_alive(self, n_workers: int) -> int:
        """How many trainer processes exist at once, at most, parked ones included (what memory must hold)."""
        return min(n_workers, self.trainers_at_once(n_workers) + self.parked)

    def worker_parks(self, version: int) -> bool:
        """Whether this worker's trainer stops training now, the model of `version` just taken: it
        ends, or waits parked for a later round if the PS says so (fedavg's per-round trainers);
        False: it trains the whole run."""
        return False

    def report(self) -> dict:
        """What the strategy decided over the run, for RUN/ps.json (e.g. ADSP's commit rate search)."""
        return {}

    def server_on_tick(self, server: ServerState, now: float) -> list[str]:
        """Called between messages (`now`: time.monotonic()); return workers to answer now (a
        round whose deadline passed closes)."""
        return []

    def server_on_leave(self, server: ServerState, worker: str) -> list[str]:
        """A worker stopped; return workers to answer now (a barrier may complete)."""
        return []

    def server_on_join(self, server: ServerState, worker: str) -> None:  # noqa: B027  (an optional hook)
        """A worker that left (or was lost) is back: count it in again."""

    def round_open(self) -> bool:
        """Whether a synchronous round is under way (a barrier or vote some workers are in):
        the PS admits a rejoining worker only between rounds, so that it joins a whole one."""
        return False
