"""The timeline from the runner's side: the runner schedules the scenario's events and the control
requests (timeline.Timeline), the live-ops object makes each change (LiveOps.apply_change); the
runner adds only what it alone can do (start a node's role again), keeps the nodes killed on
purpose apart from crashed ones, and writes each change to events.csv and the console."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from testbed.plan.cluster import ClusterSpec, Node
from testbed.records import metrics
from testbed.run.monitor import LiveState
from testbed.run.timeline import Change, Timeline, expand_events
from testbed.scenario.schema import Scenario


class Events:
    """Applies and records the timeline's changes for one run. `start(node)` starts a node's role."""

    def __init__(self, runtime, spec: ClusterSpec, procs: dict, start: Callable[[Node], None], live: LiveState,
                 run_dir: Path, say: Callable[[str], None], per_round: bool = False):
        self.runtime, self.spec, self.procs, self.start_role = runtime, spec, procs, start
        self.live, self.run_dir, self.say = live, run_dir, say
        self.per_round = per_round  # workers' trainers start when the PS selects them (run/trainers.py)
        self.dilation = spec.dilation
        self.table = metrics.open_table(run_dir, "events.csv", spec.dilation)  # open while the run goes on

    def start(self, sc: Scenario, t0: float) -> Timeline:
        """The scenario's events, applied by a thread of this process when due, and the requests of
        `edgebed link/kill/...` (timeline.py)."""
        from testbed.records.columns import CONTROL_DIR

        hub = self.runtime.hub
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
