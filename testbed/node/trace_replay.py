"""Replaying recorded link traces: every tick (a trace's resolution, 100 ms by default) each
traced node's rates are set in place (the HTB class's rate: `LiveOps.set_rates`, never a qdisc
rebuilt), up and down of a node from one schedule read at one instant of one clock, so the two
directions cannot drift apart. A trace loops or holds its last rate at its end; each node starts
at its own offset (scenario/traces.py: `TraceSchedule`, `node_offset`).

The engine is clock-driven and catches up by skipping: a tick that comes late applies the rate
due now, never a burst of the ticks it missed. On netns and docker it runs in the runner, which
changes the classes from the host; on swarm it runs in each node's own supervisor (control.Replay:
`schedules_from_wire`), which changes its own link's classes (own_link.OwnLink.set_rates).
A node whose link went away with it (a docker container that exited: Docker removes its veth
pair) makes `set_rates` raise `LinkGone`: the replay leaves that node (summary.json's
trace_replay.ended), a change that failed otherwise is counted as failed with where it raised.

A timeline `link` event with a trace (run/events.py) hands its schedules to a running replay
(`follow`): from the event's time they replace that direction's earlier trace, at the trace's own
resolution, on the same clock; a later event that sets the direction's rate ends it (`unfollow`).
A schedule that starts at run time T has its offset moved back by T (`starting_at`).

A latency trace (scenario/latency_traces.py) is a second schedule per direction (`delays`), of
one-way delays, on the same clock: `set_delay(node, which, seconds)` is called when the delay due
differs from the one set (the runner's `set_link(latency=)` on every runtime).

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
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from testbed.errors import RunFailed
from testbed.scenario.traces import TraceSchedule


class LinkGone(RunFailed):
    """A node's link no longer exists because the node ended and took it along (a docker
    container that exits removes its veth pair). Raised by a runtime's `set_rates`: the replay
    stops for that node (counted as `ended`), since there is nothing left to shape."""


@dataclass
class NodeReplay:
    """One node's traced directions ("up"/"down" -> schedule), its bursty-loss chains, and what
    each was last set to."""

    node: str
    schedules: dict[str, TraceSchedule]
    applied: dict[str, float] = field(default_factory=dict)
    losses: dict[str, "GilbertElliott"] = field(default_factory=dict)
    applied_loss: dict[str, float] = field(default_factory=dict)
    delays: dict[str, TraceSchedule] = field(default_factory=dict)  # one-way delay (s) per tick
    applied_delay: dict[str, float] = field(default_factory=dict)

    def due(self, t: float) -> dict[str, float]:
        """The rates due `t` seconds after the nodes' start that differ from what is set."""
        rates = {w: s.rate_at(t) for w, s in self.schedules.items()}
        return {w: r for w, r in rates.items() if self.applied.get(w) != r}

    def delay_due(self, t: float) -> dict[str, float]:
        """The one-way delays due at `t` that differ from what is set."""
        delays = {w: s.rate_at(t) for w, s in self.delays.items()}
        return {w: d for w, d in delays.items() if self.applied_delay.get(w) != d}

    def loss_due(self) -> dict[str, float]:
        """Each bursty-loss chain one tick on: the losses that differ from what is set."""
        losses = {w: ge.step() for w, ge in self.losses.items()}
        return {w: p for w, p in losses.items() if self.applied_loss.get(w) != p}


class TraceReplay:
    """Sets each traced node's rates when due. `set_rates(node, {"up": bit/s, ...})` changes them
    in place; `record(t, node, which, rate, trace_time, delay)` writes a direction's state down
    (rate or delay None: not traced). `clock` is wall time and `t0` the nodes' start."""

    def __init__(self, nodes: list[NodeReplay], set_rates: Callable[[str, dict[str, float]], None],
                 record: Callable[..., None], t0: float,
                 clock: Callable[[], float] = time.time, sleep: Optional[Callable[[float], None]] = None,
                 set_loss: Optional[Callable[[str, str, float], None]] = None,
                 set_delay: Optional[Callable[[str, str, float], None]] = None, tick: Optional[float] = None):
        self.nodes, self.set_rates, self.record, self.t0, self.clock = list(nodes), set_rates, record, t0, clock
        self.set_loss = set_loss  # (node, "up"/"down", probability): the bursty-loss chains' state
        self.set_delay = set_delay  # (node, "up"/"down", one-way seconds): a latency trace's
        # `tick`: the finest resolution of the traces that events hand over later (`follow`); such a
        # replay keeps ticking with no node yet
        self.open = tick is not None
        self.tick = min((s.resolution for n in nodes for s in (*n.schedules.values(), *n.delays.values())),
                        default=tick if tick is not None else 0.1)
        if tick is not None:
            self.tick = min(self.tick, tick)
        self._lock = threading.Lock()  # `follow` comes from the timeline's thread, ticks from this one
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s))
        self._thread: Optional[threading.Thread] = None
        self.counts = {"ticks": 0, "changes": 0, "failed": 0, "late_ticks": 0, "ended": 0}
        self.errors: list[str] = []

    def run_once(self, t: float) -> None:
        """Apply what is due at run time `t` (seconds since the nodes started)."""
        with self._lock:
            self._run_once(t)

    def _run_once(self, t: float) -> None:
        self.counts["ticks"] += 1
        for n in list(self.nodes):
            try:
                self._step_losses(n, t)
                self._step_rates(n, t)
                self._step_delays(n, t)
            except LinkGone:  # the node ended, its link with it: nothing is left to replay on
                self.nodes.remove(n)
                self.counts["ended"] += 1

    def _step_rates(self, n: NodeReplay, t: float) -> None:
        rates = n.due(t)
        if not rates:
            return
        try:
            self.set_rates(n.node, rates)
        except LinkGone:
            raise
        except Exception as e:  # one node's failure must not stop the others' replay
            self.counts["failed"] += 1
            self._said(f"{n.node}", e, t)
            return
        n.applied.update(rates)
        self.counts["changes"] += len(rates)
        for which, rate in rates.items():
            self.record(t, n.node, which, rate, n.schedules[which].trace_time(t), n.applied_delay.get(which))

    def _step_delays(self, n: NodeReplay, t: float) -> None:
        """A latency trace's tick: each direction's delay that changed, one call per direction."""
        set_delay = self.set_delay
        if set_delay is None:
            return
        for which, delay in n.delay_due(t).items():
            try:
                set_delay(n.node, which, delay)
            except LinkGone:
                raise
            except Exception as e:  # as a rate change: counted, said, the replay goes on
                self.counts["failed"] += 1
                self._said(f"{n.node} delay", e, t)
                continue
            n.applied_delay[which] = delay
            self.counts["changes"] += 1
            self.record(t, n.node, which, n.applied.get(which), n.delays[which].trace_time(t), delay)

    def node(self, name: str) -> Optional[NodeReplay]:
        return next((n for n in self.nodes if n.node == name), None)

    def follow(self, name: str, which: str, rates: TraceSchedule, delays: Optional[TraceSchedule] = None,
               now: Optional[float] = None) -> NodeReplay:
        """From now on a node's direction follows `rates` (and `delays`, one-way, where the trace has
        them) in place of any trace it followed: set at run time `now` (None: at the next tick),
        so the trace's first tick is not lost. The node's replay after it."""
        with self._lock:
            n = self.node(name)
            if n is None:
                n = NodeReplay(name, {})
                self.nodes.append(n)
            n.schedules[which] = rates
            n.applied.pop(which, None)
            if delays is not None:
                n.delays[which] = delays
                n.applied_delay.pop(which, None)
            else:
                n.delays.pop(which, None)
            if now is not None:
                self._step_rates(n, now)
                self._step_delays(n, now)
            return n

    def unfollow(self, name: str, which: str) -> Optional[NodeReplay]:
        """A node's direction follows no trace from now on (its rate is set otherwise): the node's
        replay after it, or None where that direction followed none."""
        with self._lock:
            n = self.node(name)
            if n is None or which not in n.schedules:
                return None
            del n.schedules[which]
            n.applied.pop(which, None)
            n.delays.pop(which, None)
            n.applied_delay.pop(which, None)
            return n

    def forget_applied(self) -> None:
        """Apply every node's due rates and delays again at the next tick (the link was reshaped
        from elsewhere: a timeline's change sets the rate the runner last knew)."""
        for n in self.nodes:
            n.applied.clear()
            n.applied_delay.clear()

    def _said(self, where: str, e: Exception, t: Optional[float] = None) -> None:
        """A failed change in summary.json, with when (run time) and the line that raised it (a rare
        one is a race to find)."""
        if len(self.errors) < 20:
            tb = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ is not None else []
            at = f" at {Path(tb[0].filename).name}:{tb[0].lineno}" if tb else ""
            when = f" ({t:.1f} s)" if t is not None else ""
            self.errors.append(f"{where}{when}: {type(e).__name__}: {e}{at}")

    def _step_losses(self, n: NodeReplay, t: float) -> None:
        set_loss = self.set_loss
        if set_loss is None:
            return
        for which, p in n.loss_due().items():
            try:
                set_loss(n.node, which, p)
                n.applied_loss[which] = p
                self.counts["changes"] += 1
            except LinkGone:
                raise
            except Exception as e:  # as a rate change: counted, said, the replay goes on
                self.counts["failed"] += 1
                self._said(f"{n.node} loss", e, t)

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
        if self.nodes or self.open:
            self._thread = threading.Thread(target=self._loop, name="edgebed-trace-replay", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


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


def starting_at(schedule: TraceSchedule, at: float) -> TraceSchedule:
    """`schedule` begun at run time `at` instead of at the nodes' start: at `at` it is where its
    offset says (before `at` it is not followed)."""
    return replace(schedule, offset=schedule.offset - at)


MAX_START_S = 366 * 86400.0  # how late in a run an event's trace may start (`starting_at`), on the wire
MAX_TICKS = 200_000  # a schedule's ticks a node takes (a week at 100 ms would be 6 M: loop a shorter one)


def schedules_to_wire(schedules: dict[str, TraceSchedule]) -> dict:
    """A node's schedules as a control message carries them (rates in whole bit/s)."""
    return {w: {"rates": [int(r) for r in s.rates], "resolution": s.resolution, "loop": s.loop, "offset": s.offset}
            for w, s in schedules.items()}


def schedules_from_wire(data: dict) -> dict[str, TraceSchedule]:
    """The schedules of a control message, checked (ValueError naming the direction and field)."""
    from testbed.scenario.traces import MAX_RATE_BPS, MAX_RESOLUTION_S, MIN_RESOLUTION_S

    out = {}
    for which, d in data.items():
        if which not in ("up", "down") or not isinstance(d, dict):
            raise ValueError("schedules: keys are up and down, each a mapping")
        rates, res, offset = d.get("rates"), d.get("resolution"), d.get("offset", 0.0)
        if not isinstance(rates, list) or not 0 < len(rates) <= MAX_TICKS or \
                not all(type(r) in (int, float) and 0 <= r <= MAX_RATE_BPS for r in rates):
            raise ValueError(f"schedules.{which}.rates: not a list of 1-{MAX_TICKS} rates in bit/s")
        if (not isinstance(res, (int, float)) or isinstance(res, bool)
                or not MIN_RESOLUTION_S <= res <= MAX_RESOLUTION_S):
            raise ValueError(f"schedules.{which}.resolution: not within {MIN_RESOLUTION_S}-{MAX_RESOLUTION_S} s")
        if not isinstance(offset, (int, float)) or isinstance(offset, bool) or \
                not -MAX_START_S <= offset <= len(rates) * res:
            raise ValueError(f"schedules.{which}.offset: not within the trace, nor a start within a year")
        out[which] = TraceSchedule(tuple(float(r) for r in rates), float(res), d.get("loop") is not False,
                                   float(offset))
    return out
