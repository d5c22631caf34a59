"""What a subscriber that never reads costs the control hub: a worker sends REPLICAS replicas of
SIZE MiB while STUCK subscribers to everything with the coordinator's key (a coordinator frozen)
each take one message and read no more, and a coordinator reads them all. The hub runs in a
process of its own; its VmRSS is read before and after (the code on PYTHONPATH: this tree, or
another commit's):

    PYTHONPATH=. .venv/bin/python benchmarks/hub_bytes.py [REPLICAS [SIZE_MIB [STUCK]]]

Defaults 80, 4, 1. Prints JSON: RSS before and after (MiB), the replicas the coordinator heard
whole, and the seconds the flood took."""
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import zmq

from testbed.node import channel, channel_keys
from testbed.runtimes.control.channel_auth import RunKeys


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _serve(keys, up, down, run_dir, ready, done) -> None:
    from testbed.runtimes.control.hub import ControlHub

    hub = ControlHub(None, "127.0.0.1", up, down, Path(run_dir), keys)
    ready.set()
    while not done.wait(1) and os.getppid() != 1:  # (its parent gone: it goes too)
        pass
    hub.close()


def _stuck(ctx: zmq.Context, keys, down: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    keys.secure(sub)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(down)
    sub.poll(10_000)  # a beat came: subscribed (it stays unread)
    return sub


def main(replicas: int = 80, size_mib: int = 4, stuck: int = 1) -> dict:
    keys = RunKeys()
    w0, ps = keys.admit("w0", "worker"), keys.admit("ps", "ps")
    up, down = _port(), _port()
    fork = mp.get_context("fork")
    ready, done = fork.Event(), fork.Event()
    hub = fork.Process(target=_serve, args=(keys, up, down, tempfile.mkdtemp(), ready, done))
    hub.start()
    if not ready.wait(60):
        raise RuntimeError("the hub did not start")
    ctx = zmq.Context()
    subs = [_stuck(ctx, ps, f"tcp://127.0.0.1:{down}") for _ in range(stuck)]
    coordinator = channel.Listener(f"tcp://127.0.0.1:{down}", [b"replica:"], keys=ps)
    time.sleep(0.5)
    before = _rss(hub.pid)
    channel_keys.use(w0)
    payload, last, heard = b"r" * (size_mib << 20), os.urandom(8), 0
    t0 = time.perf_counter()
    for _ in range(replicas):
        channel.send(f"tcp://127.0.0.1:{up}", "replica", payload)
    channel.send(f"tcp://127.0.0.1:{up}", "replica", last)
    while True:
        got = [p for _, p in coordinator.poll(100)]
        heard += sum(len(p) == len(payload) for p in got)
        if last in got:
            break
        if time.perf_counter() - t0 > 300:
            raise RuntimeError(f"the last replica did not come ({heard} did)")
    seconds = time.perf_counter() - t0
    time.sleep(1.0)
    after = _rss(hub.pid)
    for sub in subs:
        sub.close(linger=0)
    coordinator.close()
    channel.flush()
    done.set()
    hub.join(30)
    ctx.term()
    return {"replicas": replicas, "size_mib": size_mib, "stuck": stuck, "rss_before_mib": round(before),
            "rss_after_mib": round(after), "heard": heard, "seconds": round(seconds, 2)}


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:]))))
