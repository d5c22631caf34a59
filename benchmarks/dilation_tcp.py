"""TCP under time dilation: does a transfer on a path dilated by k take k times as long?

Dilating a run by k divides every rate by k and multiplies every delay by k, so its virtual time
(wall time / k) should not move with k. The kernel's TCP timers do not dilate (the RTO floor,
delayed ACKs, the pacing of the initial window), nor does the per-message cost of the hosts'
system calls. This measures what is left: for each k, a path between two network namespaces
made here is shaped to rate r/k (HTB on each veth end's egress: edgebed's plan_direction and
apply_direction, changed in place between ks) and one-way delay d*k (netem's where the kernel
has it, detected in the namespace with probe_links; else edgebed's transport delay,
node/transport.py: the receiver holds each message for the sender's up delay plus its own down
delay, which only messages through the transport see). Per k, `--reps` times:

- bulk: 1 MB and 10 MB over a new kernel TCP connection (connect, send, one byte back);
- rr: 20 request/response exchanges (200 B each way in, 20 kB back) on one kernel TCP connection
  (TCP_NODELAY, as ZeroMQ sets it);
- msg: 5 exchanges through edgebed's transport (ZeroMQ DEALER/ROUTER with the transport's delay
  line; a 200 B request, a 1 MB reply), as a worker and its parameter server make them;
- bulk-loss: 1 MB over kernel TCP with `--loss` random loss on the data's way (edgebed's loss:
  netem's, else the eBPF drop filter), `--loss-reps` times: loss recovery is where the kernel's
  timers that do not dilate (the 200 ms RTO floor, delayed ACKs) should show.

Virtual time (wall / k) is set against two predictions: k = 1's measurement, and the analytic
time: bytes on the wire (TCP payload in 1448-byte segments, 1514-byte frames as HTB counts
them) over r, plus round trips of 2d (kernel TCP: the handshake and the last byte's answer,
where the kernel delays; the transport: one delay each way per exchange). Slow start and loss
recovery are not in the analytic time. Needs root. Nothing leaves the two namespaces, which are removed at the end,
also on an error, Ctrl-C or SIGTERM.

    python benchmarks/dilation_tcp.py [--rate 50mbit] [--delay 10ms] [--ks 1,2,4,8] [--reps 3]
        [--out benchmarks/results/dilation-tcp]   # writes OUT.json and OUT.csv
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import signal
import socket
import statistics
import struct
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.kernel.netlink import (  # noqa: E402
    add_veth,
    create_netns,
    disable_offloads,
    enter_netns,
    entered_netns,
    ns_iproute,
    remove_netns,
)
from testbed.kernel.shaping import apply_direction, plan_direction, probe_links, reshape  # noqa: E402
from testbed.scenario import units  # noqa: E402

ADDR_A, ADDR_B = "10.213.77.1", "10.213.77.2"  # a /30 inside the two namespaces only
PORT = 5601
WIRE_PER_PAYLOAD = 1514 / 1448  # a full TCP segment with timestamps, as an Ethernet frame
BULK_SIZES = (1_000_000, 10_000_000)
RR_COUNT, RR_REQUEST, RR_RESPONSE = 20, 200, 20_000
MSG_COUNT, MSG_REQUEST, MSG_REPLY = 5, 200, 1_000_000
LOSS_BULK = 1_000_000
HEADER = struct.Struct("!cQII")  # op, bytes (bulk) or exchanges (rr), request size, response size


@dataclass
class Shape:
    """One direction as plan_direction reads it (kernel.shaping.DirectionShape)."""

    rate: Optional[float]
    latency: Optional[float]
    jitter: Optional[float] = None
    loss: Optional[float] = None


# --------------------------------------------------------------------------------------------
# the path: two namespaces, a veth between them, each end's egress shaped


class Path2:
    """Namespaces a and b joined by a veth (ADDR_A, ADDR_B); `shape(k)` sets both directions."""

    def __init__(self, rate: float, delay: float):
        tag = uuid.uuid4().hex[:6]
        self.ns = (f"ebdil-{tag}-a", f"ebdil-{tag}-b")
        self.ifs = (f"dil{tag}a", f"dil{tag}b")
        self.rate, self.delay = rate, delay
        self.plans: list = [None, None]
        self.made: list[str] = []
        self.caps = None

    def __enter__(self) -> "Path2":
        try:
            self._make()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _make(self) -> None:
        for ns in self.ns:
            create_netns(ns, ipv6=False)
            self.made.append(ns)
        ipr = ns_iproute(self.ns[0])
        try:
            add_veth(ipr, self.ifs[0], self.ns[1], self.ifs[1])
            self.caps = probe_links(ipr)
        finally:
            ipr.close()
        for ns, ifname, addr in zip(self.ns, self.ifs, (ADDR_A, ADDR_B)):
            ipr = ns_iproute(ns)
            try:
                idx = ipr.link_lookup(ifname=ifname)[0]
                ipr.addr("add", index=idx, address=addr, prefixlen=30)
                ipr.link("set", index=idx, state="up")
                ipr.link("set", index=1, state="up")
            finally:
                ipr.close()
            disable_offloads(ns, [ifname])

    def shape(self, k: int, loss: Optional[float] = None):
        """Both directions at rate r/k and one-way delay d*k, and `loss` on a's egress (the data's
        way); the plan of a's egress."""
        for i, (ns, ifname) in enumerate(zip(self.ns, self.ifs)):
            plan = plan_direction(Shape(self.rate / k, self.delay * k, loss=loss if i == 0 else None), self.caps)
            ipr = ns_iproute(ns)
            try:
                idx = ipr.link_lookup(ifname=ifname)[0]
                if self.plans[i] is None:
                    apply_direction(ipr, idx, plan)
                else:
                    reshape(ipr, idx, self.plans[i], plan)
            finally:
                ipr.close()
            self.plans[i] = plan
        return self.plans[0]

    def __exit__(self, *exc) -> None:
        for ns in reversed(self.made):  # the veth goes with its namespace
            try:
                remove_netns(ns)
            except OSError as e:
                print(f"warning: {ns} not removed: {e}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# servers and clients (each server a forked process in namespace b)


def _read_exactly(conn: socket.socket, n: int) -> None:
    view = bytearray(min(n, 1 << 20))
    while n > 0:
        got = conn.recv_into(view, min(n, len(view)))
        if not got:
            raise ConnectionError("the peer closed early")
        n -= got


def tcp_server(ns: str) -> None:
    """Serve bulk and rr connections, one at a time, in namespace `ns`, until killed."""
    enter_netns(ns)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ADDR_B, PORT))
    srv.listen(4)
    while True:
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            head = bytearray(HEADER.size)
            _read_exactly_into(conn, head)
            op, n, req, resp = HEADER.unpack(head)
            if op == b"B":
                _read_exactly(conn, n)
                conn.sendall(b"k")
            else:
                reply = b"r" * resp
                for _ in range(n):
                    _read_exactly(conn, req)
                    conn.sendall(reply)


def _read_exactly_into(conn: socket.socket, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < len(buf):
        n = conn.recv_into(view[got:])
        if not n:
            raise ConnectionError("the peer closed early")
        got += n


def _connect(ns: str) -> socket.socket:
    with entered_netns(ns):  # the socket stays in a's namespace whatever thread uses it
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(120)
    return s


def bulk(ns: str, size: int) -> float:
    """Wall seconds from connect to the server's byte back, `size` bytes sent."""
    s = _connect(ns)
    data = memoryview(b"x" * min(size, 1 << 20))
    try:
        t = time.perf_counter()
        s.connect((ADDR_B, PORT))
        s.sendall(HEADER.pack(b"B", size, 0, 0))
        left = size
        while left > 0:
            left -= s.send(data[:min(left, len(data))])
        if s.recv(1) != b"k":
            raise ConnectionError("no answer")
        return time.perf_counter() - t
    finally:
        s.close()


def request_response(ns: str) -> float:
    """Wall seconds of RR_COUNT exchanges on one connection (made before the clock starts)."""
    s = _connect(ns)
    try:
        s.connect((ADDR_B, PORT))
        s.sendall(HEADER.pack(b"R", RR_COUNT, RR_REQUEST, RR_RESPONSE))
        request = b"q" * RR_REQUEST
        t = time.perf_counter()
        for _ in range(RR_COUNT):
            s.sendall(request)
            _read_exactly(s, RR_RESPONSE)
        return time.perf_counter() - t
    finally:
        s.close()


def transport_server(ns: str) -> None:
    """A parameter server's endpoint in `ns`: answers every request with a MSG_REPLY-byte tensor."""
    enter_netns(ns)
    import torch
    import zmq

    from testbed.node import wire
    from testbed.node.transport import DelaySpec, ps_endpoint

    ep = ps_endpoint(zmq.Context(), ADDR_B, DelaySpec())
    reply = wire.Message("reply", {"x": torch.zeros(MSG_REPLY // 4)})
    while True:
        for sender, _msg, _n in ep.recv(1.0):
            ep.send(reply, to=sender)


def transport_client(ns: str, delay: float, reps: int, out) -> None:
    """A worker's endpoint in `ns` whose link delays `delay` each way (the no-netem fallback: its up
    delay goes with each message, its down delay is held here): the wall seconds of MSG_COUNT
    exchanges, `reps` times, sent back on `out`."""
    enter_netns(ns)
    import torch
    import zmq

    from testbed.node import wire
    from testbed.node.transport import DelaySpec, node_endpoint

    ep = node_endpoint(zmq.Context(), ADDR_B, f"w{os.getpid()}", DelaySpec(up=delay, down=delay))
    request = wire.Message("request", {"x": torch.zeros(MSG_REQUEST // 4)})
    ep.send(request)  # connect and warm both ends; not timed
    while not ep.recv(30.0):
        pass
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(MSG_COUNT):
            ep.send(request)
            got: list = []
            while not got:
                got = ep.recv(30.0)
        times.append(time.perf_counter() - t)
    out.send(times)


# --------------------------------------------------------------------------------------------
# the measurement


def analytic(workload: str, size: int, rate: float, delay: float, kernel_delay: bool) -> float:
    """Virtual seconds predicted: wire bytes over the rate plus round trips (see the docstring)."""
    rtt = 2 * delay
    if workload.startswith("bulk"):
        return size * 8 * WIRE_PER_PAYLOAD / rate + (2 * rtt if kernel_delay else 0.0)
    if workload == "rr":
        return RR_COUNT * ((RR_REQUEST + RR_RESPONSE) * 8 * WIRE_PER_PAYLOAD / rate + (rtt if kernel_delay else 0.0))
    return MSG_COUNT * ((MSG_REQUEST + MSG_REPLY) * 8 * WIRE_PER_PAYLOAD / rate + rtt)


def measure_k(path: Path2, k: int, reps: int, fork, loss: float = 0.0, loss_reps: int = 5) -> list[dict]:
    plan = path.shape(k)
    transport_delay = plan.transport_delay_s  # 0 where netem delays the kernel's packets
    rows = []
    for size in BULK_SIZES:
        rows.append({"workload": "bulk", "bytes": size, "wall_s": [bulk(path.ns[0], size) for _ in range(reps)]})
    rows.append({"workload": "rr", "bytes": RR_COUNT * (RR_REQUEST + RR_RESPONSE),
                 "wall_s": [request_response(path.ns[0]) for _ in range(reps)]})
    here, there = fork.Pipe(duplex=False)
    client = fork.Process(target=transport_client, args=(path.ns[0], transport_delay, reps, there), daemon=True)
    client.start()
    try:
        if not here.poll(600):
            raise TimeoutError("the transport client did not answer")
        msg_times = here.recv()
    finally:
        client.join(5)
        if client.is_alive():
            client.kill()
    rows.append({"workload": "msg", "bytes": MSG_COUNT * (MSG_REQUEST + MSG_REPLY), "wall_s": msg_times})
    if loss:  # the kernel's recovery timers (RTO floor, delayed ACKs) count in wall time, not dilated
        lossy = path.shape(k, loss)
        rows.append({"workload": "bulk-loss", "bytes": LOSS_BULK, "loss": loss, "loss_by": lossy.mechanisms.get("loss"),
                     "wall_s": [bulk(path.ns[0], LOSS_BULK) for _ in range(loss_reps)]})
        path.shape(k)
    for r in rows:
        r.update(k=k, rate_bps=path.rate / k, one_way_delay_s=path.delay * k,
                 delay_by=plan.mechanisms.get("latency", "none"), virtual_s=[w / k for w in r["wall_s"]])
    return rows


def judged(rows: list[dict], rate: float, delay: float, kernel_delay: bool) -> list[dict]:
    """Each row with its virtual time (mean and median), k = 1's, the analytic one, and the errors."""
    base = {(r["workload"], r["bytes"]): r["wall_s"] for r in rows if r["k"] == 1}
    for r in rows:
        size = r["bytes"] if r["workload"].startswith("bulk") else 0
        k1 = base.get((r["workload"], r["bytes"]))
        r["virtual_mean_s"] = statistics.fmean(r["virtual_s"])
        # a rare stall (a lost SYN's 1 s, an RTO) moves the mean; the median says what most repetitions took
        r["virtual_median_s"] = statistics.median(r["virtual_s"])
        r["virtual_spread"] = (max(r["virtual_s"]) - min(r["virtual_s"])) / r["virtual_mean_s"]
        r["k1_s"] = statistics.fmean(k1) if k1 else None
        r["error_vs_k1"] = r["virtual_mean_s"] / r["k1_s"] - 1 if k1 else None
        r["median_error_vs_k1"] = r["virtual_median_s"] / statistics.median(k1) - 1 if k1 else None
        r["analytic_s"] = analytic(r["workload"], size, rate, delay, kernel_delay)
        r["error_vs_analytic"] = r["virtual_mean_s"] / r["analytic_s"] - 1
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'workload':9s} {'bytes':>10s} {'k':>2s} {'wall s':>8s} {'virtual s':>9s} {'spread':>7s} " \
           f"{'k=1 s':>8s} {'err k=1':>8s} {'median':>8s} {'analytic':>8s} {'err an.':>8s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        e1 = f"{100 * r['error_vs_k1']:+7.1f}%" if r["error_vs_k1"] is not None else "       -"
        m1 = f"{100 * r['median_error_vs_k1']:+7.1f}%" if r["median_error_vs_k1"] is not None else "       -"
        lines.append(f"{r['workload']:9s} {r['bytes']:>10d} {r['k']:>2d} {statistics.fmean(r['wall_s']):8.3f} "
                     f"{r['virtual_mean_s']:9.3f} {100 * r['virtual_spread']:6.1f}% {r['k1_s'] or 0:8.3f} {e1} {m1} "
                     f"{r['analytic_s']:8.3f} {100 * r['error_vs_analytic']:+7.1f}%")
    return "\n".join(lines)


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    import json

    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    cols = ["workload", "bytes", "loss", "k", "rate_bps", "one_way_delay_s", "delay_by", "virtual_mean_s",
            "virtual_spread", "k1_s", "error_vs_k1", "virtual_median_s", "median_error_vs_k1", "analytic_s",
            "error_vs_analytic"]
    with out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, cols + ["wall_s"], extrasaction="ignore")
        w.writeheader()
        for r in result["rows"]:
            w.writerow({**{c: r.get(c) for c in cols}, "wall_s": " ".join(f"{x:.4f}" for x in r["wall_s"])})


def _stop(signum, frame):
    raise KeyboardInterrupt  # the namespaces go in the finally blocks, as on Ctrl-C


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="50mbit", help="the undilated rate r")
    ap.add_argument("--delay", default="10ms", help="the undilated one-way delay d")
    ap.add_argument("--ks", default="1,2,4,8", help="dilation factors; 1 is measured first, as the reference")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--loss", type=float, default=0.05, help="random loss on the data's way for bulk-loss (0: none)")
    ap.add_argument("--loss-reps", type=int, default=10, help="bulk-loss repetitions (its spread is wide)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "dilation-tcp")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    rate, delay = units.parse_rate(args.rate), units.parse_duration(args.delay)
    ks = sorted({1, *(int(k) for k in args.ks.split(","))})
    signal.signal(signal.SIGTERM, _stop)
    fork = multiprocessing.get_context("fork")
    servers: list = []
    rows: list[dict] = []
    with Path2(rate, delay) as path:
        try:
            servers = [fork.Process(target=f, args=(path.ns[1],), daemon=True) for f in (tcp_server, transport_server)]
            for s in servers:
                s.start()
            time.sleep(3.0)  # the transport server imports torch before it binds
            for k in ks:
                rows += measure_k(path, k, args.reps, fork, args.loss, args.loss_reps)
                print(f"k={k}: done", file=sys.stderr)
        finally:
            for s in servers:
                s.kill()
                s.join(5)
        kernel_delay = bool(path.caps and path.caps.netem)
    rows = judged(rows, rate, delay, kernel_delay)
    result = {"benchmark": "dilation_tcp", "rate_bps": rate, "one_way_delay_s": delay, "ks": ks, "reps": args.reps,
              "kernel_delay": "netem" if kernel_delay else "none: no sch_netem, the transport's delay only",
              "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}
    print(table(rows))
    write(result, args.out)
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
