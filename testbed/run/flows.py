"""Measuring flows between nodes: saturating TCP, and the training transport's round trip.

Shared by the per-run link check (testbed.run.verify) and the benchmarks (testbed.bench):
each function here runs inside a node (`runtime.start(node, fn, kwargs)`), or drives such runs.
A job's results and flags go to the runner through mailbox slots (node.mailbox), which the
runner names as it would files (`scratch / "w1.json"`: runtimes.control.mailbox)."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Callable

from testbed.node import mailbox, untrusted

BENCH_PORT = 5201


def tcp_sink(port: int, seconds: float, flows: int, result_path: str, connected_path: str = "",
          warm: float = 1.0) -> None:
    """TCP receiver: count goodput bytes for `seconds` from `warm` after every flow connected
    (skipping slow start and the bucket's initial burst)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(flows)
    conns = [srv.accept()[0] for _ in range(flows)]
    if connected_path:  # every flow is up: a caller's measuring window may start its warm-up
        mailbox.touch(connected_path)
    for c in conns:
        c.setblocking(False)
    import selectors

    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    total = 0
    start = time.monotonic()
    t_first = None
    open_conns = len(conns)
    while open_conns and time.monotonic() - start < seconds + warm + 2:
        for key, _ in sel.select(timeout=0.2):
            try:
                data = key.fileobj.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                open_conns -= 1
                continue
            now = time.monotonic()
            if now - start >= warm:
                if t_first is None:
                    t_first = now
                if now - t_first <= seconds:
                    total += len(data)
    elapsed = min(seconds, time.monotonic() - (t_first or start))
    mailbox.write_text(result_path, json.dumps({"bytes": total, "seconds": elapsed}))


def tcp_source(addr: str, port: int, seconds: float, flows: int, ready_path: str = "", linger: float = 1.5) -> None:
    import threading

    buf = b"\0" * (1 << 16)
    if ready_path:
        mailbox.touch(ready_path)

    def one() -> None:
        for _ in range(600):  # the sink may still be starting (a container's python import)
            try:
                s = socket.create_connection((addr, port), timeout=2)
                break
            except OSError:
                time.sleep(0.05)
        else:
            return
        s.settimeout(None)  # the connect timeout must not apply to a send blocked by the shaper
        deadline = time.monotonic() + seconds + linger  # from the connection: a container connects late
        while time.monotonic() < deadline:
            s.sendall(buf)
        s.close()

    ts = [threading.Thread(target=one) for _ in range(flows)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


@dataclass
class Flow:
    """One measured direction: TCP from `sender` to `receiver` over `connections` connections;
    `counter()` reads the wire bytes that direction has crossed (an interface counter)."""
    label: str
    sender: object
    receiver: object
    counter: Callable[[], int]
    connections: int = 1


@dataclass
class FlowRate:
    goodput_bps: float  # payload the receiver got, over the sink's window
    wire_bps: float  # the counter's bytes (headers included) over the same window


def measure_flows(rt, scratch, flows: list[Flow], *, window: float, warmup: float,
                  linger: float = 0.3) -> list[FlowRate]:
    """Run every flow at once (a port each) and measure each over `window` seconds, `warmup`
    after all of them connected. The one measuring helper of the link check and the benchmarks:
    goodput and wire rate cover the same window, and each counter read is timed at its midpoint
    (docker's counters list every host link, tens of ms a read)."""
    scratch.mkdir(parents=True, exist_ok=True)
    results = [scratch / f"{f.label}.json" for f in flows]
    connected = [scratch / f"{f.label}.connected" for f in flows]
    for path in results + connected:
        path.unlink(missing_ok=True)
    sinks = [rt.start(f.receiver.name, tcp_sink, {"port": BENCH_PORT + i, "seconds": window, "warm": warmup,
                                               "flows": f.connections, "result_path": str(r),
                                               "connected_path": str(c)})
             for i, (f, r, c) in enumerate(zip(flows, results, connected))]
    time.sleep(0.2)
    sources = [rt.start(f.sender.name, tcp_source, {"addr": f.receiver.address, "port": BENCH_PORT + i,
                                                 "seconds": warmup + window, "flows": f.connections,
                                                 "linger": linger})
               for i, f in enumerate(flows)]
    deadline = time.monotonic() + 30  # a container's exec job starts its python in seconds, not ms
    while not all(c.exists() for c in connected) and time.monotonic() < deadline:
        time.sleep(0.01)

    def read() -> tuple[list[int], float]:
        before = time.monotonic()
        counts = [f.counter() for f in flows]
        return counts, (before + time.monotonic()) / 2

    time.sleep(warmup)
    c1, t1 = read()
    time.sleep(window)
    c2, t2 = read()
    for p in sources + sinks:
        p.join(warmup + window + 30)
    rates = []
    for a, b, r in zip(c1, c2, results):
        rates.append(FlowRate(goodput_bps=_goodput(r, window), wire_bps=(b - a) * 8 / (t2 - t1)))
    return rates


def _goodput(result, window: float) -> float:
    """A sink's result (a job's, from a node) in bit/s: 0 where there is none or it is malformed."""
    try:
        good = untrusted.loads(result.read_text()) if result.arrived() else {"bytes": 0, "seconds": window}
        return float(good["bytes"]) * 8 / max(float(good["seconds"]), 1e-9)
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def ping_server(address: str, delay: dict, count: int) -> None:
    import zmq

    from testbed.node import transport
    from testbed.node.wire import Message

    ctx = zmq.Context()
    ep = transport.ps_endpoint(ctx, address, transport.DelaySpec(**delay))
    answered = 0
    deadline = time.monotonic() + 60
    while answered < count and time.monotonic() < deadline:
        for sender, msg, _ in ep.recv(0.1):
            ep.send(Message("pong", msg.tensors, {}), sender)
            answered += 1
    time.sleep(0.2)
    ep.close()
    ctx.term()


def ping_client(ps_address: str, delay: dict, count: int, size: int, result_path: str, name: str = "w0") -> None:
    import torch
    import zmq

    from testbed.node import transport
    from testbed.node.wire import Message

    ctx = zmq.Context()
    ep = transport.node_endpoint(ctx, ps_address, name, transport.DelaySpec(**delay))
    payload = {"x": torch.zeros(max(1, size // 4))}
    rtts = []
    for _ in range(count):
        t = time.monotonic()
        ep.send(Message("ping", payload, {}))
        while not ep.recv(0.5):
            pass
        rtts.append(time.monotonic() - t)
    mailbox.write_text(result_path, json.dumps({"rtts": rtts}))
    ep.close()
    ctx.term()
