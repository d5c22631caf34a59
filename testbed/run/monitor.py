"""A run while it goes: the cluster's counters each second, the records as they grow (progress
lines, the global step the timeline waits for), and the conditions that end it early."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from testbed.plan.cluster import ClusterSpec
from testbed.records import metrics
from testbed.run.summary import ps_info
from testbed.scenario.schema import Scenario
from testbed.strategies import get_strategy_class

# The PS's stop reasons that mean the run did what its scenario asked.
COMPLETED = ("steps", "seconds", "target_accuracy", "commands")


@dataclass
class LiveState:
    """What the monitor and the timeline share while the run goes on."""

    step: int = 0  # the global step (model version) the records last showed
    killed: set[str] = field(default_factory=set)  # nodes killed on purpose (timeline events), not crashed


def exit_reason(node: str, code: Optional[int]) -> str:
    """A node's name with how it ended: an exit status, or the signal that killed it."""
    if code is None or code >= 0:
        return f"{node} (exit status {code})"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = ": out of memory? the kernel's OOM killer sends it (dmesg says)" if -code == signal.SIGKILL else ""
    return f"{node} (killed by {name}{hint})"


def commands_done(procs: dict, spec: ClusterSpec, killed: set, commands: dict) -> bool:
    """A command workload's driver (the evaluator's program) has ended well, or without one, its
    workers' programs all have (a killed one does not count)."""
    if "evaluator" in commands:
        watched = [n.name for n in spec.nodes if n.role == "evaluator" and n.name in procs]
    else:
        watched = [n.name for n in spec.workers if n.name in procs and n.name not in killed]
    return bool(watched) and all(not procs[n].is_alive() and procs[n].exitcode == 0 for n in watched)


def round_counts(row: Optional[dict]) -> str:
    """The live line's part for the last round closed: who was online, selected, finished, dropped."""
    if not row:
        return ""
    counts = " ".join(f"{row.get('n_' + k, '?')} {k}" for k in ("online", "selected", "finished", "dropped"))
    return f"  round {row.get('round', '?')}: {counts}"


class Tail:
    """New complete lines appended to a CSV since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.header: Optional[list[str]] = None

    def rows(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.pos += end + 1
        out = []
        for line in data[:end].decode(errors="replace").splitlines():
            cells = line.split(",")
            if self.header is None:
                self.header = cells
                continue
            if len(cells) == len(self.header):
                out.append(dict(zip(self.header, cells)))
        return out


# A shaped link that carried nothing since its class was last read is read again this often (its
# rate may have changed; its counters cannot have); in between its row repeats that reading.
IDLE_READ_EVERY_S = 30.0
STALE_READS = 64  # idle classes read a sample at the least: a small cluster's all at once


class Sampler:
    """The cluster's counters as rows: traffic.csv (access links, WAN links), resources.csv and
    shaping.csv. `last`: each link's previous reading (for the deltas), kept across samples.
    `dilation`: the run's k; the rows are written in the world's units (records.virtual)."""

    def __init__(self, runtime, run_dir: Path, t0: float, last: dict, dilation: float = 1.0):
        self.runtime, self.run_dir, self.t0, self.last, self.dilation = runtime, run_dir, t0, last, dilation
        # "w0/up" -> (read at, its class's reading or None (unshaped), the veth's bytes then)
        self.classes: dict[str, tuple[float, Optional[dict], Optional[int]]] = {}

    def sample(self) -> None:
        now = time.time() - self.t0
        try:
            counters = self.runtime.counters()
        except Exception:
            return
        traffic = metrics.open_table(self.run_dir, "traffic.csv", self.dilation)
        res = metrics.open_table(self.run_dir, "resources.csv", self.dilation)
        try:
            self._access(traffic, counters, now)
            self._wan(traffic, now)
            self._shaping(now, counters)
            for name, use in self.runtime.usage().items():
                res.write(time=now, node=name, cpu_seconds=use.cpu_seconds, memory_bytes=use.memory_bytes,
                          throttled_seconds=use.throttled_seconds, gpu_memory_bytes=use.gpu_memory_bytes,
                          gpu_util=use.gpu_util, cpu_quota=use.cpu_quota, wait_seconds=use.wait_seconds,
                          nr_periods=use.nr_periods, nr_throttled=use.nr_throttled)
        finally:
            traffic.close()
            res.close()

    def _access(self, traffic, counters: dict, now: float) -> None:
        for name, c in counters.items():
            prev = self.last.get(name, {"up_bytes": 0, "down_bytes": 0})
            at = c["time"] - self.t0 if "time" in c else now  # a remote node's own reading time
            for d in ("up", "down"):
                traffic.write(time=at, node=name, link="access", direction=d, bytes=c[f"{d}_bytes"],
                              delta_bytes=c[f"{d}_bytes"] - prev[f"{d}_bytes"], packets=c[f"{d}_packets"])
            self.last[name] = c

    def _shaping(self, now: float, counters: dict) -> None:
        """Each shaped access-link direction's HTB class: its rate and counters (shaping.csv). A
        class is read when its link carried bytes since its last reading; of the others, those
        never read or last read IDLE_READ_EVERY_S ago, the oldest first, as many a sample as
        spread them over that period (at least STALE_READS): a fleet's idle devices cost little
        each second, and a sample slower than the period does not read them all every time."""
        keys = self._classes_to_read(now, counters)
        try:
            stats = self.runtime.link_stats(keys if counters else None)
        except Exception:
            return
        for key in (keys if counters else list(stats)):
            self.classes[key] = (now, stats.get(key), _veth_bytes(counters, key))
        rows = [(key, st) for key, (_, st, _) in self.classes.items() if st is not None]
        if not rows:
            return
        table = metrics.open_table(self.run_dir, "shaping.csv", self.dilation)
        try:
            for key, st in rows:
                node, direction = key.rsplit("/", 1)
                at = st["time"] - self.t0 if "time" in st else now  # a remote node's own reading time
                table.write(time=at, node=node, direction=direction, **{k: v for k, v in st.items() if k != "time"})
        finally:
            table.close()

    def _classes_to_read(self, now: float, counters: dict) -> list[str]:
        keys = [f"{n}/{d}" for n in counters for d in ("up", "down")]
        moving, stale = [], []
        for key in keys:
            read_at, _, moved = self.classes.get(key, (None, None, None))
            if read_at is not None and moved is not None and _veth_bytes(counters, key) != moved:
                moving.append(key)
            elif read_at is None or moved is None or now - read_at >= IDLE_READ_EVERY_S:
                stale.append((-1.0 if read_at is None else read_at, key))
        budget = max(STALE_READS, math.ceil(len(keys) / IDLE_READ_EVERY_S))
        return moving + [key for _, key in sorted(stale)[:budget]]

    def _wan(self, traffic, now: float) -> None:
        # WAN links, one row per direction from each router's end: node = site, link = wan:<peer site>,
        # up = towards the peer (only the sending end's "up" is written: each byte is counted once)
        for (site, peer), c in self.runtime.wan_counters().items():
            key = f"wan:{site}->{peer}"
            prev = self.last.get(key, {"up_bytes": 0})
            at = c["time"] - self.t0 if "time" in c else now
            traffic.write(time=at, node=site, link=f"wan:{peer}", direction="up", bytes=c["up_bytes"],
                          delta_bytes=c["up_bytes"] - prev["up_bytes"], packets=c["up_packets"])
            self.last[key] = c


def _veth_bytes(counters: dict, key: str) -> Optional[int]:
    """The bytes a link direction ("w0/up") carried, from the veth's counters (None: not read)."""
    node, direction = key.rsplit("/", 1)
    c = counters.get(node)
    return None if c is None else c.get(f"{direction}_bytes")


@dataclass
class Monitor:
    """Watches the run from its nodes' start to its end: samples the counters each second, says
    progress every `progress_every` seconds, and stops the run (its stop event) when a node
    fails, a stream node was killed, the commands are done or the runner's deadline passed."""

    sc: Scenario
    spec: ClusterSpec
    procs: dict  # node -> its process (is_alive, exitcode, join)
    stop_event: Any  # the runtime's stop event (set: every node winds down)
    sampler: Sampler
    live: LiveState
    say: Callable[[str], None]
    progress_every: float
    worker_steps: dict[str, int] = field(default_factory=dict)  # each worker's last step
    last_loss: Optional[str] = None
    last_eval: Optional[dict] = None
    last_round: Optional[dict] = None  # rounds.csv's last row (strategies with client selection)

    def __post_init__(self) -> None:
        self.run_dir, self.t0 = self.sampler.run_dir, self.sampler.t0
        self.steps_tail, self.eval_tail = Tail(self.run_dir / "steps.csv"), Tail(self.run_dir / "eval.csv")
        self.rounds_tail = Tail(self.run_dir / "rounds.csv")
        self.decentralized = get_strategy_class(self.sc.algorithm.name).decentralized

    def watch(self) -> tuple[str, str]:
        """Until the parameter server ends (its stop reason says how) or the run must stop: (status, reason)."""
        hard_deadline = self.t0 + (self.sc.stop.seconds or 24 * 3600) + 300
        next_progress = time.time() + self.progress_every
        next_sample = time.time()
        ps = self.procs["ps"]
        while True:
            now = time.time()
            if now >= next_sample:
                self.sampler.sample()
                next_sample += 1.0
            self._read_records()
            if now >= next_progress:
                self.say(self._progress(now))
                next_progress += self.progress_every
            if not ps.is_alive():
                return self._ps_ended(ps.exitcode)
            ended = self._check(now, hard_deadline)
            if ended is not None:
                return ended
            time.sleep(0.2)

    def _read_records(self) -> None:
        for row in self.steps_tail.rows():
            self.worker_steps[row["node"]] = int(row["step"])
            self.last_loss = row["loss"]
            if row.get("model_version") not in (None, ""):
                self.live.step = max(self.live.step, int(row["model_version"]))
        for row in self.eval_tail.rows():
            self.last_eval = row
        for row in self.rounds_tail.rows():
            self.last_round = row

    def _progress(self, now: float) -> str:
        ev, counters = self.last_eval, self.sampler.last
        acc = f"acc {float(ev['accuracy']):.3f} @ {ev['step']}" if ev else "acc -"
        loss = f"loss {float(self.last_loss):.3f}" if self.last_loss else "loss -"
        if self.decentralized:  # no PS: what the workers put on their links
            out = sum(counters.get(n.name, {}).get("up_bytes", 0) for n in self.spec.workers)
            traffic = f"workers out {out / 1e6:8.2f} MB"
        else:
            traffic = f"PS in {counters.get('ps', {}).get('down_bytes', 0) / 1e6:8.2f} MB"
        world_s = (now - self.t0) / self.sampler.dilation  # the records' clock
        return (f"[{world_s:7.1f}s] worker steps {sum(self.worker_steps.values()):6d}  {loss}  {acc}  {traffic}"
                + round_counts(self.last_round))

    def _check(self, now: float, hard_deadline: float) -> Optional[tuple[str, str]]:
        """(status, reason) when the run must end now, the PS still running; None: it goes on."""
        killed, procs = self.live.killed, self.procs
        if killed & {"broker", "producer"}:  # the workers' streams are gone with it: no run to go on with
            return self._stop("failed", f"the stream {'broker' if 'broker' in killed else 'producer'} was killed "
                                        "(a timeline event): the workers' streams end with it")
        dead = []
        for n in list(procs):  # a copy: per-round trainers are added meanwhile
            if n == "ps" or n in killed:
                continue
            # its process read after `killed`: a restart puts the new one in before it takes the
            # node out of `killed` (a killed process read first, then its node restarted, failed a run)
            p = procs[n]
            if not p.is_alive() and p.exitcode not in (0, None):
                dead.append((n, p.exitcode))
        if dead:
            return self._stop("failed", f"node(s) {', '.join(exit_reason(n, code) for n, code in dead)} "
                                        "exited with an error")
        if self.sc.workload.command is not None and commands_done(procs, self.spec, killed, self.sc.workload.command):
            self.stop_event.set()  # the ps role ends the run (stop_reason "commands")
        if now > hard_deadline:
            self.stop_event.set()
            return "stopped", "runner deadline passed"
        return None

    def _stop(self, status: str, reason: str) -> tuple[str, str]:
        """Every node winds down; the PS gets 30 s to write its records."""
        self.stop_event.set()
        self.procs["ps"].join(timeout=30)
        return status, reason

    def _ps_ended(self, code: Optional[int]) -> tuple[str, str]:
        if code != 0:
            if "ps" in self.live.killed:
                return "failed", "the parameter server was killed (a timeline event): the run cannot go on"
            return "failed", f"parameter server exited with code {code}"
        why = ps_info(self.run_dir).get("stop_reason")
        return ("completed" if why in COMPLETED else "stopped"), why or "unknown"
