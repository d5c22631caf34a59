"""The control channel alone, on loopback: record rows per second from one node into the hub,
and MB/s of 1 MiB replicas the hub forwards to a subscriber, with the code on PYTHONPATH (this
tree, or another commit's worktree: benchmarks/channel_cost.sh makes one):

    PYTHONPATH=. .venv/bin/python benchmarks/channel_rate.py [RUNS]

A hub with keys (the authenticated channel) gets a worker's keys admitted and used."""
import json
import socket
import sys
import tempfile
import time
from pathlib import Path

from testbed.node import channel
from testbed.records import metrics
from testbed.runtimes.control.hub import ControlHub


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(rows=50_000, replicas=200):
    d = Path(tempfile.mkdtemp())
    metrics.init_tables(d)
    up, down = port(), port()
    hub = ControlHub(None, "127.0.0.1", up, down, d)
    if hasattr(hub, "keys"):  # the authenticated channel
        from testbed.node import channel_keys
        channel_keys.use(hub.keys.admit("w0", "worker"))
    up_url, down_url = f"tcp://127.0.0.1:{up}", f"tcp://127.0.0.1:{down}"
    table = channel.RemoteTable(up_url, "steps.csv")
    table.write(time=0.0, node="w0", step=0, loss=1.0)
    while hub.rows < 1:
        time.sleep(0.01)
    t0 = time.perf_counter()
    for k in range(rows):
        table.write(time=float(k), node="w0", step=k, loss=0.5)
    while hub.rows < rows + 1:
        time.sleep(0.001)
    rows_s = rows / (time.perf_counter() - t0)
    listener = channel.Listener(down_url, [b"replica:"], keys=hub.keys.admit("ps", "ps"))  # the coordinator's
    time.sleep(0.5)
    payload = b"x" * (1 << 20)
    got, t0 = 0, time.perf_counter()
    for _ in range(replicas):
        channel.send(up_url, "replica", payload)
        got += len(listener.poll(0))
    while got < replicas and time.perf_counter() - t0 < 60:
        got += len(listener.poll(100))
    mb_s = got * len(payload) / (time.perf_counter() - t0) / 1e6
    listener.close()
    channel.flush()
    hub.close()
    return {"rows_per_s": round(rows_s), "replica_MB_per_s": round(mb_s, 1), "replicas": got}


if __name__ == "__main__":
    runs = [main() for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3)]
    print(json.dumps(runs))
