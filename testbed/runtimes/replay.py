"""The runner's side of trace replay (node.trace_replay has the engine): each traced node's
schedules from its links, and the replay started on a runtime, each change written to
RUN/link_rates.csv. A runtime whose nodes shape their own links from inside (swarm) hands each
node its schedules (`LiveOps.replay_on_node`): the node's own process then keeps the clock and
changes its HTB classes in place; the runner keeps the same clock to record the rates and keep its
books (`LiveOps.note_rates`). Loss chains and latency traces are the runner's on every runtime:
their changes are `set_link`'s (netem where the kernel has it, else the bpf loss filter and the
nodes' transport delay)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable, Optional

from testbed.kernel.files import replace_text
from testbed.node.trace_replay import GilbertElliott, NodeReplay, TraceReplay, schedules_to_wire
from testbed.records.columns import LINK_RATE_COLUMNS, LINK_RATES_FILE
from testbed.records.metrics import CsvLog
from testbed.scenario.latency_traces import delay_schedule
from testbed.scenario.traces import DEFAULT_RESOLUTION_S, TraceSchedule, direction_schedule

DIRECTIONS = (("up", "uplink"), ("down", "downlink"))


def replays_of(spec, seed: int) -> list[NodeReplay]:
    """The traced nodes of a cluster (plan.cluster.ClusterSpec): their schedules from their links,
    a Gilbert-Elliott chain per direction with `burst_loss` (seeded per node and direction)."""
    out = []
    for node in spec.nodes:
        dirs = {w: getattr(node.link, name) for w, name in DIRECTIONS}
        scheds = {w: direction_schedule(d, w, seed, node.name, spec.dilation) for w, d in dirs.items()}
        present = {w: s for w, s in scheds.items() if s is not None}
        delayed = {w: delay_schedule(d, w, seed, node.name, spec.dilation) for w, d in dirs.items()}
        delays = {w: s for w, s in delayed.items() if s is not None}
        losses = {w: GilbertElliott(d.burst_loss.p, d.burst_loss.r, d.burst_loss.good_loss, d.burst_loss.bad_loss,
                                    rng=random.Random(f"{seed}:{node.name}:{w}:loss"))
                  for w, d in dirs.items() if getattr(d, "burst_loss", None) is not None}
        if present or losses or delays:
            out.append(NodeReplay(node.name, present, {w: s.rate_at(0.0) for w, s in present.items()}, losses,
                                  delays=delays, applied_delay={w: s.rate_at(0.0) for w, s in delays.items()}))
    return out


def start_replay(runtime, spec, seed: int, run_dir: Path, t0: float,
                 tick: Optional[float] = None) -> Optional["RunnerReplay"]:
    """Replay the cluster's link traces on `runtime` (its `set_rates`), each change written to
    RUN/link_rates.csv (the bring-up's rates as its first rows); None when no link has a trace
    and no event will start one (`tick`: the finest resolution of the events' traces)."""
    nodes = replays_of(spec, seed)
    if not nodes and tick is None:
        return None
    path = Path(run_dir) / LINK_RATES_FILE
    replace_text(path, ",".join(LINK_RATE_COLUMNS) + "\n")
    table = CsvLog(path, LINK_RATE_COLUMNS, spec.dilation)

    def record(t: float, node: str, which: str, rate: Optional[float], trace_time: float,
               delay: Optional[float] = None) -> None:
        table.write(time=t, node=node, direction=which, rate_bps=rate, trace_time=trace_time, latency_s=delay)

    for n in nodes:
        for which in sorted({*n.applied, *n.applied_delay}):
            sched = n.schedules.get(which) or n.delays[which]
            record(0.0, n.node, which, n.applied.get(which), sched.offset, n.applied_delay.get(which))
        n.applied_loss.update({which: 0.0 for which in n.losses})  # the chains start good (no loss set yet)
    # the events' finest resolution, or a loss chain's tick, k times as long on the wall
    k = spec.dilation
    wall_tick = tick * k if tick is not None else (DEFAULT_RESOLUTION_S * k if k != 1 else None)
    replay = RunnerReplay(runtime, nodes, record, t0, wall_tick)
    for n in nodes:
        replay.hand_over(n)
    replay.start()
    return replay


class RunnerReplay(TraceReplay):
    """The runner's replay on a runtime. A node that replays its own schedules (swarm) is handed
    them again whenever an event changes them (`follow`, `unfollow`); the runner keeps the same
    clock to record the rates and keep its books (`note_rates`). Loss and delay change by the
    runner's clock on every runtime (`set_link`, which also publishes a transport delay where the
    kernel has no netem)."""

    def __init__(self, runtime, nodes: list[NodeReplay], record: Callable[..., None], t0: float,
                 tick: Optional[float] = None):
        self.runtime = runtime
        self.remote: set[str] = set()  # the nodes that replay themselves
        super().__init__(nodes, self._set_rates, record, t0,
                         set_loss=lambda node, which, p: runtime.set_link(node, which, {"loss": p}),
                         set_delay=lambda node, which, s: runtime.set_link(node, which, {"latency": s}), tick=tick)

    def _set_rates(self, node: str, rates: dict[str, float]) -> None:
        if node in self.remote:  # a node replaying itself changes its own link: the runner keeps its books
            self.runtime.note_rates(node, rates)
        else:
            self.runtime.set_rates(node, rates)

    def hand_over(self, n: NodeReplay) -> None:
        """Tell the node its schedules where it replays them itself (none left: it stops)."""
        if (n.schedules or n.node in self.remote) and \
                self.runtime.replay_on_node(n.node, schedules_to_wire(n.schedules), self.t0):
            self.remote.add(n.node)

    def follow(self, name: str, which: str, rates: TraceSchedule, delays: Optional[TraceSchedule] = None,
               now: Optional[float] = None) -> NodeReplay:
        n = super().follow(name, which, rates, delays, now)
        self.hand_over(n)
        return n

    def unfollow(self, name: str, which: str) -> Optional[NodeReplay]:
        n = super().unfollow(name, which)
        if n is not None:
            self.hand_over(n)
        return n
