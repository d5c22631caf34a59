"""FedAvg with client selection as production federated learning runs it: K clients a round from
those online, over-selection, and a deadline.

McMahan et al. 2017, Algorithm 1 (FederatedAveraging): in round t the server picks a set S_t of
clients and sends them w_t; each takes E local epochs of SGD (here `period`, H local steps) and
returns its update; the server applies w_{t+1} = w_t - lr (1/|R_t|) sum_{k in R_t} sum_h g_k,h over
the clients R_t that reported (equal shards: equal weights; for plain SGD the mean of the local
models). Bonawitz et al. 2019 ("Towards Federated Learning at Scale", Sec. 2.2): the server selects
among the devices that checked in, selects more than it needs (over-selection, their example 130%)
so that drop-outs do not stall the round, takes the first K reports, and abandons a round whose
reports do not arrive in time; FedScale (over-commitment 1.3, a round deadline) does the same.

Here, round r is the one that starts from model version r:
 - **Online** is the PS's view: every worker not left or lost (a device that went offline counts
   until the PS loses it, after `faults.worker_timeout` of silence, as a real server learns of a
   drop-out only by a timeout). The PS draws ceil(over_selection x K) of them (at most all),
   seeded by (run seed, r), when the round opens, and says so in the model it sends
   (`selected`): unlike local_sgd's fraction, a worker cannot know the draw without the PS.
 - A selected worker trains H steps and pushes their sum; an unselected one checks in with an
   empty payload and idles until the round's model arrives (as in local_sgd.py).
 - The round closes when K selected workers reported (all the selected still in the run, if
   fewer), or at `deadline_s` after it opened with the reports it has; fewer than `min_reports`
   then, and the round is abandoned (no update; the version still advances, so the next round
   draws anew). A report for a round already closed is dropped and answered with the model.
 - Every round leaves a row in rounds.csv: who was online, selected, finished (reported in
   time), dropped (selected, not reported in time), and why it closed.

`trainers: per_round` runs a fleet the way Flower's deployment engine and FedScale do:
a device's node (namespace, link, limits) exists for the whole run, its trainer process only
while it trains. Online is then the device's availability as it checked in (the plan the runner
gives the PS, `RoleConfig.offline`), not the PS's silence timeout. When a round opens, the PS
asks the runner to start the selected devices' trainers (`server.starts`); each says hello, gets
the round's model, trains H steps on batches drawn for that round (its data state is its shard
and the round: nothing else outlives it), pushes, and gets the next round's model: selected
again, it goes on; not selected, it ends and costs nothing until drawn again, or, with `parked`
P > 0, it waits (parks) with its process, connection and model, and when a later round draws its
device the PS hands it that round's model instead of asking for a new trainer (at most P wait,
the longest parked ended first: node/roles/parking.py). A round needs a deadline here: a
trainer that never starts (its device went offline) is a drop-out.
"""

from __future__ import annotations

import math
import random
import time
from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from testbed.errors import RunFailed
from testbed.records.virtual import VIRTUAL_TIME
from testbed.strategies.base import ServerState, StrategyParams, Tensors, WorkerContext
from testbed.strategies.local_sgd import LocalSGD


def select(round_: int, online: list[str], k: int, over_selection: float, seed: int = 0) -> frozenset[str]:
    """Round `round_`'s clients: ceil(over_selection x k) of `online` (all, if fewer), drawn from
    (seed, round) alone."""
    n = min(len(online), math.ceil(over_selection * k - 1e-9))
    return frozenset(random.Random(f"fedavg-select-{seed}-{round_}").sample(sorted(online), n))


class FedAvgParams(StrategyParams):
    period: int = Field(8, ge=1, le=100_000, description="local steps H a selected client takes each round")
    clients: int = Field(10, ge=1, le=1_000_000, description="K: reports a round waits for (the clients per round)")
    over_selection: float = Field(1.0, ge=1.0, le=10.0, description="select ceil(this x K) of the online "
                                  "clients, keep the first K reports (Bonawitz et al. 2019: 1.3)")
    deadline_s: Annotated[Optional[float], VIRTUAL_TIME] = Field(
        None, gt=0.0, le=86_400.0, description="seconds after a round opens at which it closes with the reports "
        "it has (None: it waits for K)")
    min_reports: int = Field(1, ge=1, le=1_000_000, description="reports a round needs at its deadline, "
                             "or it is abandoned with no update")
    trainers: Literal["always", "per_round"] = Field("always", description="always: every device's trainer runs "
                                                     "the whole run; per_round: started when selected, ended when "
                                                     "not (a fleet: idle devices cost no process); needs deadline_s")
    parked: int = Field(0, ge=0, le=100_000, description="per_round: how many trainers a round did not select "
                        "wait, idle, for a later one that does (the PS hands them its model: no new process; the "
                        "longest parked ends first past this); 0: a trainer not selected again ends")

    @model_validator(mode="after")
    def _per_round_needs_a_deadline(self):
        if self.trainers == "per_round" and self.deadline_s is None:
            raise ValueError("trainers: per_round needs deadline_s (a selected device that never starts is a "
                             "drop-out only a deadline ends)")
        if self.parked and self.trainers != "per_round":
            raise ValueError("parked: only with trainers: per_round (always-on trainers never end)")
        return self


class Round:
    """The round now open at the PS: when it opened, who was online and who was selected."""

    def __init__(self, number: int, online: list[str], selected: frozenset[str]):
        self.number, self.online, self.selected = number, online, selected
        self.opened = time.monotonic()


class FedAvg(LocalSGD):
    name = "fedavg"
    summary = "FedAvg rounds: K clients from those online, over-selection, first K reports, a deadline"
    paper = "McMahan et al. 2017 (FedAvg); Bonawitz et al. 2019 (selection, over-selection, deadlines)"
    synchronous = True
    Params = FedAvgParams

    def __init__(self, params=None):
        super().__init__(params)
        self.per_round = self.params.trainers == "per_round"
        self.parked = self.params.parked
        self._open: Optional[Round] = None  # PS: the round now open
        self._selected: dict[int, bool] = {}  # worker: whether it is selected, by round
        self._reported: dict[str, float] = {}  # PS: when each selected client's update came, since the round opened
        self.closed: dict[str, int] = {}  # PS: rounds closed, by why

    # -- worker side --------------------------------------------------------------------
    def worker_on_model(self, meta: dict) -> None:
        if "selected" in meta:
            self._selected = {int(meta["version"]): bool(meta["selected"])}

    def trainers_at_once(self, n_workers: int) -> int:
        """Per-round trainers: two rounds' clients at most (one closing with its stragglers, the next)."""
        if not self.per_round:
            return n_workers
        return min(n_workers, 2 * math.ceil(self.params.over_selection * self.params.clients - 1e-9))

    def worker_parks(self, version: int) -> bool:
        """Whether a per-round trainer ends here: the model of round `version` came, and it is not
        among that round's clients."""
        return self.per_round and not self._selected.get(version, False)

    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Optional[Tensors]:
        if not self._selected.get(ctx.base_version, False):
            self._acc, self._local = None, 0
            return {}  # not selected: check in, then idle until the round's model arrives
        return self._accumulate(grads)

    # -- server side --------------------------------------------------------------------
    def _current(self, server: ServerState) -> Round:
        """The round now open (round r = server.version), drawn when first asked for."""
        if self._open is None or self._open.number != server.version:
            online = [w for w in server.workers if w not in self._left and w not in server.offline]
            chosen = frozenset(self.choose(server.version, online)) & frozenset(online)
            self._open = Round(server.version, online, chosen)
            if self.per_round:  # the runner starts the trainers of those not running already
                server.starts.extend(sorted(chosen))
        return self._open

    def choose(self, round_: int, online: list[str]) -> frozenset[str]:
        """Round `round_`'s clients among `online` (uniform at random). A plugin's selection (Oort's
        utility, a per-group quota) is a subclass overriding this; what it returns outside
        `online` is ignored."""
        return select(round_, online, self.params.clients, self.params.over_selection, self.seed)

    def _round(self, server: ServerState) -> set[str]:
        return set(self._current(server).selected)

    def server_reply_meta(self, server: ServerState, worker: str) -> dict:
        return {"selected": worker in self._current(server).selected}

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        if base_version < server.version:
            return [worker]  # its round closed without it (dropped, or an unselected check-in)
        selected = worker in self._round(server)
        if bool(payload) != selected:
            raise RunFailed(f"fedavg: {worker} {'pushed an update' if payload else 'sat out'} in round "
                               f"{server.version}, where it is {'' if selected else 'not '}selected")
        if selected:
            self._pending[worker] = self.dense_update(server, payload, fill_missing=True)
            self._reported[worker] = time.monotonic() - self._current(server).opened
        else:
            self._idle.add(worker)
        return self._complete(server)

    def _ready(self, server: ServerState) -> bool:
        alive = self._round(server) - self._left
        return len(self._pending) >= min(self.params.clients, len(alive))

    def _complete(self, server: ServerState, why: Optional[str] = None) -> list[str]:
        """Close the round if it is complete (or `why`: its deadline passed); the workers to answer."""
        if why is None:
            if not self._ready(server):
                return []
            why = "reports" if self._pending else "no selected client left"
        rnd = self._current(server)
        answered = sorted(set(self._pending) | self._idle)
        if why == "deadline" and len(self._pending) < self.params.min_reports:
            why = "abandoned at deadline"
            self._pending.clear()  # too few to average: answered with the model as it is
        finished = sorted(self._pending)
        if self._pending:
            update, lr = self.aggregate(server)
            server.apply(update, lr)
            server.log.extend((w, 0, lr) for w in finished)
        else:
            server.apply({}, server.lr)  # no update: the version advances, the next round draws anew
        self.closed[why] = self.closed.get(why, 0) + 1
        server.rounds.append({"round": rnd.number, "reason": why, "open_seconds": time.monotonic() - rnd.opened,
                              "online": rnd.online, "selected": sorted(rnd.selected), "finished": finished,
                              "dropped": sorted(rnd.selected - set(finished)),
                              "report_seconds": [self._reported[w] for w in finished]})
        self._pending.clear()
        self._reported.clear()
        self._idle.clear()
        self._current(server)  # the next round opens as this one closes: its deadline counts from now
        return answered

    def server_on_tick(self, server: ServerState, now: float) -> list[str]:
        deadline = self.params.deadline_s
        if self.per_round and self._open is None:
            self._current(server)  # round 0: no trainer runs yet to say hello
            return []
        if deadline is None or self._open is None:
            return []  # round 0 opens with the first worker's hello
        if now - self._current(server).opened < deadline:
            return []
        return self._complete(server, why="deadline")

    def report(self) -> dict:
        return {"rounds_closed": dict(sorted(self.closed.items()))}

    def server_on_leave(self, server: ServerState, worker: str) -> list[str]:
        if self._open is None:  # no round drawn yet (none before the first hello): nothing to close
            self._left.add(worker)
            return []
        return super().server_on_leave(server, worker)  # local_sgd's: out of the round, which may close
