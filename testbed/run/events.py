"""The timeline from the runner's side: the runner schedules the scenario's events and the control
requests (timeline.Timeline), the live-ops object makes each change (LiveOps.apply_change); the
runner adds only what it alone can do (start a node's role again), keeps the nodes killed on
purpose apart from crashed ones, and writes each change to events.csv and the console. A link
event's trace goes to the run's trace replay (LinkTraces), where a profile's traces are replayed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional

from testbed.node.trace_replay import TraceReplay, starting_at
from testbed.plan.cluster import ClusterSpec, Node
from testbed.records import metrics
from testbed.run.monitor import LiveState
from testbed.run.timeline import EVENT_TRACE_FIELDS, Change, Timeline, expand_events
from testbed.runtimes.replay import RunnerReplay
from testbed.scenario.latency_traces import delay_schedule
from testbed.scenario.links import Direction
from testbed.scenario.schema import Scenario
from testbed.scenario.traces import direction_schedule


class Events:
    """Applies and records the timeline's changes for one run. `start(node)` starts a node's role."""

    def __init__(self, runtime, spec: ClusterSpec, procs: dict, start: Callable[[Node], None], live: LiveState,
                 run_dir: Path, say: Callable[[str], None], per_round: bool = False,
                 replay: Optional[RunnerReplay] = None, seed: int = 0):
        self.runtime, self.spec, self.procs, self.start_role = runtime, spec, procs, start
        self.live, self.run_dir, self.say = live, run_dir, say
        self.per_round = per_round  # workers' trainers start when the PS selects them (run/trainers.py)
        self.dilation = spec.dilation
        self.table = metrics.open_table(run_dir, "events.csv", spec.dilation)  # open while the run goes on
        self.traces = LinkTraces(replay, seed, spec.dilation) if replay is not None else None
        self.t0 = 0.0

    def start(self, sc: Scenario, t0: float) -> Timeline:
        """The scenario's events, applied by a thread of this process when due, and the requests of
        `edgebed link/kill/...` (timeline.py)."""
        from testbed.records.columns import CONTROL_DIR

        hub = self.runtime.hub
        self.t0 = t0
        timeline = Timeline(expand_events(sc), self.apply, self.record, t0, step=lambda: self.live.step,
                            control_dir=self.run_dir / CONTROL_DIR, inbox=hub.take_requests if hub else None)
        timeline.dilation = self.dilation
        timeline.start()
        return timeline

    def apply(self, change: Change) -> str:
        n = change.node
        if change.action == "restart":
            return self._restart(n)
        if change.action == "kill":
            self.live.killed.add(n)
        if change.action == "link" and self.traces is not None:
            if "trace" in change.fields:  # a timed event's trace starts when it was due, not a tick late
                now = time.time() - self.t0
                return self.traces.follow(n, change.fields, change.time if change.time is not None else now, now)
            if "rate" in change.fields:  # the rate given holds: no trace sets it back
                ended = self.traces.unfollow(n, change.fields["direction"])
                return ended + self.runtime.apply_change(change.action, n, change.fields)
        return self.runtime.apply_change(change.action, n, change.fields)

    def _restart(self, n: str) -> str:
        detail = ""
        if self.per_round and self.spec.node(n).role == "worker":  # back online: drawn again, not started
            self.live.killed.discard(n)
            return "online again: its trainer starts when the PS selects it"
        if n in self.procs and self.procs[n].is_alive():
            self.live.killed.add(n)
            detail = self.runtime.kill_node(n) + "; "
            self.procs[n].join(timeout=5)
        self.start_role(self.spec.node(n))  # a new role process: a worker says hello and pulls the current model
        self.live.killed.discard(n)
        return detail + "started again"

    def record(self, change: Change, applied_at: float, detail: str) -> None:
        # a scenario event's time says where it came from; a request's or an availability plan's says why
        when = f"at_step {change.step}; " if change.step is not None else \
            f"{change.source}; " if change.time is None or not change.source.startswith("events[") else ""
        wall = f" (the wall's: k {self.dilation:g})" if self.dilation != 1 and change.fields else ""
        self.table.write(time=applied_at, scheduled_time=change.time, target=change.node, action=change.action,
                         detail=f"{when}{change.describe()} -> {detail}{wall}".strip())
        self.say(f"[{applied_at / self.dilation:7.1f}s] event {change.action} {change.node}: {detail}")


class LinkTraces:
    """Link events' traces, handed to the run's trace replay (runtimes.replay.RunnerReplay's `follow`): a
    direction's schedule is built as a profile's `trace:` is (at its resolution, loop and offset,
    the latency column too), begun at the event's time, in place of the direction's earlier trace."""

    def __init__(self, replay: TraceReplay, seed: int, dilation: float = 1.0):
        self.replay, self.seed, self.dilation = replay, seed, dilation  # a schedule is the wall's: dilated

    def follow(self, node: str, fields: dict, at: float, now: Optional[float] = None) -> str:
        """The event's trace followed from run time `at`; its rate due `now` (run time) set at once."""
        d = Direction(**{k: v for k, v in fields.items() if k in EVENT_TRACE_FIELDS})
        said = []
        for which in _directions(fields["direction"]):
            traced = direction_schedule(d, which, self.seed, node, self.dilation)
            if traced is None:  # (an event's fields always name a trace here)
                raise ValueError(f"{node}: a trace event without a trace")
            rates = starting_at(traced, at)
            delays = delay_schedule(d, which, self.seed, node, self.dilation)
            self.replay.follow(node, which, rates, starting_at(delays, at) if delays is not None else None,
                               now=at if now is None else max(now, at))
            said.append(f"{which} follows the trace from {at:.1f} s, every {rates.resolution:g} s"
                        + (" (its latency too)" if delays is not None else ""))
        return "; ".join(said)

    def unfollow(self, node: str, direction: str) -> str:
        """End the direction's trace (a profile's or an event's); what was ended, said first."""
        ended = [w for w in _directions(direction) if self.replay.unfollow(node, w) is not None]
        return f"{'+'.join(ended)} trace ended; " if ended else ""


def _directions(direction: str) -> tuple[str, ...]:
    return ("up", "down") if direction == "both" else (direction,)
