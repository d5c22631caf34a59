"""When each worker is offline (devices that come and go), planned before the run.

From the scenario's `availability` entries: a seeded two-state model (online and offline
durations drawn from exponentials of the given means, each worker with its own stream of draws,
so adding a worker does not move the others'; optionally a daily cycle), or a trace of online
intervals (CSV `node,start,end`, seconds since the nodes started, FedScale's client_behave_trace
or FLASH's state traces), sped up or slowed down by `time_scale`. The timeline turns each
offline interval into changes (run/timeline.py): the worker cut off from every node and frozen
at its start, healed and thawed at its end; the PS then treats it as it treats a worker that
stopped answering and came back (lost, rejoined).
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
from datetime import datetime
from pathlib import Path
from typing import Mapping, Optional, Sequence

from testbed.data.plain_pickle import load_plain
from testbed.data.textfile import MAX_TRACE_BYTES, bounded_json, capped_bytes, capped_text
from testbed.scenario.checks import resolve_target
from testbed.scenario.document import Availability, Scenario

# With no stop.seconds the model is drawn over this horizon; a run past it keeps its workers online.
DEFAULT_HORIZON_S = 3600.0
MAX_INTERVALS = 100_000  # offline intervals in one run (each is four timeline changes)
# A trace pickle's objects, at most: 24 bytes for each of its 16 MiB (lists of BININT2 take 16).
MAX_PICKLE_MEMORY = 24 * MAX_TRACE_BYTES
MAX_JSON_ITEMS = 1 << 18  # FLASH's state traces: 8 a user (its sample has 1,000 users)
MAX_JSON_DEPTH = 8  # FLASH's nest 2 levels
MAX_TRACE_SECONDS = 7 * 86400.0
NODE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")

Interval = tuple[float, float]


def horizon(sc: Scenario) -> float:
    return sc.stop.seconds if sc.stop.seconds is not None else DEFAULT_HORIZON_S


def model_offline(entry: Availability, node: str, seed: int, until: float,
                  limit: int = MAX_INTERVALS + 1) -> list[Interval]:
    """A worker's offline intervals within [0, until) from the two-state model, the first `limit`
    of them (a plan past MAX_INTERVALS is refused, so drawing it all would be wasted). With a daily
    cycle, each duration is drawn with its mean scaled at the time of the switch: online by
    1 + a c(t), offline by 1 - a c(t), c(t) = cos(2 pi (t - peak) / cycle), so that more workers
    are online, for longer, around the peak (FLASH's and FedScale's traces show such a day)."""
    assert entry.online is not None and entry.offline is not None
    rng = random.Random(f"availability-{seed}-{node}")
    on_share = entry.online / (entry.online + entry.offline)
    online = entry.start == "online" or rng.random() < on_share
    t, out = 0.0, list[Interval]()
    while t < until and len(out) < limit:
        c = _cycle(entry, t)
        d = rng.expovariate(1.0 / (entry.online * (1 + c) if online else entry.offline * (1 - c)))
        if not online:
            out.append((t, min(until, t + d)))
        t += d
        online = not online
    return out


def _cycle(entry: Availability, t: float) -> float:
    """amplitude x cos(2 pi (t - peak) / cycle): 0 without a daily cycle."""
    if entry.cycle is None:
        return 0.0
    return entry.cycle_amplitude * math.cos(2 * math.pi * (t - (entry.cycle_peak or 0.0)) / entry.cycle)


def read_trace(path: str | Path) -> dict[str, list[Interval]]:
    """node -> its online intervals, sorted; ValueError naming the file and line (never quoting it)."""
    p = Path(path)
    try:
        text = capped_text(p, MAX_TRACE_BYTES)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    rows = csv.reader(io.StringIO(text))  # row by row: a list of them all would take 24 times the file
    if [c.strip() for c in next(rows, [])] != ["node", "start", "end"]:
        raise ValueError(f"{p}: line 1: the header must be node,start,end")
    out: dict[str, list[Interval]] = {}
    for i, row in enumerate(rows, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        node, start, end = _row(p, i, row)
        out.setdefault(node, []).append((start, end))
    for node, spans in out.items():
        spans.sort()
        for (a0, a1), (b0, _) in zip(spans, spans[1:]):
            if b0 < a1:
                raise ValueError(f"{p}: {node}'s online intervals overlap ({a0:g}-{a1:g} and from {b0:g})")
    return out


def _row(p: Path, i: int, row: list[str]) -> tuple[str, float, float]:
    if len(row) != 3:
        raise ValueError(f"{p}: line {i}: not 3 fields (node,start,end)")
    node = row[0].strip()
    if not NODE_NAME.fullmatch(node):
        raise ValueError(f"{p}: line {i}: not a node name")
    try:
        start, end = float(row[1]), float(row[2])
    except ValueError:
        raise ValueError(f"{p}: line {i}: start and end are not numbers") from None
    if not (math.isfinite(start) and math.isfinite(end) and 0 <= start < end <= MAX_TRACE_SECONDS):
        raise ValueError(f"{p}: line {i}: not 0 <= start < end <= {MAX_TRACE_SECONDS:g}")
    return node, start, end


def read_fedscale(path: str | Path, nodes: list[str], first_client: int, until: float) -> dict[str, list[Interval]]:
    """node -> its online intervals within [0, until) trace seconds, from FedScale's
    client_behave_trace: {client_id: {'active': [t], 'inactive': [t], 'finish_time': T, ...}},
    online from active[i] to inactive[i], the whole repeating every finish_time (as FedScale's
    ClientSim.is_active reads it). Worker i of `nodes` is client first_client + i. A pickle is
    loaded with no class or function at all, and only once its opcodes say it fits in memory."""
    p = Path(path)
    try:
        data = load_plain(capped_bytes(p, MAX_TRACE_BYTES), MAX_PICKLE_MEMORY)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: not a FedScale availability trace (a dict of clients)")
    budget = _Budget(p, until, MAX_INTERVALS + len(nodes))
    return {node: _client_online(p, data, first_client + i, until, budget) for i, node in enumerate(nodes)}


class _Budget:
    """The online intervals a trace may still give the target's workers: past MAX_INTERVALS (and
    one a worker) their offline intervals are too many, so reading further would be wasted."""

    def __init__(self, path: Path, until: float, left: int):
        self.path, self.until, self.left = path, until, left

    def spend(self, n: float) -> None:
        if not n <= self.left:
            raise ValueError(f"{self.path}: more than {MAX_INTERVALS} online intervals in {self.until:g} trace "
                             "seconds for the target's workers (a shorter run, or a larger time_scale)")
        self.left -= int(n)


def _client_online(p: Path, data: dict, client: int, until: float, budget: _Budget) -> list[Interval]:
    entry = data.get(client, data.get(str(client)))
    if not isinstance(entry, dict):
        raise ValueError(f"{p}: no client {client}")
    try:
        active, inactive = _times(entry["active"]), _times(entry["inactive"])
        period = _times([entry["finish_time"]])[0]
    except (KeyError, TypeError):
        raise ValueError(f"{p}: client {client}: not active/inactive lists of times and a finish_time") from None
    if len(active) != len(inactive) or not 0 < period <= MAX_TRACE_SECONDS:
        raise ValueError(f"{p}: client {client}: active and inactive differ in length, or finish_time is out of range")
    if not active:  # FedScale's is_active takes its index modulo their length
        raise ValueError(f"{p}: client {client}: no active and inactive times")
    # t mod finish_time is never past finish_time: what starts there is never online
    spans = _merged([(a, min(b, period)) for a, b in zip(active, inactive) if 0 <= a < b and a < period])
    return _repeated(spans, period, until, budget)


def _repeated(spans: list[Interval], period: float, until: float, budget: _Budget) -> list[Interval]:
    """`spans`, merged and within [0, period), repeated every period within [0, until), merged."""
    if not spans:
        return []
    if spans == [(0.0, period)]:
        return [(0.0, until)]  # online the whole period, so always
    joined = spans[0][0] == 0 and spans[-1][1] == period  # each period's last span runs into the next's first
    budget.spend(until // period * (len(spans) - joined))  # whole periods' intervals, at least: before the loop
    out: list[Interval] = []
    for k in range(math.ceil(until / period)):
        out += [(k * period + a, k * period + b) for a, b in spans if k * period + a < until]
    return _merged(out)


FLASH_REFERENCE = datetime(2020, 1, 2)  # FLASH's Timer.refer_time: its traces' seconds count from it
FLASH_TIME = "%Y-%m-%d %H:%M:%S"
FLASH_NETWORKS = ("unknown", "2g", "3g", "4g", "5g")


def read_flash(path: str | Path, nodes: list[str], first_client: int, until: float) -> dict[str, list[Interval]]:
    """node -> its online intervals within [0, until) seconds, from FLASH's state traces
    (data/state_traces.json: {uid: {"guid", "model", "messages": "YYYY-mm-dd HH:MM:SS<TAB>state" lines}}),
    read as FLASH's Timer reads them (models/timer.py): a device is ready while its screen is
    locked, it is on Wi-Fi and charging; its trace repeats every (last - first message) seconds,
    on a clock that counts from 2020-01-02 00:00 (run second 0). Worker i of `nodes` is user
    first_client + i; a user whose messages FLASH cannot read is never ready, as in FLASH."""
    p = Path(path)
    try:
        data = bounded_json(capped_bytes(p, MAX_TRACE_BYTES), MAX_JSON_DEPTH, MAX_JSON_ITEMS)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: not FLASH's state traces (a JSON object of users)")
    out = {}
    budget = _Budget(p, until, MAX_INTERVALS + len(nodes))
    for i, node in enumerate(nodes):
        user = data.get(str(first_client + i))
        if not isinstance(user, dict) or not isinstance(user.get("messages"), str):
            raise ValueError(f"{p}: no user {first_client + i} with messages")
        try:
            out[node] = _flash_online(user["messages"], until, budget)
        except KeyError as e:
            raise ValueError(f"{p}: user {first_client + i}: a state FLASH does not know ({str(e)[:40]})") from None
    return out


def _flash_online(messages: str, until: float, budget: _Budget) -> list[Interval]:
    try:
        events = [_flash_event(line) for line in messages.split("\n") if line.strip()]
    except ValueError:  # a line FLASH cannot read: it marks the user unsuccessful, never ready
        return []
    ready, start = [], None
    locked = wifi = charged = False
    for t, state in events:
        if state == "battery_charged_on" or state == "battery_charged_off":
            charged = state.endswith("on")
        elif state == "wifi" or state in FLASH_NETWORKS:
            wifi = state == "wifi"
        elif state in ("screen_lock", "screen_unlock"):
            locked = state == "screen_lock"
        elif state not in ("screen_on", "screen_off") and not state.endswith("%"):
            raise KeyError(state)  # FLASH stops on it (an assertion)
        if locked and wifi and charged and start is None:
            start = t
        elif start is not None and not (locked and wifi and charged):
            ready.append((start, t))
            start = None
    period = float(int(events[-1][0] - events[0][0])) if events else 0.0
    if not ready or period <= 0:
        return []
    first = events[0][0]
    # FLASH's ready(t): t mod period, shifted into [first, first + period)
    spans = [(a - first, min(b, first + period) - first) for a, b in _merged(ready) if a < first + period]
    shift = first % period  # the clock's 0 falls this far into a period
    turned = _merged([(s, e) for a, b in spans for s, e in ((a + shift, b + shift), (a + shift - period,
                      b + shift - period)) if e > 0 and s < period])
    return _repeated([(max(0.0, a), min(period, b)) for a, b in turned], period, until, budget)


def _flash_event(line: str) -> tuple[float, str]:
    """(seconds since FLASH's reference, the state)."""
    stamp, state = line.strip().split("\t")
    t = (datetime.strptime(stamp.strip(), FLASH_TIME) - FLASH_REFERENCE).total_seconds()
    state = state.strip().lower()
    if state.endswith("%"):
        float(state[:-1])  # a battery level; not a number: ValueError, as in FLASH
    return t, state


def _times(values) -> list[float]:
    """A list of finite numbers as floats (TypeError otherwise: a bool or a string is no time)."""
    if not isinstance(values, list) or any(type(v) not in (int, float) for v in values):
        raise TypeError("not a list of numbers")
    try:
        out = [float(v) for v in values]
    except OverflowError:  # an int past a float's range
        raise TypeError("not a list of numbers") from None
    if not all(map(math.isfinite, out)):
        raise TypeError("not a list of numbers")
    return out


def _merged(spans: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def trace_online(entry: Availability, nodes: list[str], until: float) -> dict[str, list[Interval]]:
    """The entry's trace as node -> online intervals in run seconds (time_scale applied)."""
    assert entry.trace is not None
    scale = entry.time_scale
    if entry.trace_format == "fedscale":
        raw = read_fedscale(entry.trace, nodes, entry.first_client, until / scale)
    elif entry.trace_format == "flash":
        raw = read_flash(entry.trace, nodes, entry.first_client, until / scale)
    else:
        raw = read_trace(entry.trace)
    return {node: [(a * scale, b * scale) for a, b in spans] for node, spans in raw.items()}


def trace_offline(online: list[Interval], until: float) -> list[Interval]:
    """The gaps between online intervals within [0, until): when the worker is offline."""
    out, t = [], 0.0
    for start, end in online:
        if start > t and t < until:
            out.append((t, min(start, until)))
        t = max(t, end)
    if t < until:
        out.append((t, until))
    return [(a, b) for a, b in out if b > a]


def plan_offline(sc: Scenario,
                 traces: Optional[dict[int, dict[str, list[Interval]]]] = None) -> dict[str, list[Interval]]:
    """Every worker's offline intervals (workers always online are left out). `traces`: the
    entries' read traces by index (read here when not given). A plan past MAX_INTERVALS is cut
    short just past it (validation refuses it), so that drawing it takes bounded time."""
    until = horizon(sc)
    out: dict[str, list[Interval]] = {}
    left = MAX_INTERVALS + 1
    for i, entry in enumerate(sc.availability):
        trace, nodes = None, resolve_target(sc, entry.target)
        if entry.trace is not None:
            trace = (traces or {}).get(i) or trace_online(entry, nodes, until)
        for node in nodes:
            if left <= 0:
                return out
            if trace is None:
                spans = model_offline(entry, node, sc.seed, until, left)
            else:
                spans = trace_offline(trace[node], until) if node in trace else []
            left -= len(spans)
            if spans:
                out[node] = spans
    return out


def offline_modes(sc: Scenario) -> dict[str, str]:
    """node -> what its trainer does while offline (freeze, or stop), for the workers an entry names."""
    return {node: entry.while_offline for entry in sc.availability for node in resolve_target(sc, entry.target)}


def availability_problems(sc: Scenario) -> list[str]:
    """One line per entry that names no workers, a worker named twice, a trace that cannot be
    read or names nodes its target does not have, or a plan past MAX_INTERVALS."""
    lines: list[str] = []
    seen: dict[str, int] = {}
    workers = {n for n, _ in sc.worker_names()}
    traces: dict[int, dict[str, list[Interval]]] = {}
    for i, entry in enumerate(sc.availability):
        field = f"availability[{i}]"
        nodes = resolve_target(sc, entry.target)
        if not nodes or not set(nodes) <= workers:
            lines.append(f"{field}.target: '{entry.target[:40]}' names no worker, worker group or 'workers'")
            continue
        twice = sorted(n for n in nodes if n in seen)
        if twice:
            lines.append(f"{field}.target: {twice[0]} is in availability[{seen[twice[0]]}] too")
        seen.update({n: i for n in nodes if n not in seen})
        if entry.trace is not None:
            try:
                traces[i] = trace_online(entry, nodes, horizon(sc))
            except ValueError as e:
                lines.append(f"{field}.trace: {e}")
                continue
            stray = sorted(set(traces[i]) - set(nodes))
            if stray:
                lines.append(f"{field}.trace: names {stray[0][:40]}, not a worker of '{entry.target[:40]}'")
    if not lines:
        if sum(len(v) for v in plan_offline(sc, traces).values()) > MAX_INTERVALS:
            lines.append(f"availability: more than {MAX_INTERVALS} offline intervals in {horizon(sc):g} s "
                         "(longer mean durations, or a shorter run)")
    return lines


def offline_at(plan: Mapping[str, Sequence[Sequence[float]]], now: float) -> set[str]:
    """The devices whose offline intervals (`plan_offline`'s, run seconds) hold `now`."""
    return {node for node, spans in plan.items() if any(start <= now < end for start, end in spans)}


class OfflineClock:
    """`offline_at` for a clock that only moves forward, without going over the whole plan each
    time (a fleet's PS asks on every tick): the intervals' starts and ends in order, applied as
    time passes them."""

    def __init__(self, plan: Mapping[str, Sequence[Sequence[float]]]):
        # (time, 0: an end, 1: a start, node): at one instant an end goes before a start
        self.changes = sorted((t, kind, node) for node, spans in plan.items() for start, end in spans
                              for t, kind in ((start, 1), (end, 0)))
        self.next = 0
        self.offline: set[str] = set()

    def at(self, now: float) -> set[str]:
        while self.next < len(self.changes) and self.changes[self.next][0] <= now:
            _, kind, node = self.changes[self.next]
            (self.offline.add if kind else self.offline.discard)(node)
            self.next += 1
        return self.offline
