"""Replaying recorded link traces: every tick (a trace's resolution, 100 ms by default) each
traced node's rates are set in place (the HTB class's rate: `LiveOps.set_rates`, never a qdisc
rebuilt), up and down of a node from one schedule read at one instant of one clock, so the two
directions cannot drift apart. A trace loops or holds its last rate at its end; each node starts
at its own offset (scenario/traces.py: `TraceSchedule`, `node_offset`).

The engine is clock-driven and catches up by skipping: a tick that comes late applies the rate
due now, never a burst of the ticks it missed. It runs where the runner is, for every runtime:
netns and docker change the class from the host; swarm sends the change to the node's own process
(own_link), which makes it in place in its namespace.

Bursty loss (`burst_loss: {p, r, good_loss, bad_loss}`): `GilbertElliott` moves a direction
between a good and a bad state at each tick (a two-state Markov chain) and the link's loss is set
to the state's (`set_link(loss=)`: netem's loss where the kernel has netem; here, without netem,
the bpf drop filter, replaced on each change of state, the HTB class untouched). The state holds
for whole ticks, so bursts last whole ticks (100 ms by default), not a number of packets as in
netem's per-packet `loss gemodel`; within a tick, drops are independent at the state's rate.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from pathlib import Path

from testbed.records.columns import LINK_RATE_COLUMNS, LINK_RATES_FILE
from testbed.records.metrics import CsvLog
from testbed.scenario.traces import TraceSchedule, direction_schedule

DIRECTIONS = (("up", "uplink"), ("down", "downlink"))


@dataclass
class NodeReplay:
    """One node's traced directions ("up"/"down" -> schedule), its bursty-loss chains, and what
    each was last set to."""

    node: str
    schedules: dict[str, TraceSchedule]
    applied: dict[str, float] = field(default_factory=dict)
    losses: dict[str, "GilbertElliott"] = field(default_factory=dict)
    applied_loss: dict[str, float] = field(default_factory=dict)

    def due(self, t: float) -> dict[str, float]:
        """The rates due `t` seconds after the nodes' start that differ from what is set."""
        rates = {w: s.rate_at(t) for w, s in self.schedules.items()}
        return {w: r for w, r in rates.items() if self.applied.get(w) != r}

    def loss_due(self) -> dict[str, float]:
        """Each bursty-loss chain one tick on: the losses that differ from what is set."""
        losses = {w: ge.step() for w, ge in self.losses.items()}
        return {w: p for w, p in losses.items() if self.applied_loss.get(w) != p}


def replays_of(spec, seed: int) -> list[NodeReplay]:
    """The traced nodes of a cluster (plan.cluster.ClusterSpec): their schedules from their links,
    a Gilbert-Elliott chain per direction with `burst_loss` (seeded per node and direction)."""
    out = []
    for node in spec.nodes:
        dirs = {w: getattr(node.link, name) for w, name in DIRECTIONS}
        scheds = {w: direction_schedule(d, w, seed, node.name) for w, d in dirs.items()}
        present = {w: s for w, s in scheds.items() if s is not None}
        losses = {w: GilbertElliott(d.burst_loss.p, d.burst_loss.r, d.burst_loss.good_loss, d.burst_loss.bad_loss,
                                    rng=random.Random(f"{seed}:{node.name}:{w}:loss"))
                  for w, d in dirs.items() if getattr(d, "burst_loss", None) is not None}
        if present or losses:
            out.append(NodeReplay(node.name, present, {w: s.rate_at(0.0) for w, s in present.items()}, losses))
    return out


class TraceReplay:
    """Sets each traced node's rates when due. `set_rates(node, {"up": bit/s, ...})` changes them
    in place; `record(t, node, which, rate, trace_time)` writes one down. `clock` is wall time
    and `t0` the nodes' start."""

    def __init__(self, nodes: list[NodeReplay], set_rates: Callable[[str, dict[str, float]], None],
                 record: Callable[[float, str, str, float, float], None], t0: float,
                 clock: Callable[[], float] = time.time, sleep: Optional[Callable[[float], None]] = None,
                 set_loss: Optional[Callable[[str, str, float], None]] = None):
        self.nodes, self.set_rates, self.record, self.t0, self.clock = nodes, set_rates, record, t0, clock
        self.set_loss = set_loss  # (node, "up"/"down", probability): the bursty-loss chains' state
        self.tick = min((s.resolution for n in nodes for s in n.schedules.values()), default=0.1)
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s))
        self._thread: Optional[threading.Thread] = None
        self.counts = {"ticks": 0, "changes": 0, "failed": 0, "late_ticks": 0}
        self.errors: list[str] = []

    def run_once(self, t: float) -> None:
        """Apply what is due at run time `t` (seconds since the nodes started)."""
        self.counts["ticks"] += 1
        for n in self.nodes:
            self._step_losses(n)
            rates = n.due(t)
            if not rates:
                continue
            try:
                self.set_rates(n.node, rates)
            except Exception as e:  # one node's failure must not stop the others' replay
                self.counts["failed"] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{n.node}: {type(e).__name__}: {e}")
                continue
            n.applied.update(rates)
            self.counts["changes"] += len(rates)
            for which, rate in rates.items():
                sched = n.schedules[which]
                self.record(t, n.node, which, rate, (t + sched.offset) % sched.duration if sched.loop else t + sched.offset)

    def _step_losses(self, n: NodeReplay) -> None:
        set_loss = self.set_loss
        if set_loss is None:
            return
        for which, p in n.loss_due().items():
            try:
                set_loss(n.node, which, p)
                n.applied_loss[which] = p
                self.counts["changes"] += 1
            except Exception as e:  # as a rate change: counted, said, the replay goes on
                self.counts["failed"] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{n.node} loss: {type(e).__name__}: {e}")

    def _loop(self) -> None:
        k = 1  # tick 0 is the bring-up's rate
        while not self._stop.is_set():
            due = self.t0 + k * self.tick
            wait = due - self.clock()
            if wait > 0:
                self._sleep(wait)
                if self._stop.is_set():
                    return
            elif -wait > self.tick:  # late by a tick or more: skip to the one due now
                skipped = int(-wait / self.tick)
                self.counts["late_ticks"] += skipped
                k += skipped
            self.run_once(k * self.tick)
            k += 1

    def start(self) -> None:
        if self.nodes:
            self._thread = threading.Thread(target=self._loop, name="edgebed-trace-replay", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def start_replay(runtime, spec, seed: int, run_dir: Path, t0: float) -> Optional[TraceReplay]:
    """Replay the cluster's link traces on `runtime` (its `set_rates`), each change written to
    RUN/link_rates.csv (the bring-up's rates as its first rows); None when no link has a trace."""
    nodes = replays_of(spec, seed)
    if not nodes:
        return None
    path = Path(run_dir) / LINK_RATES_FILE
    path.write_text(",".join(LINK_RATE_COLUMNS) + "\n")
    table = CsvLog(path, LINK_RATE_COLUMNS)

    def record(t: float, node: str, which: str, rate: float, trace_time: float) -> None:
        table.write(time=t, node=node, direction=which, rate_bps=rate, trace_time=trace_time)

    for n in nodes:
        for which, rate in n.applied.items():
            record(0.0, n.node, which, rate, n.schedules[which].offset)
        n.applied_loss.update({which: 0.0 for which in n.losses})  # the chains start good (no loss set yet)
    replay = TraceReplay(nodes, runtime.set_rates, record, t0,
                         set_loss=lambda node, which, p: runtime.set_link(node, which, {"loss": p}))
    replay.start()
    return replay


@dataclass
class GilbertElliott:
    """Two-state bursty loss: from good to bad with probability `p` per tick, from bad to good
    with `r`; loss `good_loss` in the good state, `bad_loss` in the bad one (netem's gemodel
    parameters p, r, 1-k, 1-h, with the state kept per tick)."""

    p: float
    r: float
    good_loss: float = 0.0
    bad_loss: float = 1.0
    bad: bool = False
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def step(self) -> float:
        """Move one tick on; the loss probability of the state it is now in."""
        if self.rng.random() < (self.r if self.bad else self.p):
            self.bad = not self.bad
        return self.bad_loss if self.bad else self.good_loss

    def mean_loss(self) -> float:
        """The long-run loss: the bad state's share (p / (p + r)) of bad_loss, the rest of good_loss."""
        share = self.p / (self.p + self.r) if self.p + self.r > 0 else 0.0
        return share * self.bad_loss + (1 - share) * self.good_loss
