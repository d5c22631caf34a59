"""The coordinator of a decentralized run, on the `ps` node; it carries no training traffic.

It starts the workers together, stops them (seconds, target accuracy, or when all finished
`stop.steps` iterations) and feeds the evaluator the average of their replicas (replicas.py).
With `eval_seconds: T` it evaluates every T seconds instead of every `eval_interval` steps, and
workers refresh their replicas every T / REPLICA_REFRESH seconds so that what it averages is at
most that (plus a step) old.
"""

from __future__ import annotations

import time
from typing import Optional

import zmq

from testbed.node import transport, untrusted
from testbed.node.roles.common import EvalFeed, RoleConfig, ServingRole, model_and_data, params_of, setup_torch
from testbed.node.roles.eval_schedule import EvalSchedule
from testbed.node.roles.replicas import ReplicaBoard, replica_limit
from testbed.node.wire import Message


class Coordinator(ServingRole):
    def __init__(self, cfg: RoleConfig, stop_event):
        self.cfg, self.stop_event = cfg, stop_event
        self.sc = sc = cfg.scenario_model()
        setup_torch(cfg, sc)
        model, _ = model_and_data(sc)
        self.initial = params_of(model)
        self.zctx = zmq.Context()
        self.ep = transport.ps_endpoint(self.zctx, cfg.ps_address, cfg.delay, seed=sc.seed, max_frame=1 << 20)
        self.ep.senders = transport.known_senders([*cfg.workers, "eval"], cfg.addresses)
        self.feed = EvalFeed(self.ep, self.cfg.now)
        self.workers = set(cfg.workers)
        self.board = ReplicaBoard(cfg.control, self.workers, {n: t.shape for n, t in self.initial.items()},
                                  max_bytes=replica_limit(self.initial))
        self.joined: set[str] = set()
        self.left: set[str] = set()
        self.steps = {w: 0 for w in self.workers}
        self.inbox_drops: dict[str, dict[str, int]] = {}  # each worker's inbox, as it last said
        self.schedule = EvalSchedule(sc.workload.eval_interval, sc.workload.eval_seconds)
        self.fed: tuple[dict, dict] = ({}, {})  # the replica steps and the meta of the last feed
        self.started = False
        self.reason: Optional[str] = None
        self.start = time.time()

    def active(self) -> set[str]:
        return self.joined - self.left

    def tend(self) -> None:
        """The replicas that came meanwhile, taken: their queue is bounded, and past it the hub
        drops parts of them."""
        self.board.refresh()

    def wind_down(self) -> None:
        """The workers write their final replicas as they stop: wait for them (10 s at most)."""
        deadline = time.time() + 10
        while self.left < self.joined and time.time() < deadline and not self.stop_event.is_set():
            self.serve(self.ep.recv(0.05))
            self.tend()

    def stop_reason(self) -> Optional[str]:
        stop = self.sc.stop
        if self.stop_event.is_set():
            return "interrupted"
        if stop.seconds is not None and time.time() - self.start >= stop.seconds:
            return "seconds"
        if self.joined and self.left >= self.joined:
            done = stop.steps is not None and all(s >= stop.steps for s in self.steps.values())
            return "steps" if done else "all workers left"
        return None

    def report(self) -> dict:
        return {"version": max(self.steps.values()) if self.steps else 0, "updates_received": sum(self.steps.values()),
                "stop_reason": self.reason, "decentralized": True, "ingress_payload_bytes": 0,
                "transport_bytes_sent": self.ep.bytes_sent, "transport_bytes_received": self.ep.bytes_received,
                "workers_joined": sorted(self.joined), "messages_dropped": self.dropped()}

    def dropped(self) -> dict[str, int]:
        """What the coordinator dropped, and what each worker's inbox did ("w1 inbox: malformed")."""
        out = dict(self.ep.dropped)
        for worker, counts in sorted(self.inbox_drops.items()):
            out.update({f"{worker} inbox: {reason}": n for reason, n in counts.items()})
        return out

    def note_inbox_drops(self, sender: str, meta: dict) -> None:
        """A worker's own count of what its inbox dropped (cumulative), if it is well formed."""
        counts = meta.get("dropped")
        if isinstance(counts, dict) and len(counts) <= 8 and all(
                isinstance(k, str) and len(k) <= 40 and type(v) is int and v >= 0 for k, v in counts.items()):
            self.inbox_drops[sender] = counts

    def mean_step(self) -> float:
        return sum(self.steps.values()) / len(self.steps)

    def serve(self, msgs) -> None:
        for sender, msg, _ in msgs:
            try:
                self.handle(sender, msg)
            except (KeyError, ValueError, TypeError, OverflowError) as e:  # a node's bytes never end the run
                self.ep.dropped.add("refused", f"{msg.kind[:20]} from {sender}: {type(e).__name__}")
            except Exception as e:  # nor does a handler's error: that message is dropped, and counted
                self.ep.dropped.add(untrusted.error_reason(e), f"{msg.kind[:20]} from {sender}: {e}")
        if not self.started and self.joined >= self.workers:
            self.started = True
            for w in sorted(self.workers):
                self.ep.send(Message("go"), w)

    def handle(self, sender: str, msg: Message) -> None:
        if msg.kind == "hello":
            self.on_hello(sender)
        elif msg.kind == "progress":
            if sender not in self.workers:
                raise ValueError(f"progress from {sender}, not a worker")
            self.steps[sender] = int(msg.meta["step"])
            self.note_inbox_drops(sender, msg.meta)
            self.maybe_snapshot()
        elif msg.kind == "bye":
            self.left.add(sender)
            if "step" in msg.meta:
                self.steps[sender] = int(msg.meta["step"])
            self.note_inbox_drops(sender, msg.meta)
        elif msg.kind == "eval_ready":
            self.feed.on_ready()
        elif msg.kind == "target_reached":
            self.reason = self.reason or "target_accuracy"

    def on_hello(self, sender: str) -> None:
        if sender != "eval":
            self.joined.add(sender)
            return
        self.feed.on_ready()
        meta = {"version": 0, "updates_received": 0, "time": self.cfg.now(), "final": False, "repeat": False}
        self.fed = ({}, meta)  # no replicas yet: the initial model
        self.feed.add(self.initial, meta)

    def snapshot(self, final: bool = False, again: bool = False) -> None:
        """Queue the average of the replicas (the model the workers agree on) for evaluation. A timed
        feed (`again`) of unchanged replicas is a repeat without tensors and with the last feed's
        version: the evaluator writes its last result again at this time (see ps.ParameterServer)."""
        if final:  # the last replicas travel apart from the workers' goodbyes: wait for them (5 s at most)
            reps = self.board.wait_for({w: self.steps[w] for w in self.left}, timeout=5.0)
        else:
            reps = self.board.refresh()
        key = {w: int(r["step"]) for w, r in reps.items()}
        if again and key == self.fed[0] and self.fed[1]:
            self.feed.add({}, {**self.fed[1], "time": self.cfg.now(), "repeat": True})
            return
        if not reps:
            return
        for w, step in key.items():
            self.steps[w] = max(self.steps.get(w, 0), step)
        avg = {n: sum(r["params"][n] for r in reps.values()) / len(reps) for n in self.initial}
        meta = {"version": round(self.mean_step()), "updates_received": sum(self.steps.values()),
                "time": self.cfg.now(), "final": final, "replicas": len(reps), "repeat": False}
        self.fed = (key, meta)
        self.feed.add(avg, meta)

    def maybe_snapshot(self) -> None:
        if self.schedule.due(self.mean_step(), self.cfg.now()):
            self.snapshot(again=self.schedule.timed)


def run_coordinator(cfg: RoleConfig, stop_event) -> None:
    Coordinator(cfg, stop_event).run()
