"""Entry point of a node container (docker runtime):
`python -m testbed.node.supervisor --supervise NODE UP DOWN`.

The container's first process is the node's supervisor (RoleSupervisor). Everything it needs
comes over the run's control channel (testbed.node.channel; UP and DOWN are the hub's URLs on
the control network), never through a shared folder: the runner's first request ("go") carries
the role's RoleConfig and the node's background stress, sent once the container's link is
shaped (no training byte crosses an unshaped link); later requests kill, restart and change the
stress of the role, acting on its children and leaving the container in place. The runner's
heartbeats carry the stop. It speaks with its node's channel keys, which the runtime put at
node.channel_keys.KEY_FILE for this container alone, and its acks, states and counters go up
with its own key, apart, held by a process of its own that nothing the node runs can reach
(node.supervisor_sender). `python -m testbed.node.supervisor --exec JSON`
runs one function (benchmarks, link checks).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from typing import Any, Callable, Optional

from testbed.errors import RunFailed
from testbed.kernel.identity import NodeIdentity, container_identity
from testbed.kernel.privileges import drop_privileges
from testbed.node import channel, channel_keys, control, supervisor_sender, untrusted
from testbed.node.stop_flag import StopFlag
from testbed.scenario.units import parse_cpuset, stress_loads  # light: a container's supervisor imports no schema

STATS_EVERY = 0.5  # s between a self-shaping node's counters (traffic.csv samples them)
IDLE_STATS_EVERY = 5.0  # s between them while nothing runs in the node (a fleet's idle devices: thousands)
IDLE_POLL = 0.5  # s a supervisor with nothing running sleeps between looks (a request wakes it at once)
HEARTBEAT_TIMEOUT = 20.0  # s without a beat after which a node stops by itself (its runner is gone)
GO_DEADLINE = 600.0  # s a container waits for its first request
MAX_REQUEST = 64 << 20  # bytes: a "go" carries the RoleConfig (the scenario, every node's stream schedule)
KEPT_ANSWERS = 1000  # answers kept for repeats of a request (the runner repeats only its latest ones)


def join_cgroups(cgroup_procs: tuple) -> None:
    """Into the node's cgroup, where the supervisor is not in it (a fleet host's device:
    node.fleet.host): before the process starts anything, and while it still may."""
    for path in cgroup_procs:
        with open(path, "w") as f:
            f.write(str(os.getpid()))


def role_main(cfg_data: dict, stop, cgroup_procs: tuple = (), identity: Optional[NodeIdentity] = None) -> None:
    # first, while this is the process's one thread (importing torch starts more): the role and
    # what it starts get none of the supervisor's powers (SECURITY.md), nor its sender, nor its uid
    supervisor_sender.forget()
    join_cgroups(cgroup_procs)
    drop_privileges(identity or container_identity())
    from testbed.node.roles import resolve_target
    from testbed.node.roles.common import RoleConfig

    os.setpgid(0, 0)  # its own process group: a kill takes whatever the role started too
    cfg = RoleConfig(**cfg_data)  # its delay, peers and stream dataclasses again
    try:
        resolve_target(cfg.target)(cfg=cfg, stop_event=stop)
    finally:
        channel.flush()  # the role's last records leave before the process exits


def _warm_for_trainers(cfg: dict) -> None:
    """A per-round trainer's device, idle between its rounds: torch imported and edgebed's own
    dataset loaded here once, so that each later trainer forks with them (the netns runtime's
    forkserver preloads both for every node). A plugin's dataset is not: no user code runs in the
    supervisor, which keeps the container's powers."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    from testbed.data.datasets import edgebeds_own, shared_dataset

    try:
        sc, workload = cfg["scenario"], cfg["scenario"]["workload"]
        if edgebeds_own(workload["dataset"]):
            shared_dataset(workload["dataset"], seed=sc["seed"], test_size=workload.get("test_size"))
    except Exception:  # the trainer loads it itself, and says what is wrong
        pass


def job_main(target: str, kwargs: dict, cgroup_procs: tuple = (), identity: Optional[NodeIdentity] = None) -> None:
    """A measuring job (runtime.start on a node whose runner is elsewhere): one function."""
    supervisor_sender.forget()
    join_cgroups(cgroup_procs)
    drop_privileges(identity or container_identity())
    import importlib

    os.setpgid(0, 0)
    module, func = target.split(":")
    try:
        getattr(importlib.import_module(module), func)(**kwargs)
    finally:
        channel.flush()


def stress_main(load: float, stop, cgroup_procs: tuple = (), identity: Optional[NodeIdentity] = None) -> None:
    supervisor_sender.forget()
    join_cgroups(cgroup_procs)
    drop_privileges(identity or container_identity())
    from testbed.node.roles.stress import run_stress

    os.setpgid(0, 0)
    run_stress(load, stop)


def _kill_pid(pid: int) -> int:
    try:
        os.kill(pid, signal.SIGKILL)
        return 1
    except ProcessLookupError:
        return 0


class RoleSupervisor:
    """The container's first process: runs the node's role and its background stress as children.

    A kill (a timeline event, `edgebed kill`) takes the children, as a crash would, and leaves
    the container -- its namespace and shaped link -- for a restart, which is what the netns
    runtime does too. Requests (go | start | kill | stress | ..., numbered) come down the control
    channel, repeated until answered: each is acted on once and answered (an "ack" up); the
    role's state (gen, running, exitcode) goes up as a "state" message for the runner's view of
    it (runtimes.docker.nodes.RoleProcess). The container ends when the role ends on its own (finished,
    or crashed: the exit code is the role's), or at the run's stop. Requests and answers are
    typed (node.control); HANDLERS is the one table from a request's type to its handler.
    """

    POLL = 0.02  # s: a request is acted on well within the timeline's 100 ms

    def __init__(self, node: str, up: str, down: str, sender: Optional[supervisor_sender.SupervisorSender] = None):
        """`sender`: what sends its acks, states and counters with its own key (without one, as
        in tests, they go with the process's keys)."""
        self.node, self.up = node, up
        self.supervisor_sender = sender
        self.listener = self._listener(down)
        self.beat = channel.Heartbeat(HEARTBEAT_TIMEOUT)
        self._ctx = mp.get_context("fork")
        self.stop = self._stop_flag()  # shared with the role and stress processes, which kill may take
        self.terminated = False  # `docker stop` (SIGTERM) reaches only this process
        self.role = None
        self.gen = 0
        self.stress: list = []
        self._reap: list = []  # killed, not yet joined
        self._answers: dict[int, control.Reply] = {}  # seq -> answer: a repeated request is answered, not redone
        self.dropped = untrusted.Drops(f"supervisor of {node}")  # requests it could not read, by reason
        self.jobs: dict[str, object] = {}  # measuring jobs running: slot to report the end in -> process
        self.link: Any = None  # node.own_link.OwnLink, when the runtime has the node shape its own link
        self.replay = None  # node.trace_replay.TraceReplay, when the node replays its link traces itself
        self.router = None  # node.own_router.OwnRouter, when the node is a site's router (runtime swarm)
        self._next_stats = 0.0
        self.waits_for_rounds = False  # its role a per-round trainer: it outlives the role (RoleConfig.per_round)
        self.role_cfg: dict = {}

    # -- what a fleet host's devices do otherwise (node.fleet.device) -------------------
    def _listener(self, down: str) -> channel.Listener:
        return channel.Listener(down, [channel.topic("beat"), channel.topic("node", self.node)],
                                max_message=MAX_REQUEST)

    def _stop_flag(self):
        return StopFlag(self._ctx)

    def _send_json(self, kind: str, data: dict) -> None:
        if self.supervisor_sender is not None:
            self.supervisor_sender.send(kind, data)
        else:
            channel.send_json(self.up, kind, data)

    def _fork(self, target: Callable, args: tuple, name: str = ""):
        """A child process running `target(*args)` (is_alive, exitcode, join, pid: multiprocessing's)."""
        p = self._ctx.Process(target=target, args=args, name=name or None, daemon=target is not role_main)
        p.start()
        return p

    def _set_affinity(self, cpuset: str) -> None:
        os.sched_setaffinity(0, parse_cpuset(cpuset))

    def _next_stats_in(self) -> float:
        return STATS_EVERY if self._busy() else IDLE_STATS_EVERY

    def _join_killed(self) -> None:
        while self._reap:
            self._reap.pop().join(timeout=5)

    def _send_state(self, running: bool, exitcode=None) -> None:
        self._send_json("state", {"node": self.node, "gen": self.gen, "running": running,
                                  "exitcode": exitcode, **self._drop_counts()})

    def _drop_counts(self) -> dict:
        """What this supervisor dropped, with its acks and states (the hub keeps it for summary.json)."""
        return {"dropped": dict(self.dropped)} if self.dropped else {}

    def _start(self, req: control.Go) -> None:
        if req.cfg is None:
            raise ValueError(f"{req.op} without a cfg")
        if req.cpuset:  # a runtime without a cpuset of its own (swarm): the role inherits this
            self._set_affinity(req.cpuset)
        self.gen = self.gen + 1 if req.gen is None else req.gen
        self.waits_for_rounds, self.role_cfg = bool(req.cfg.get("per_round")), req.cfg
        self.role = self._fork(role_main, (req.cfg, self.stop, self.joins()), name=f"role-{self.node}")
        self._send_state(True)
        self._set_stress(req.stress)

    def _set_stress(self, loads: list[float]) -> int:
        old = self._kill(self.stress)
        self.stress = []
        for load in loads:
            self.stress.append(self._fork(stress_main, (load, self.stop, self.joins())))
        return old

    def _kill(self, procs: list) -> int:
        """SIGKILL each process's group; reaped after the request is answered (a big process takes
        100+ ms to exit: the answer, and the time recorded for the event, is when the signal went)."""
        n = 0
        for p in procs:
            if p is None or p.pid is None:
                continue
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the process and all it started
                n += 1
            except ProcessLookupError:  # just forked, not yet its own group's leader: the process itself
                n += _kill_pid(p.pid)
            self._reap.append(p)
        return n

    def _signal(self, procs: list, sig: int) -> int:
        n = 0
        for p in procs:
            if p is not None and p.pid is not None:
                try:
                    os.killpg(p.pid, sig)
                    n += 1
                except ProcessLookupError:
                    pass
        return n

    def _reap_jobs(self) -> None:
        """Tell the runner (through each job's `done` slot) which measuring jobs ended, and how."""
        for done, job in list(self.jobs.items()):
            if not job.is_alive():
                job.join()
                self._put(done, str(job.exitcode))
                del self.jobs[done]

    def _put(self, slot: str, text: str) -> None:
        from testbed.node import mailbox

        mailbox.write_text(slot, text)

    def _send_stats(self) -> None:
        """A self-shaping node's link counters and usage, for the runner's traffic and resources."""
        if self.link is None or time.monotonic() < self._next_stats:
            return
        self._next_stats = time.monotonic() + self._next_stats_in()
        cg = self.own_cgroup()
        thr = cg.throttled() or {}
        throttled = thr.get("throttled_time", thr.get("throttled_usec", 0) * 1000) / 1e9 if thr else None
        self._send_json("stats", {"node": self.node, **(self.link.counters() or {}),
                                  **self.link.class_stats(),  # the fidelity monitor's links
                                  "cpu_seconds": cg.cpu_seconds(), "memory_bytes": cg.memory_bytes(),
                                  "throttled_seconds": throttled, "time": time.time(),
                                  # the fidelity monitor's (records.fidelity)
                                  "cpu_quota": cg.quota_cores(), "wait_seconds": cg.wait_seconds(),
                                  "nr_periods": thr.get("nr_periods"), "nr_throttled": thr.get("nr_throttled")})

    def joins(self) -> tuple:
        """The cgroup.procs files a role, stress or job process joins first (none: a container's
        processes are in its cgroup already)."""
        return ()

    def _busy(self) -> bool:
        return self.role is not None or bool(self.stress or self.jobs or self._reap)

    def own_cgroup(self):
        """The cgroup whose usage this node reports: the container's own (a device of a fleet
        host has one of its own inside the host's container: node.fleet.host)."""
        from testbed.kernel.cgroups import OwnCgroup

        return OwnCgroup()

    # -- requests (node.control), one handler each ----------------------------------------
    def _on_kill(self, req: control.Kill) -> str:
        n = self._kill([self.role] + self.stress)
        self.stress = []
        if self.role is not None:
            self._send_state(False, -9)
            self.role = None
        return f"killed {n} process group(s)"

    def _on_go(self, req: control.Go) -> str:  # go and start
        if req.idle:
            return "idle"
        if self.role is not None and self.role.is_alive():
            return "already running"
        self._start(req)
        return "started"

    def _on_exec(self, req: control.Exec) -> str:
        self.jobs[req.done] = self._fork(job_main, (req.target, req.kwargs, self.joins()))
        return "started"

    def _on_counters(self, req: control.Counters) -> str:
        # with when they were read: the runner's rates divide by the node's own times
        return json.dumps({**self._own_link(req).counters(), "time": time.time()})

    def _on_clock(self, req: control.Clock) -> str:
        return repr(time.time())  # the runner compares it with its own (runtimes.swarm.services.measure_offset)

    def _on_kernel(self, req: control.Kernel) -> str:
        """What this host's kernel can shape with, tried in the node's own namespace."""
        from dataclasses import asdict

        from pyroute2 import IPRoute

        from testbed.kernel.shaping import probe_links

        with IPRoute() as ipr:
            return json.dumps(asdict(probe_links(ipr)))

    def _on_shape(self, req: control.Shape) -> str:
        from testbed.node.own_link import OwnLink

        self.link = OwnLink()
        return self.link.shape(req.address, req.uplink, req.downlink, req.routes)

    @staticmethod
    def _made(req: control.Request, thing, what: str):
        """`thing` (the node's own link or router), or an error: the request came before `what`."""
        if thing is None:
            raise RunFailed(f"{req.op} before {what}")
        return thing

    def _own_link(self, req: control.Request):
        return self._made(req, self.link, "the node's link was shaped")

    def _on_reshape(self, req: control.Reshape) -> str:
        done = self._own_link(req).reshape(req.which, req.old, req.new)
        if self.replay is not None:  # the reshape set the rate the runner knew: the trace's again next tick
            self.replay.forget_applied()
        return done

    def _on_replay(self, req: control.Replay) -> str:
        """Keep the trace's clock here and change this node's own link in place each tick."""
        from testbed.node.trace_replay import NodeReplay, TraceReplay, schedules_from_wire

        link = self._own_link(req)
        if self.replay is not None:
            self.replay.stop()
        self.replay = TraceReplay([NodeReplay("self", schedules_from_wire(req.schedules))],
                                  lambda _node, rates: link.set_rates(rates), lambda *row: None, req.t0)
        self.replay.start()
        return f"replaying {', '.join(sorted(req.schedules))} every {self.replay.tick:g} s"

    def _on_cut(self, req: control.Cut) -> str:
        if req.everyone:
            return self._own_link(req).cut_everyone(req.cut, self._runners_path())
        return self._own_link(req).cut(req.addresses, req.cut)

    def _runners_path(self) -> list[str]:
        """The address a cut from everyone spares: the runner's (its hub), which this node's
        processes reach through the link the cut is on where it has no control network."""
        return [self.up.split("://", 1)[1].rsplit(":", 1)[0]]

    def _on_route(self, req: control.Route) -> str:  # a site's router (node.own_router)
        from testbed.node.own_router import OwnRouter

        self.router = OwnRouter()
        return self.router.route(req.lan, req.wan, req.routes)

    def _own_router(self, req: control.Request):
        return self._made(req, self.router, "the node was made a router")

    def _on_reshape_wan(self, req: control.ReshapeWan) -> str:
        return self._own_router(req).reshape(req.peer, req.old, req.new)

    def _on_wan_counters(self, req: control.WanCounters) -> str:
        return json.dumps(self._own_router(req).counters())

    def _on_pause(self, req: control.Request) -> str:  # pause and resume
        sig = signal.SIGSTOP if req.op == "pause" else signal.SIGCONT
        return f"{req.op}d {self._signal([self.role] + self.stress, sig)} process group(s)"

    def _on_stress(self, req: control.Stress) -> str:
        loads = stress_loads(float(req.load))
        old = self._set_stress(loads)
        return f"stress {req.load} cores in {len(loads)} process(es) (was {old})"

    # the one table from a request's type to its handler
    HANDLERS: dict[type[control.Request], Callable[[RoleSupervisor, Any], str]] = {
        control.Go: _on_go, control.Start: _on_go, control.Kill: _on_kill, control.Exec: _on_exec,
        control.Counters: _on_counters, control.Clock: _on_clock, control.Kernel: _on_kernel,
        control.Shape: _on_shape, control.Reshape: _on_reshape, control.Cut: _on_cut, control.Route: _on_route,
        control.ReshapeWan: _on_reshape_wan, control.WanCounters: _on_wan_counters, control.Pause: _on_pause,
        control.Resume: _on_pause, control.Stress: _on_stress, control.Replay: _on_replay}

    def _handle(self, data: dict) -> control.Reply:
        """Act on a request once: its reply, ok or failed (never the supervisor's end)."""
        try:
            req = control.parse_request(data)
        except untrusted.Refused as e:
            return control.Reply.failed(e.reason)
        try:
            # by name: a subclass's handler overrides its base's (node.fleet.device)
            return control.Reply(True, getattr(self, self.HANDLERS[type(req)].__name__)(req))
        except Exception as e:  # answer, never die: the runner waits for the answer
            return control.Reply.failed(f"{type(e).__name__}: {str(e)[:500]}")

    def _answer(self, req: dict) -> None:
        seq = req.pop("seq")
        if seq not in self._answers:
            self._answers[seq] = self._handle(req)
            if len(self._answers) > KEPT_ANSWERS:
                del self._answers[next(iter(self._answers))]  # the oldest
        self._send_json("ack", {"node": self.node, "seq": seq, **self._answers[seq].to_wire(),
                                **self._drop_counts()})

    def _request(self, payload: bytes):
        """The request in a message from the hub (a mapping with an integer seq), or None: what
        cannot be one is dropped and counted, never the supervisor's end."""
        try:
            req = untrusted.loads(payload, max_bytes=MAX_REQUEST)
        except untrusted.Refused as e:
            self.dropped.add(e.reason)
            return None
        if not isinstance(req, dict) or type(req.setdefault("seq", -1)) is not int:
            self.dropped.add("not a request")
            return None
        return req

    def _listen(self, timeout_ms: int) -> bool:
        """Take what came down; True once a request has arrived (the first is the "go")."""
        got = False
        for t, payload in self.listener.poll(timeout_ms):
            if t == channel.topic("beat"):
                self.beat.take(payload)
                continue
            self.beat.alive()  # a request is a word from the runner too, should it die before a beat
            req = self._request(payload)
            if req is not None:
                self._answer(req)
            got = True
        if self.terminated or self.beat.stopped():
            self.stop.set()
        return got

    def tend(self) -> int | None:
        """What the supervisor does between its looks for requests: its reports, its ended jobs
        and killed processes, its role's end; the supervisor's exit code once it should end."""
        self._send_stats()
        self._reap_jobs()
        self._join_killed()
        if self.role is not None and not self.role.is_alive():
            self.role.join()
            code = self.role.exitcode
            self._send_state(False, code)
            if not self.waits_for_rounds:
                return 0 if code == 0 else 1  # ended on its own: the container ends with it
            self.role = None  # a per-round trainer's device: the next round's start comes here
            self._rewarm()
        if self.role is None and self.stop.is_set():
            return 0  # idle, or killed and not restarted, when the run ended
        return None

    def _rewarm(self) -> None:
        _warm_for_trainers(self.role_cfg)

    def wait_for_go(self) -> bool:
        deadline = time.monotonic() + GO_DEADLINE
        while not self.stop.is_set() and time.monotonic() < deadline:
            if self._listen(100):
                return True
        why = ("stopped (SIGTERM)" if self.terminated else "the runner said stop" if self.beat.stop
               else f"the runner silent for {HEARTBEAT_TIMEOUT:.0f} s" if self.stop.is_set()
               else f"none in {GO_DEADLINE:.0f} s")
        print(f"supervisor of {self.node}: no request came: {why}", file=sys.stderr, flush=True)
        return False

    def run(self) -> int:
        try:
            if not self.wait_for_go():
                return 1
            while True:
                self._listen(int((self.POLL if self._busy() else IDLE_POLL) * 1000))
                code = self.tend()
                if code is not None:
                    return code
        finally:
            self._kill(self.stress + list(self.jobs.values()))
            for p in self._reap:
                p.join(timeout=5)
            self.listener.close()
            channel.flush()  # the last state and acks leave before the container ends
            if self.supervisor_sender is not None:
                self.supervisor_sender.close()


def _run_exec(payload: str) -> int:
    """`--exec '{"target": "module:function", "kwargs": {...}}'`: run one function (benchmarks)."""
    import importlib

    keys = channel_keys.load()  # its node's, for the mailbox: read while root may read their file
    drop_privileges(container_identity())  # `docker exec` starts it with the container's capabilities
    channel_keys.use(keys)
    job = json.loads(payload)
    module, func = job["target"].split(":")
    getattr(importlib.import_module(module), func)(**job["kwargs"])
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 2 and argv[1] == "--exec":
        return _run_exec(argv[2])
    if len(argv) != 5 or argv[1] != "--supervise":
        print("usage: python -m testbed.node.supervisor --supervise NODE UP DOWN | --exec JSON", file=sys.stderr)
        return 2
    # the runtime put them there for this container alone (run by hand, as in tests: its environment)
    keys = channel_keys.load() or channel_keys.from_environment()
    if keys is None or keys.node != argv[2]:
        print(f"no channel key for {argv[2]} at {channel_keys.KEY_FILE}: the hub would let it in nowhere",
              file=sys.stderr)
        return 2
    try:  # first, while this process has one thread: a fork that alone reads the supervisor's key
        sender = supervisor_sender.SupervisorSender.start(argv[3], argv[2])
    except supervisor_sender.SupervisorKeyError as e:
        print(f"no supervisor key for {argv[2]} at {channel_keys.SUPERVISOR_KEY_FILE} ({e}): the hub would take "
              "none of its answers", file=sys.stderr)
        return 2
    channel_keys.use(keys)  # this process's sockets, and what it forks, speak with them
    sup = RoleSupervisor(*argv[2:5], sender=sender)
    signal.signal(signal.SIGTERM, lambda *_: setattr(sup, "terminated", True))
    return sup.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
