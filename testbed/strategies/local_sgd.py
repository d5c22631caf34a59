"""Local SGD with periodic averaging: FedAvg with equal shards, ADSP's "Fixed ADACOMM".

Every worker takes `period` (H) plain SGD steps on its own copy of the model, then all
synchronize: each pushes the sum of its H gradients, the PS averages them (a barrier, as in
BSP) and applies W <- W - lr * (1/N) sum_i sum_h g_i,h, which is exactly the average of the
N local models for plain SGD (McMahan et al. 2017, FedAvg with E local steps and equal
weights; Wang & Joshi's ADACOMM with a constant tau, the ADSP paper's Fixed ADACOMM
baseline). H = 1 is BSP.

Client fraction C (`fraction`, FedAvg's C; SelSync's paper runs FedAvg with C = 1 and 0.5):
synchronization round r, the one that starts from model version r, takes a set S_r of
max(1, round(C N)) of the N workers, and the PS applies W <- W - lr * (1/|S_r|) sum_{i in S_r}
sum_h g_i,h (FedAvg, Algorithm 1: only the selected clients' updates are averaged).
 - S_r is drawn from the run's seed and r alone (`participants`): the PS (from its version) and
   every worker (from the version of the model it holds) draw the same set, with no message.
 - A worker outside S_r does no training that round, as an unselected FedAvg client: at its
   first step of the round it pushes an empty payload (a header of about 100 bytes) and idles
   until the round's model arrives, then goes on from it like everyone. The worker loop has
   computed one minibatch gradient before it asks the strategy: that gradient is discarded,
   and steps.csv shows this one step per round sat out, its idle time as comm_seconds.
 - The PS's barrier waits only for the workers of S_r still in the run, never for the idle
   ones; an idle check-in (or a late update) whose round has already closed is answered at once
   with the current model. Should every worker of S_r be gone, the round closes with no update
   (the version still advances, so the next round draws anew).
C = 1 is the plain local SGD above, all N workers in every round.
"""

from __future__ import annotations

import random
from typing import Optional

import torch
from pydantic import Field

from testbed.errors import RunFailed
from testbed.strategies.base import ServerState, StrategyParams, Tensors, WorkerContext
from testbed.strategies.bsp import BSP


def participants(round_: int, n_workers: int, fraction: float, seed: int = 0) -> frozenset[int]:
    """The ranks in synchronization round `round_`: max(1, round(C N)) of the N workers, drawn
    from (seed, round) alone, so that the PS and every worker draw the same set."""
    k = max(1, round(fraction * n_workers))
    if k >= n_workers:
        return frozenset(range(n_workers))
    return frozenset(random.Random(f"fedavg-{seed}-{round_}").sample(range(n_workers), k))


class LocalSGDParams(StrategyParams):
    period: int = Field(8, ge=1, le=100_000, description="local steps H between synchronizations")
    fraction: float = Field(1.0, gt=0.0, le=1.0, description="client fraction C: each synchronization round "
                            "averages the updates of max(1, round(C N)) of the N workers; the others sit it out")


class LocalSGD(BSP):
    name = "local_sgd"
    summary = "H local SGD steps, then all workers (or a fraction C) average (FedAvg with equal shards; Fixed ADACOMM)"
    paper = "FedAvg (McMahan et al. 2017); Fixed ADACOMM baseline of ADSP"
    synchronous = True
    Params = LocalSGDParams

    def __init__(self, params=None):
        super().__init__(params)
        self._acc: Optional[Tensors] = None  # worker: the sum of this round's gradients
        self._local = 0  # worker: local steps taken in this round
        self._idle: set[str] = set()  # PS: workers outside this round, waiting for its model

    # -- worker side --------------------------------------------------------------------
    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Optional[Tensors]:
        if self.params.fraction < 1.0 and ctx.rank not in participants(ctx.base_version, ctx.n_workers,
                                                                         self.params.fraction, self.seed):
            self._acc, self._local = None, 0
            return {}  # sits this round out: check in, then idle until the round's model arrives
        return self._accumulate(grads)

    def _accumulate(self, grads: Tensors) -> Optional[Tensors]:
        """Add this step's gradients to the round's sum: the sum after H steps, else None."""
        if self._acc is None:
            self._acc = {n: torch.zeros_like(g, dtype=torch.float32) for n, g in grads.items()}
        for n, g in grads.items():
            self._acc[n].add_(g.detach().to(torch.float32))
        self._local += 1
        if self._local < self.params.period:
            return None  # the worker applies g itself: W_i <- W_i - lr g
        out, self._acc, self._local = self._acc, None, 0
        return out

    # -- server side --------------------------------------------------------------------
    def _round(self, server: ServerState) -> set[str]:
        """The workers of the round now open (round r = server.version)."""
        ranks = participants(server.version, server.n_workers, self.params.fraction, self.seed)
        return {server.workers[i] for i in ranks}

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        if self.params.fraction >= 1.0:
            return super().server_on_push(server, worker, payload, base_version)
        selected = worker in self._round(server)
        if base_version < server.version and not (payload and selected):
            return [worker]  # late: the round it trained or sat out in closed without it
        if bool(payload) != selected:
            raise RunFailed(f"local_sgd: {worker} {'pushed an update' if payload else 'sat out'} in round "
                               f"{server.version}, where it is {'' if selected else 'not '}selected")
        if selected:
            return super().server_on_push(server, worker, payload, base_version)
        self._idle.add(worker)
        return self._complete(server)

    def _ready(self, server: ServerState) -> bool:
        if self.params.fraction >= 1.0:
            return super()._ready(server)
        expected = self._round(server) - self._left
        return bool(expected) and expected <= self._pending.keys()

    def _complete(self, server: ServerState) -> list[str]:
        if self.params.fraction >= 1.0:
            return super()._complete(server)
        if self._idle and not self._round(server) - self._left:
            server.apply({}, server.lr)  # every selected worker is gone: the round closes with no update
            answered = []
        else:
            answered = super()._complete(server)
            if not answered:
                return []
        idle, self._idle = self._idle, set()
        return sorted(set(answered) | idle)

    def server_on_leave(self, server: ServerState, worker: str) -> list[str]:
        self._idle.discard(worker)
        return super().server_on_leave(server, worker)

    def round_open(self) -> bool:
        return super().round_open() or bool(self._idle)
