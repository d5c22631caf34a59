"""The scenario's timeline: changes at given times (or training steps) to links, CPU, stress and
node liveness, applied by the runner while the run goes on, each recorded in events.csv.

    events:
      - {at: 20s, target: w0, action: link, rate: 2mbit}          # both directions of w0's access link
      - {at: 40s, target: w0, action: link, direction: up, rate: 50mbit, latency: 20ms}
      - {at: 10s, target: slow, action: cpu, cpus: 0.1}          # a worker group: every node of it
      - {at: 15s, target: w2, action: stress, load: 0.5}         # background busy loop (load 0: stop)
      - {at: 30s, target: w1, action: kill}                       # SIGKILL the node's processes
      - {at: 45s, target: w1, action: restart}                    # start its role again (it rejoins)
      - {at_step: 100, target: w3, action: pause}                 # freeze (cgroup freezer / docker pause)
      - {at: 60s, target: w3, action: resume}
      - {at: 20s, target: w2, action: partition, peers: [ps]}     # cut off from these nodes/groups
      - {at: 30s, target: w2, action: heal}                       # from these peers, or all
      - {at: 0s, target: w2, action: link, trace: traces/lte.csv} # follow a bandwidth trace

A trace is a CSV of `time,bandwidth[,latency]` (seconds from the event's time; a rate such as
`12mbit` or bit/s; seconds or `20ms`), or a Mahimahi packet-delivery trace (`*.up`, `*.down`,
`*.mahi`: one line per 1500-byte delivery opportunity, in ms), the format of the public cellular
traces. It is replayed as a profile's `trace:` is (node/trace_replay.py: the HTB class's rate
changed in place every `trace_resolution`, 100 ms by default; `trace_loop` and `trace_offset` as
a direction's), from the event's time, in place of any trace the direction followed, until a
later link event sets the direction's rate (run/events.py).

Targets are node names (ps, eval, w0, ...), a worker group's name (its `name:` prefix, `w` for
unnamed groups) or `workers`. The engine (Timeline) runs beside the runner's monitor: it sleeps
until the next change is due and applies it; `at_step` changes wait for the model version
(decentralized strategies: the workers' mean iteration) the runner reads from the records.
"""

from __future__ import annotations

import heapq
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from testbed.node import untrusted
from testbed.plan.availability import offline_modes, plan_offline
from testbed.scenario import units
from testbed.scenario.dilation import dilate_model, mark_of
from testbed.scenario.schema import Event, resolve_target
from testbed.scenario.traces import DEFAULT_RESOLUTION_S


@dataclass(order=True)
class Change:
    """One change to one node, due at `time` (seconds since the nodes started) or at `step`."""

    sort_key: tuple = field(init=False, repr=False)
    time: Optional[float]
    step: Optional[int]
    node: str
    action: str
    fields: dict = field(compare=False, default_factory=dict)
    source: str = field(compare=False, default="")  # e.g. "events[3]" or "availability: offline"

    def __post_init__(self):
        self.sort_key = (0 if self.time is not None else 1, self.time or 0.0, self.step or 0)

    def describe(self) -> str:
        parts = [f"{k}={_show(k, v)}" for k, v in self.fields.items() if v is not None]
        return " ".join(parts)


def _show(key: str, v) -> str:
    if key == "rate":
        return units.format_rate(v)
    if key in ("latency", "jitter") and isinstance(v, (int, float)):
        return f"{v * 1000:g}ms"
    return str(v)


# --------------------------------------------------------------------------------------------
# traces


# --------------------------------------------------------------------------------------------
# expansion of the scenario's events


# Event fields a request may not set: when and to whom are the request's own; a trace is a file's
REQUEST_FORBIDS = ("at", "at_step", "target", "action", "trace", "trace_resolution", "trace_loop", "trace_offset")
# A link event's trace and how it is replayed, as a direction's (scenario/links.py)
EVENT_TRACE_FIELDS = ("trace", "trace_resolution", "trace_loop", "trace_offset")


def event_trace_tick(sc) -> Optional[float]:
    """The finest resolution of the scenario's link events' traces (None: no event has a trace)."""
    return min((ev.trace_resolution or DEFAULT_RESOLUTION_S for ev in sc.events
                if ev.action == "link" and ev.trace is not None), default=None)


MAX_WORDS = 80  # characters of a node's own words on its request kept in events.csv


def request_change(req: object, name: str, asker: Optional[str] = None, dilation: float = 1.0) -> Change:
    """A control request (`edgebed link/...`, a node's drawn crash) as a change, checked as a
    scenario's event is (the action, its fields and their bounds); ValueError when it is not one.
    Its source says who asked: the command line, or node `asker` with its own words after its name
    (never in place of it). Its quantities are the world's: on the wall of a run dilated by
    `dilation`, a rate / k and a delay x k (scenario.dilation)."""
    if not isinstance(req, dict) or not isinstance(req.get("node"), str) or not isinstance(req.get("action"), str) \
            or not isinstance(req.get("fields", {}), dict):
        raise ValueError("not a request: {node, action, fields}")
    forbidden = [k for k in req.get("fields", {}) if k in REQUEST_FORBIDS]
    if forbidden:
        raise ValueError(f"a request may not set {', '.join(forbidden)}")
    event = Event(at=0, target=req["node"], action=req["action"], **req.get("fields", {}))  # raises if no event
    fields = dict(req.get("fields", {}))
    if dilation != 1:
        wall = dilate_model(event, dilation)
        fields = {f: getattr(wall, f) if mark_of(Event.model_fields.get(f)) else v for f, v in fields.items()}
    source = f"command line ({str(req.get('id', name))[:60]})" if asker is None else f"asked by {asker}"
    words = req.get("source") if asker is not None and isinstance(req.get("source"), str) else ""
    if words:
        source += ": " + "".join(c if c.isprintable() else "?" for c in words[:MAX_WORDS])
    return Change(None, None, req["node"], req["action"], fields, source)


def expand_events(sc) -> list[Change]:
    """The scenario's events as per-node changes (traces expanded), in due order."""
    out: list[Change] = []
    for i, ev in enumerate(sc.events):
        nodes = resolve_target(sc, ev.target)
        src = f"events[{i}]"
        fields = ev.change_fields()
        if ev.action == "link" and ev.trace is not None:
            fields.update({k: getattr(ev, k) for k in EVENT_TRACE_FIELDS if getattr(ev, k) is not None})
        if "peers" in fields:  # groups to nodes
            fields["peers"] = sorted({p for ref in fields["peers"] for p in resolve_target(sc, ref)})
        for n in nodes:
            f = dict(fields)
            if "peers" in f:
                f["peers"] = [p for p in f["peers"] if p != n]
            out.append(Change(ev.at, ev.at_step, n, ev.action, f, src))
    return sorted(out + availability_changes(sc))


def availability_changes(sc) -> list[Change]:
    """Each worker's offline intervals (plan/availability.py) as changes: at the start cut off from
    every other node and frozen (or its trainer killed, `while_offline: stop`: killed first, as
    changes at one time sort by action), at the end healed, then thawed or its role started again."""
    names = sc.node_names()
    modes = offline_modes(sc)
    out: list[Change] = []
    for node, spans in plan_offline(sc).items():
        peers = [n for n in names if n != node]
        off, on = ("kill", "restart") if modes.get(node) == "stop" else ("pause", "resume")
        for start, end in spans:
            out += [Change(start, None, node, "partition", {"peers": peers}, "availability: offline"),
                    Change(start, None, node, off, {}, "availability: offline"),
                    Change(end, None, node, "heal", {"peers": []}, "availability: online again"),
                    Change(end, None, node, on, {}, "availability: online again")]
    return out


# --------------------------------------------------------------------------------------------
# the engine


class Timeline:
    """Applies changes when due. `apply(change)` does it and returns a description of what
    changed (raising on failure); `record(change, applied_at, detail)` writes it down.
    `clock` is wall time; `t0` the run's time origin; `step()` the current global step."""

    def __init__(self, changes: list[Change], apply: Callable[[Change], str],
                 record: Callable[[Change, float, str], None], t0: float,
                 step: Callable[[], int] = lambda: 0, clock: Callable[[], float] = time.time,
                 sleep: Optional[Callable[[float], None]] = None, poll: float = 0.05,
                 control_dir: Optional[Path] = None, inbox: Optional[Callable[[], list[dict]]] = None):
        self.timed = [c for c in changes if c.time is not None]
        heapq.heapify(self.timed)
        self.stepped = sorted((c for c in changes if c.time is None), key=lambda c: c.step or 0)
        self.apply, self.record, self.t0 = apply, record, t0
        self.step, self.clock, self.poll = step, clock, poll
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s))
        self._thread: Optional[threading.Thread] = None
        self.errors: list[str] = []
        self.applied: list[tuple[Change, float]] = []
        # `edgebed link/kill/...` drop requests here; they apply at once, by the same code path
        self.control_dir = Path(control_dir) if control_dir is not None else None
        self.refused: list[str] = []  # control requests that were not valid changes
        self.inbox = inbox  # the nodes' own requests (a drawn crash), over the control channel
        self.counts = {"applied": 0, "failed": 0, "refused": 0}  # for summary.json ("timeline")
        self.dilation = 1.0  # virtual time: requests state the world's rates and delays (request_change)

    def due(self, now: float, step: int) -> list[Change]:
        """Pop every change due at run time `now` or global step `step`."""
        out = []
        while self.timed and self.timed[0].time <= now:
            out.append(heapq.heappop(self.timed))
        while self.stepped and (self.stepped[0].step or 0) <= step:
            out.append(self.stepped.pop(0))
        return out

    def pending(self) -> int:
        return len(self.timed) + len(self.stepped)

    def requests(self) -> list[Change]:
        """Changes asked for from the command line (RUN/.control/*.json), oldest first, then the
        nodes' own (the inbox)."""
        out = []
        files = sorted(self.control_dir.glob("*.json")) if self.control_dir is not None and \
            self.control_dir.is_dir() else []
        for f in files:
            try:
                text = f.read_bytes()  # (its bytes: text that is not UTF-8 is refused below, not here)
                f.unlink()
            except OSError:
                continue
            self._take(out, text, f.stem, f.name)
        for req in self.inbox() if self.inbox is not None else []:  # (the hub read them: mappings)
            rid = str(req.get("id", ""))[:60] if isinstance(req, dict) else ""
            # the hub lets in a node's crash request only for itself: its node is who asked
            asker = req.get("node") if isinstance(req, dict) and isinstance(req.get("node"), str) else "a node"
            self._take(out, req, rid, f"node request {rid}", asker[:60])
        return out

    def _take(self, out: list[Change], req, rid: str, where: str, asker: Optional[str] = None) -> None:
        """A request (a file's bytes, or node `asker`'s request as the hub read it) as a change, or refused."""
        try:
            out.append(request_change(untrusted.loads(req) if isinstance(req, bytes) else req, rid, asker,
                                      self.dilation))
        except Exception as e:  # whoever wrote it, a bad request is refused, and said so
            self.refused.append(f"{where}: {(str(e).splitlines() or [type(e).__name__])[0][:160]}")

    def run_once(self) -> None:
        now = self.clock() - self.t0
        changes = self.requests() + self.due(now, self.step())
        while self.refused:
            why = self.refused.pop(0)
            self.counts["refused"] += 1
            self.errors.append(f"request refused: {why}")
            self._record(Change(None, None, "-", "refused", {}, "control request"), now, f"REFUSED: {why}")
        for change in changes:
            try:
                detail = self.apply(change)
                self.counts["applied"] += 1
            except Exception as e:  # one failed change must not stop the rest of the timeline
                detail = f"FAILED: {type(e).__name__}: {e}"
                self.counts["failed"] += 1
                self.errors.append(f"{change.source} ({change.action} {change.node}): {e}")
            applied = self.clock() - self.t0
            self.applied.append((change, applied))
            self._record(change, applied, detail)

    def _record(self, change: Change, at: float, detail: str) -> None:
        try:
            self.record(change, at, detail)
        except Exception as e:  # a full disk: the change is made, the timeline goes on
            self.errors.append(f"recording {change.action} {change.node}: {type(e).__name__}: {e}")

    def _loop(self) -> None:
        while not self._stop.is_set() and (self.pending() or self.control_dir is not None):
            try:
                self.run_once()
            except Exception as e:  # never the thread's end: the remaining events still run
                self.counts["failed"] += 1
                self.errors.append(f"timeline: {type(e).__name__}: {e}")
                self._sleep(self.poll)
            wait = self.poll
            if self.timed:
                idle = self.stepped or self.control_dir is not None  # something to poll for meanwhile
                wait = min(wait if idle else 3600.0, max(0.0, self.timed[0].time - (self.clock() - self.t0)))
            if wait > 0:
                self._sleep(wait)

    def start(self) -> None:
        if self.pending() or self.control_dir is not None:
            self._thread = threading.Thread(target=self._loop, name="edgebed-timeline", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
