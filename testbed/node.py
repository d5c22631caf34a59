"""Entry point of a node container (docker runtime): `python -m testbed.node CONFIG.json`.

The config names the role, its RoleConfig, the run's stop file and the node's background
stress. The node waits for its "go" file (CONFIG with suffix .go), which the runner writes
after the config, once the container's link is shaped: no training byte crosses an
unshaped link. `python -m testbed.node --exec JSON` runs one function (benchmarks).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path


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

    from .roles import ROLE_TARGETS, RoleConfig, run_stress
    from .transport import DelaySpec

    stress = []
    for load in spec.get("stress", []):
        p = mp.get_context("fork").Process(target=run_stress, args=(load, stop), daemon=True)
        p.start()
        stress.append(p)
    cfg_data = dict(spec["cfg"])
    cfg_data["delay"] = DelaySpec(**cfg_data["delay"])
    cfg = RoleConfig(**cfg_data)
    try:
        ROLE_TARGETS[cfg.role](cfg=cfg, stop_event=stop)
    finally:
        for p in stress:
            p.terminate()
            p.join(timeout=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
