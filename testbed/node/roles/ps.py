"""The parameter server: applies the workers' pushes through the algorithm's strategy, answers
with the model, feeds the evaluator, and keeps track of which workers are still in the run."""

from __future__ import annotations

import time
from typing import Any, Optional

import zmq

from testbed.node import channel, transport, untrusted
from testbed.node.roles.common import (
    EvalFeed,
    RoleConfig,
    ServingRole,
    frame_limit,
    model_and_data,
    params_of,
    send_stop,
    setup_torch,
)
from testbed.node.roles.eval_schedule import EvalSchedule
from testbed.node.roles.parking import ParkedTrainers
from testbed.node.wire import Message
from testbed.plan.availability import OfflineClock
from testbed.strategies import PushMeta, ServerState, make_strategy

# What handling a malformed message (missing meta keys, tensors of the wrong name or shape, a number
# out of range) raises: "refused". Anything else a handler raises is counted as a handler error.
BAD_MESSAGE = (KeyError, ValueError, TypeError, IndexError, RuntimeError, OverflowError)
MAX_REFUSED = 20  # malformed messages a worker may send before the PS counts it lost


class Membership:
    """Which workers joined, which left (said bye, or were lost), which wait for an answer, when
    each was last heard from, and which restarted ones wait to be admitted between rounds."""

    def __init__(self) -> None:
        self.joined: set[str] = set()
        self.left: set[str] = set()
        self.waiting: set[str] = set()  # pushed or voted, and wait for the PS's answer
        self.heard: dict[str, float] = {}
        self.held: set[str] = set()  # restarted, admitted when no round is open
        self.unreachable: list[str] = []  # a send to them failed: lost at the next check

    def active(self) -> set[str]:
        return self.joined - self.left

    def all_left(self) -> bool:
        return bool(self.joined) and self.left >= self.joined

    def silent(self, timeout: float) -> list[str]:
        """Workers the PS waits for (not waiting for it) that said nothing for `timeout` seconds."""
        now = time.time()
        return [w for w in sorted(self.active() - self.waiting) if now - self.heard.get(w, now) > timeout]


class ParameterServer(ServingRole):
    def __init__(self, cfg: RoleConfig, stop_event):
        self.cfg, self.stop_event = cfg, stop_event
        self.sc = sc = cfg.scenario_model()
        setup_torch(cfg, sc)
        model, _ = model_and_data(sc)
        self.server = ServerState(params=params_of(model), lr=sc.workload.lr, n_workers=len(cfg.workers),
                                  workers=list(cfg.workers))
        self.strategy = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed)
        self.zctx = zmq.Context()
        self.ep = transport.ps_endpoint(self.zctx, cfg.ps_address, cfg.delay, seed=sc.seed,
                                        max_frame=frame_limit(model))
        self.ep.senders = transport.known_senders([*cfg.workers, "eval"], cfg.addresses)
        self.log = channel.open_table(cfg, "server.csv")
        self.events = channel.open_table(cfg, "events.csv")
        self.rounds: Any = None  # rounds.csv, opened at the first round a strategy records
        self.schedule = EvalSchedule(sc.workload.eval_interval, sc.workload.eval_seconds)
        self.feed = EvalFeed(self.ep, self.cfg.now)
        self.members = Membership()
        self.offline = OfflineClock(cfg.offline)  # per-round trainers: the devices offline as time goes
        self.parked: Optional[ParkedTrainers] = None  # per-round trainers waiting for a later round
        if self.strategy.per_round:  # every device is in the fleet from the start, its trainer not running
            self.members.joined = set(cfg.workers)
            self.parked = ParkedTrainers(self.strategy.parked)
        self.refused: dict[str, int] = {}  # malformed messages per worker
        self.faulty: set[str] = set()  # lost for them: heard again only after a restart
        self.reason: Optional[str] = None
        self.ingress_payload = 0
        self.last_eval_version = -1
        self.start = time.time()

    # -- the loop (ServingRole.run) -------------------------------------------------------
    def tend(self) -> None:
        self.check_lost()
        self.admit()
        if self.strategy.per_round:
            self.server.offline = self.offline.at(self.cfg.now())
        before = len(self.server.log)
        answer = self.strategy.server_on_tick(self.server, time.monotonic())  # a round's deadline
        self.record(before)
        self.answer(answer)

    def answer(self, workers: list[str]) -> None:
        """Send `workers` the model; first the trainers of a round that just opened (a parked
        one handed its round before another parks in its place)."""
        self.ask_trainers()
        for w in workers:
            self.send_model(w)

    def ask_trainers(self) -> None:
        """The trainers of a round's clients (per-round trainers): a parked one is handed the
        round's model; for the others the runner starts one (a request each, over the control
        channel; it passes over those running already). None once the run is ending."""
        if self.reason is not None:
            del self.server.starts[:]
            return
        for w in self.server.starts:
            if self.parked is not None and self.parked.take(w):
                if self.send_model(w):
                    self.parked.counts["handed a round"] += 1
                    continue
                self.parked.counts["gone when handed"] += 1  # it ended (killed offline): start another
            channel.send_json(self.cfg.records, "request", {"id": f"train-{self.server.version}-{w}", "node": w,
                                                            "action": "train", "fields": {},
                                                            "source": f"round {self.server.version}"})
        del self.server.starts[:]

    def active(self) -> set[str]:
        return self.members.active()

    def stop_reason(self) -> Optional[str]:
        stop = self.sc.stop
        if self.stop_event.is_set():
            return "interrupted"
        if stop.steps is not None and self.server.version >= stop.steps:
            return "steps"
        if stop.seconds is not None and time.time() - self.start >= stop.seconds:
            return "seconds"
        if self.members.all_left():
            return "all workers left"
        return None

    def report(self) -> dict:
        return {"version": self.server.version, "updates_received": self.server.updates_received,
                "stop_reason": self.reason, "ingress_payload_bytes": self.ingress_payload,
                "transport_bytes_sent": self.ep.bytes_sent, "transport_bytes_received": self.ep.bytes_received,
                "workers_joined": sorted(self.members.joined), "strategy": self.strategy.report(),
                "messages_dropped": dict(self.ep.dropped),
                **({"parked_trainers": self.parked.report()} if self.parked is not None else {})}

    # -- messages ----------------------------------------------------------------------------
    def serve(self, msgs) -> None:
        for sender, msg, nbytes in msgs:
            if sender in self.faulty and msg.kind != "hello":  # only a restart (hello) lets it back in
                self.ep.dropped.add("from a faulty worker")
                continue
            try:
                self.handle(sender, msg, nbytes)
            except Exception as e:  # a node's bytes never end the PS: drop the message, say so
                self.refuse(sender, msg.kind, e)

    def refuse(self, sender: str, kind: str, error: Exception) -> None:
        self.ep.dropped.add("refused" if isinstance(error, BAD_MESSAGE) else untrusted.error_reason(error),
                            f"{kind[:20]} from {sender}: {type(error).__name__}")
        self.events.write(time=self.cfg.now(), target=sender, action="message_refused",
                          detail=f"{kind[:20]}: {type(error).__name__}: {str(error)[:120]}")
        if sender not in self.members.joined:
            return
        self.refused[sender] = self.refused.get(sender, 0) + 1
        if self.refused[sender] > MAX_REFUSED:  # faulty, not unlucky: out of the run, as a lost worker is
            self.faulty.add(sender)
            self.lose(sender, f"{self.refused.pop(sender)} malformed messages")
        elif kind == "push" and sender in self.members.active():
            self.send_model(sender)  # a worker waits for an answer to each push: the model as it is

    def handle(self, sender: str, msg: Message, nbytes: int) -> None:
        if sender != "eval":
            self.members.heard[sender] = time.time()
        if msg.kind == "hello":
            self.on_hello(sender)
            return
        m = self.members
        if sender in m.left and sender in m.joined and msg.kind in ("push", "vote"):
            self.rejoin(sender, "answered again")  # it was lost (frozen, cut off) and is back
        if msg.kind == "push":
            self.on_push(sender, msg, nbytes)
        elif msg.kind == "eval_ready":
            self.feed.on_ready()
        elif msg.kind == "target_reached":
            self.reason = self.reason or "target_accuracy"
        elif msg.kind == "vote":
            m.waiting.add(sender)
            self.tell(self.strategy.server_on_vote(self.server, sender, bool(msg.meta["flag"])))
        elif msg.kind == "bye":
            self.leave(sender)

    def on_hello(self, sender: str) -> None:
        m = self.members
        self.faulty.discard(sender)
        if sender == "eval":
            self.feed.on_ready()
            if self.server.version == 0:
                self.snapshot()  # accuracy of the initial model: the curves start at step 0
        elif sender in m.joined and self.strategy.per_round:  # a trainer started for a round
            if self.parked is not None:
                self.parked.take(sender)  # a new trainer for its device: an old one's place is gone
            self.send_model(sender)
        elif sender in m.joined:  # a restarted worker: what it had pending died with it
            if sender not in m.left:
                self.leave(sender)
            m.held.add(sender)  # admitted between rounds (admit())
        else:
            m.joined.add(sender)
            self.send_model(sender)

    def on_push(self, sender: str, msg: Message, nbytes: int) -> None:
        if self.reason is not None:
            return
        server = self.server
        meta = PushMeta.from_wire(msg.meta)  # a malformed push is refused before anything changes
        base_version = meta.base_version
        self.ingress_payload += nbytes
        server.updates_received += 1
        self.members.waiting.add(sender)
        before = len(server.log)
        server.push_meta = meta
        answer = self.strategy.server_on_push(server, sender, msg.tensors, base_version)
        self.record(before, sender, nbytes)
        self.answer(answer)
        self.maybe_snapshot()

    def record(self, before: int, sender: Optional[str] = None, nbytes: int = 0) -> None:
        """What the strategy logged since `before`: server.csv's rows, and rounds.csv's (fedavg)."""
        server, now = self.server, self.cfg.now()
        for w, staleness, lr in server.log[before:]:
            self.log.write(time=now, version=server.version, worker=w, staleness=staleness, lr=lr,
                           payload_bytes=nbytes if w == sender else None)
        del server.log[:]
        if server.rounds and self.rounds is None:
            self.rounds = channel.open_table(self.cfg, "rounds.csv")
        for row in server.rounds:
            self.rounds.write(time=now, **round_row(row))
        del server.rounds[:]

    def send(self, msg: Message, to: str) -> bool:
        """Whether it left: False when `to`'s connection is gone (killed, crashed): it is lost."""
        m = self.members
        try:
            self.ep.send(msg, to)
        except zmq.ZMQError:
            m.unreachable.append(to)
            return False
        if to in m.waiting:  # it has work again: its silence counts from now
            m.waiting.discard(to)
            m.heard[to] = time.time()
        return True

    def send_model(self, to: str) -> bool:
        meta = {"version": self.server.version, **self.strategy.server_reply_meta(self.server, to)}
        if self.parked is not None and meta.get("selected") is False:  # a per-round trainer the round left out
            meta["park"] = self.park(to)
        return self.send(Message("model", self.server.params, meta), to)

    def park(self, worker: str) -> bool:
        """Whether `worker`'s trainer waits parked for a later round (else it ends); the oldest
        parked ones past the capacity are told to end."""
        if self.parked is None:
            return False
        ended = self.parked.park(worker)
        send_stop(self.ep, [w for w in ended if w != worker], "parked trainers past their capacity")
        return worker not in ended

    def tell(self, result) -> None:
        """Send a completed vote's outcome (SelSync's all-gathered flags) to the voters."""
        if result is not None:
            voters, outcome = result
            for w in voters:
                self.send(Message("decision", meta={"sync": outcome, "version": self.server.version}), w)

    # -- membership --------------------------------------------------------------------------
    def leave(self, w: str) -> None:
        """`w` is out of the run: the strategy goes on without it (a vote may now be complete)."""
        self.members.left.add(w)
        self.members.waiting.discard(w)
        self.answer(self.strategy.server_on_leave(self.server, w))
        self.tell(self.strategy.server_on_vote(self.server, None, False))

    def lose(self, w: str, why: str) -> None:
        """A worker stopped answering: go on without it (or stop), and say so in events.csv."""
        m, faults = self.members, self.sc.faults
        if w in m.left or w not in m.joined:
            return
        self.events.write(time=self.cfg.now(), target=w, action="lost", detail=f"{why}; {faults.on_worker_loss}")
        if faults.on_worker_loss == "stop":
            self.reason = self.reason or f"worker {w} lost ({why})"
            return
        self.leave(w)

    def rejoin(self, w: str, why: str) -> None:
        self.members.left.discard(w)
        self.strategy.server_on_join(self.server, w)
        self.events.write(time=self.cfg.now(), target=w, action="rejoined",
                          detail=f"{why}; model version {self.server.version}")

    def admit(self) -> None:
        held = self.members.held
        if held and not self.strategy.round_open():
            for w in sorted(held):
                self.rejoin(w, "restarted")
                self.send_model(w)
            held.clear()

    def check_lost(self) -> None:
        m, timeout = self.members, self.sc.faults.worker_timeout
        if self.strategy.per_round:  # a trainer gone is a device idle again; a round's deadline covers the rest
            m.unreachable.clear()
            return
        while m.unreachable:
            self.lose(m.unreachable.pop(0), "unreachable")
        if not self.strategy.synchronous or timeout is None:
            return
        for w in m.silent(timeout):
            self.lose(w, f"silent for {timeout:g} s while the others waited")

    # -- evaluation --------------------------------------------------------------------------
    def snapshot(self, final: bool = False, again: bool = False) -> None:
        """Queue the model for the evaluator, once per version. A timed feed (`again`) of an unchanged
        version is queued as a repeat without tensors: the evaluator writes the last result again at
        this time, so eval.csv keeps a row every eval_seconds without re-sending or re-evaluating."""
        server = self.server
        repeat = server.version == self.last_eval_version
        if repeat and not again:
            return
        self.last_eval_version = server.version
        self.feed.add({} if repeat else {k: v.clone() for k, v in server.params.items()},
                      {"version": server.version, "updates_received": server.updates_received,
                       "time": self.cfg.now(), "final": final, "repeat": repeat})

    def maybe_snapshot(self) -> None:
        if self.schedule.due(self.server.version, self.cfg.now()):
            self.snapshot(again=self.schedule.timed)


def round_row(r: dict) -> dict:
    """A strategy's round record as rounds.csv's row: counts, and the names space-separated."""
    names = {k: r[k] for k in ("online", "selected", "finished", "dropped")}
    return {"round": r["round"], "reason": r["reason"], "open_seconds": r["open_seconds"],
            **{f"n_{k}": len(v) for k, v in names.items()}, **{k: " ".join(v) for k, v in names.items()},
            "report_seconds": " ".join(f"{s:.3f}" for s in r.get("report_seconds", []))}


def run_ps(cfg: RoleConfig, stop_event) -> None:
    ParameterServer(cfg, stop_event).run()
