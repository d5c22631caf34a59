"""Entry point of a node container (docker runtime): `python -m testbed.node.launch CONFIG.json`.

The config names the role, its RoleConfig, the run's stop file and the node's background
stress. The node waits for its "go" file (CONFIG with suffix .go), which the runner writes
after the config, once the container's link is shaped: no training byte crosses an
unshaped link. It then supervises the role (RoleSupervisor): kill, restart and stress
changes during the run act on its children and leave the container in place. `python -m testbed.node.launch --exec JSON` runs one function (benchmarks).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

from testbed.plan.cluster import stress_loads


class FileStop:
    """A stop flag shared through the run directory (containers share no semaphores).

    Also set when the runner's heartbeat file (touched every second) goes stale: a node
    never outlives a runner that was killed with -9 by more than HEARTBEAT_TIMEOUT.
    """

    HEARTBEAT_TIMEOUT = 20.0

    def __init__(self, path: str):
        self.path = path
        self.heartbeat = os.path.join(os.path.dirname(path), "heartbeat")
        self._local = False
        self._checked = 0.0

    def set(self) -> None:
        self._local = True
        Path(self.path).touch()

    def beat(self) -> None:
        Path(self.heartbeat).touch()

    def is_set(self) -> bool:
        if self._local or os.path.exists(self.path):
            return True
        now = time.time()
        if now - self._checked > 1.0:
            self._checked = now
            try:
                if now - os.stat(self.heartbeat).st_mtime > self.HEARTBEAT_TIMEOUT:
                    self._local = True
            except FileNotFoundError:
                pass
        return self._local


def _role_main(cfg_data: dict, stop) -> None:
    from testbed.node.roles import resolve_target
    from testbed.node.roles.common import RoleConfig
    from testbed.node.transport import DelaySpec

    os.setpgid(0, 0)  # its own process group: a kill takes whatever the role started too
    cfg_data = dict(cfg_data)
    cfg_data["delay"] = DelaySpec(**cfg_data["delay"])
    cfg = RoleConfig(**cfg_data)
    try:
        resolve_target(cfg.target)(cfg=cfg, stop_event=stop)
    finally:
        from testbed.node import channel

        channel.flush()  # the role's last records leave before the process exits


def _stress_main(load: float, stop) -> None:
    from testbed.node.roles.stress import run_stress

    os.setpgid(0, 0)
    run_stress(load, stop)


class RoleSupervisor:
    """The container's first process: runs the node's role and its background stress as children.

    A kill (a timeline event, `edgebed kill`) takes the children, as a crash would, and leaves
    the container -- its namespace and shaped link -- for a restart, which is what the netns
    runtime does too. Requests arrive as files DIR/NODE.ctl-SEQ (json: op kill | start | stress),
    answered by DIR/NODE.ack-SEQ; the role's state is in DIR/NODE.state (gen, running, exitcode)
    for the runner's view of it (runtimes.docker.RoleProcess). The container ends when the role
    ends on its own (finished, or crashed: the exit code is the role's), or at the stop file.
    """

    POLL = 0.02  # s: a request is acted on well within the timeline's 100 ms

    def __init__(self, conf_dir: Path, node: str, stop: FileStop):
        self.dir, self.node, self.stop = Path(conf_dir), node, stop
        self._ctx = mp.get_context("fork")
        self.role = None
        self.gen = 0
        self.stress: list = []
        self._reap: list = []  # killed, not yet joined

    def _write_state(self, running: bool, exitcode=None) -> None:
        path = self.dir / f"{self.node}.state"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"gen": self.gen, "running": running, "exitcode": exitcode}))
        os.replace(tmp, path)

    def _start(self, spec: dict) -> None:
        self.gen = int(spec.get("gen", self.gen + 1))
        self.role = self._ctx.Process(target=_role_main, args=(spec["cfg"], self.stop), name=f"role-{self.node}")
        self.role.start()
        self._write_state(True)
        self._set_stress(spec.get("stress", []))

    def _set_stress(self, loads: list[float]) -> int:
        old = self._kill(self.stress)
        self.stress = []
        for load in loads:
            p = self._ctx.Process(target=_stress_main, args=(load, self.stop), daemon=True)
            p.start()
            self.stress.append(p)
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
            except ProcessLookupError:
                pass
            self._reap.append(p)
        return n

    def _handle(self, req: dict) -> str:
        op = req.get("op")
        if op == "kill":
            n = self._kill([self.role] + self.stress)
            self.stress = []
            if self.role is not None:
                self._write_state(False, -9)
                self.role = None
            return f"killed {n} process group(s)"
        if op == "start":
            if self.role is not None and self.role.is_alive():
                return "already running"
            self._start(req)
            return "started"
        if op == "stress":
            loads = stress_loads(float(req["load"]))
            old = self._set_stress(loads)
            return f"stress {req['load']} cores in {len(loads)} process(es) (was {old})"
        return f"unknown request {op!r}"

    def _requests(self):
        for path in sorted(self.dir.glob(f"{self.node}.ctl-*")):
            try:
                req = json.loads(path.read_text())
            except ValueError:
                continue  # being written (writers rename into place, so only a stray file)
            path.unlink()
            yield path.name.rsplit("-", 1)[1], req

    def run(self, spec: dict) -> int:
        self._start({**spec, "gen": spec.get("gen", 1)})
        forwarded = False
        try:
            while True:
                for seq, req in self._requests():
                    try:
                        detail = self._handle(req)
                    except Exception as e:  # answer, never die: the runner waits for the answer
                        detail = f"failed: {type(e).__name__}: {e}"
                    ack = self.dir / f"{self.node}.ack-{seq}"
                    ack.with_name(ack.name + ".tmp").write_text(detail)
                    os.replace(ack.with_name(ack.name + ".tmp"), ack)
                while self._reap:
                    self._reap.pop().join(timeout=5)
                if self.stop._local and self.role is not None and not forwarded:
                    os.kill(self.role.pid, signal.SIGTERM)  # `docker stop` reaches only this process
                    forwarded = True
                if self.role is not None and not self.role.is_alive():
                    self.role.join()
                    code = self.role.exitcode
                    self._write_state(False, code)
                    return 0 if code == 0 else 1  # ended on its own: the container ends with it
                if self.role is None and self.stop.is_set():
                    return 0  # killed and not restarted before the run ended
                time.sleep(self.POLL)
        finally:
            self._kill(self.stress)
            for p in self._reap:
                p.join(timeout=5)


def _run_exec(payload: str) -> int:
    """`--exec '{"target": "module:function", "kwargs": {...}}'`: run one function (benchmarks)."""
    import importlib

    job = json.loads(payload)
    module, func = job["target"].split(":")
    getattr(importlib.import_module(module), func)(**job["kwargs"])
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 2 and argv[1] == "--exec":
        return _run_exec(argv[2])
    conf = Path(argv[1])
    go_file = conf.with_suffix(".go")
    stop_file = conf.parent / "stop"
    term = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: term.update(flag=True))
    # The runner writes the config, then the go file, once this container's link is shaped.
    deadline = time.monotonic() + 600
    while not go_file.exists():
        if term["flag"] or stop_file.exists() or time.monotonic() > deadline:
            return 1
        time.sleep(0.02)
    spec = json.loads(conf.read_text())
    stop = FileStop(spec["stop_file"])
    if term["flag"]:
        stop._local = True
    signal.signal(signal.SIGTERM, lambda *_: setattr(stop, "_local", True))
    if spec.get("idle"):  # a node that only hosts --exec jobs (benchmarks)
        while not stop.is_set():
            time.sleep(0.1)
        return 0

    return RoleSupervisor(conf.parent, conf.stem, stop).run(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
