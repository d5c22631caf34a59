"""A node's side of the control channel: how it talks to the runner over the run's control
network, never through the run directory.

Both ways are CURVE-encrypted and authenticated with the node's keys (node.channel_keys).

Up (node -> runner): each node process has one PUSH socket to the runner's hub (RoleConfig.records,
"tcp://ADDRESS:PORT" on the control network, apart from the node's shaped link: nothing here
counts as traffic). A record row is one message, [table name, its CSV line]; anything else is
[b"!" + kind, payload] (KINDS: a supervisor's acks and role state, the PS's report, a peer's
replica, a crash request, the broker's readiness). No frame is longer than CHUNK either way: a
longer payload travels as numbered parts (`framed`), put back together by its receiver (`Parts`),
so that a receiver may refuse a frame over CHUNK before it takes it in, and a publisher's queue
for a subscriber bounds bytes, not only messages. ZeroMQ's I/O thread sends at once, so a node
killed with -9 loses at most its last milliseconds of rows, and `flush()`, run when a role ends,
lets the last messages leave before the process exits.

Down (runner -> nodes): the hub publishes on RoleConfig.control; a node subscribes to the topics
meant for it (`Listener`): heartbeats and the stop, its supervisor's requests, its link delays,
the replicas (the coordinator, each on a topic naming the worker whose key sent it). Without a
records address (a role started outside a runner's run, as in some tests) a table is appended to
in the run directory itself.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Hashable, Optional

import zmq

from testbed.node import channel_keys, untrusted
from testbed.records import metrics
from testbed.records.virtual import world_row

# How long a role's exit waits for its last rows and report to leave: under the runner's 10-s grace
# before it kills a node (run/runner.py, stop_processes), and only while some are still queued.
# 3 s lost a starved PS's report (ps.json) at 1,000 devices with 50 a round.
LINGER_MS = 8000
QUEUE = 100_000  # rows held while the runner is slow to take them (then a write waits)
# A container can start before its ctl0 exists: its first SYN goes out another way and is lost,
# and TCP's retries would take two minutes; ZeroMQ gives up on an attempt after this and retries.
CONNECT_TIMEOUT_MS = 1000
CHUNK = 64 * 1024  # bytes: the longest frame of the control channel; a longer payload goes in parts
CURVE_FRAMING = 1024  # bytes a frame takes on the wire beyond its own (CURVE's: 33), which MAXMSGSIZE counts
# A part's header frame: the id of its message (random: a node's processes share its key), the
# part's index, the whole message's length (so a receiver refuses a message too long at its first part).
PART = struct.Struct(">QIQ")

_lock = threading.Lock()  # tables are written from the role's threads too (the stream buffer's)
_open: dict[str, Any] = {}  # this process's socket: pid, context, socket


def _socket(address: str) -> zmq.Socket:
    if _open.get("pid") != os.getpid():  # a forked child makes its own
        ctx = zmq.Context()
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        sock.setsockopt(zmq.SNDHWM, QUEUE)
        sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
        channel_keys.secure(sock)  # CURVE with its node's key: the hub knows who sends
        sock.connect(address)
        _open.update(pid=os.getpid(), ctx=ctx, sock=sock)
    return _open["sock"]


class RemoteTable:
    """One of the run's tables, written through the runner (same interface as metrics.CsvLog): rows
    measured on the wall, sent in the world's units (records.virtual) of a run dilated by `dilation`."""

    def __init__(self, address: str, name: str, dilation: float = 1.0):
        self.name, self.columns, self.dilation = name, metrics.TABLES[name], dilation
        self._topic = name.encode()
        with _lock:
            self._sock = _socket(address)

    def write(self, **row: Any) -> None:
        line = metrics.format_row(self.columns, world_row(self.name, row, self.dilation))
        with _lock:
            for frames in framed(self._topic, line):  # (a row over CHUNK: parts, which the hub drops)
                self._sock.send_multipart(frames)

    def close(self) -> None:
        pass  # the process's socket outlives its tables: flush() closes it


def open_table(cfg, name: str):
    """Table `name` for a role: through the runner when the run has a control network."""
    if cfg.records:
        return RemoteTable(cfg.records, name, cfg.dilation)
    return metrics.open_table(Path(cfg.run_dir), name, cfg.dilation)


KINDS = ("ack", "state", "report", "replica", "request", "ready", "stats", "put")  # the up messages that are not rows
MESSAGE_PREFIX = b"!"  # never the start of a table's name


def messages(kind: str, payload: bytes) -> list[list[bytes]]:
    """The ZeroMQ messages of one up message (kind: one of KINDS): one, or its parts."""
    if kind not in KINDS:
        raise ValueError(f"unknown message kind {kind!r}")
    return framed(MESSAGE_PREFIX + kind.encode(), payload)


def framed(head: bytes, payload: bytes) -> list[list[bytes]]:
    """`payload` after `head` (a kind's or a topic's frame): [head, payload] if it is at most
    CHUNK bytes, else its parts, each [head, PART header, at most CHUNK bytes]."""
    if len(payload) <= CHUNK:
        return [[head, payload]]
    mid, view = int.from_bytes(os.urandom(8), "big"), memoryview(payload)
    return [[head, PART.pack(mid, i, len(payload)), view[start:start + CHUNK]]
            for i, start in enumerate(range(0, len(payload), CHUNK))]


def part_header(header: bytes, body: int) -> tuple[int, int, int]:
    """(message id, index, message length) of a part with `body` bytes after its header: a part
    `framed` makes, or untrusted.Refused."""
    if len(header) != PART.size:
        raise untrusted.Refused("malformed part")
    mid, index, length = PART.unpack(header)
    last = (length - 1) // CHUNK
    if length <= CHUNK or index > last or body != (CHUNK if index < last else length - last * CHUNK):
        raise untrusted.Refused("malformed part")
    return mid, index, length


class Parts:
    """Messages that came in parts, put back together: one at a time under each key (a topic, or
    a sender and kind); a part out of its place drops what was begun under its key. What it holds
    is at most, for each key, the length that the caller let in (declared in every part)."""

    def __init__(self):
        self._open: dict[Hashable, tuple[int, int, list[bytes]]] = {}  # key -> (message id, length, parts so far)

    def add(self, key: Hashable, header: tuple[int, int, int], body: bytes) -> Optional[bytes]:
        """The whole message once part `body` (its `part_header`) ends it, else None;
        untrusted.Refused for a part out of its place."""
        mid, index, length = header
        begun = self._open.pop(key, None)
        if index == 0:
            begun = (mid, length, [])
        elif begun is None or begun[:2] != (mid, length) or len(begun[2]) != index:
            raise untrusted.Refused("part out of place")
        begun[2].append(body)
        if index == (length - 1) // CHUNK:
            return b"".join(begun[2])
        self._open[key] = begun
        return None

    def drop(self, key: Hashable) -> None:
        self._open.pop(key, None)


def json_payload(data: dict) -> bytes:
    """(a float that is not a number goes as null: the hub refuses NaN and Infinity)"""
    return untrusted.dumps(data, default=str).encode()


def send(address: str, kind: str, payload: bytes) -> None:
    """One message up to the runner."""
    parts = messages(kind, payload)
    with _lock:
        sock = _socket(address)
        for frames in parts:
            sock.send_multipart(frames)


def send_json(address: str, kind: str, data: dict) -> None:
    send(address, kind, json_payload(data))


def report(cfg, name: str, data: dict) -> None:
    """A role's report file (ps.json): the runner writes it into the run directory."""
    if cfg.records:
        send_json(cfg.records, "report", {"name": name, "data": data})
    else:
        (Path(cfg.run_dir) / name).write_text(untrusted.dumps(data, default=str))


def topic(kind: str, node: str = "") -> bytes:
    """A down topic: "beat" (every node), "node:NAME" (its supervisor), "delay:NAME",
    "replica:NAME" (a worker's replica, NAME the key it came with), "put:KEY" (a mailbox slot
    filled: node.mailbox).
    The trailing NUL: SUB matches prefixes, and "node:w1" must not match "node:w10"."""
    return f"{kind}:{node}".encode() + b"\0"


def topic_name(t: bytes, kind: str) -> str:
    """The NAME in a topic of `kind` (what follows `kind:`), "" if `t` is not one."""
    prefix = f"{kind}:".encode()
    if not (t.startswith(prefix) and t.endswith(b"\0")):
        return ""
    return t[len(prefix):-1].decode("utf-8", "replace")


class Listener:
    """A SUB socket on the runner's down channel, for the given topics (read without blocking).
    `max_message`: the longest message these topics carry, whole or in parts (a part of a longer
    one is dropped, and a frame over it or over CHUNK closes the connection, which ZeroMQ opens
    again); -1: any. `queue`: the messages (parts) ZeroMQ holds for the caller until it reads
    them (past it, the hub's queue for this subscriber fills, then the hub drops); 0: any.
    `keys` and `ctx`: a node's keys and a ZeroMQ context of the caller's (a fleet host's one
    process speaks for all of its devices, each with its own keys: node.fleet.device); by
    default the process's keys, and a context of the listener's own."""

    def __init__(self, address: str, topics: list[bytes], max_message: int = -1,
                 keys: channel_keys.ChannelKeys | None = None, ctx: zmq.Context | None = None, queue: int = 0):
        self.max_message = max_message
        self.parts = Parts()
        self.dropped = untrusted.Drops("control listener")  # parts it could not use, by reason
        self._ctx, self._own_ctx = ctx or zmq.Context(), ctx is None
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.MAXMSGSIZE, (CHUNK if max_message < 0 else min(max_message, CHUNK)) + CURVE_FRAMING)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, queue)
        self._sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
        for t in topics:
            self._sock.setsockopt(zmq.SUBSCRIBE, t)
        if keys is not None:
            keys.secure(self._sock)
        else:
            channel_keys.secure(self._sock)  # hears only the hub's key
        self._sock.connect(address)

    @property
    def socket(self) -> zmq.Socket:
        return self._sock  # (for a zmq.Poller over many listeners)

    def poll(self, timeout_ms: int = 0, most: int = 0) -> list[tuple[bytes, bytes]]:
        """Every message waiting (after up to `timeout_ms` for the first): (topic, payload); with
        `most`, those among the next `most` ZeroMQ messages (a part is one), the rest left queued."""
        out: list[tuple[bytes, bytes]] = []
        if not self._sock.poll(timeout_ms):
            return out
        taken = 0
        while not most or taken < most:
            taken += 1
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return out
            if len(frames) == 2:
                out.append((frames[0], frames[1]))
            elif len(frames) == 3:
                whole = self._whole(frames[0], frames[1], frames[2])
                if whole is not None:
                    out.append((frames[0], whole))
        return out

    def _whole(self, topic: bytes, header: bytes, body: bytes) -> Optional[bytes]:
        """The message that part `body` ends, else None (a part of a longer one than max_message
        is dropped at its first: nothing more of it is kept)."""
        try:
            head = part_header(header, len(body))
            if 0 <= self.max_message < head[2]:
                raise untrusted.Refused("message too long")
            return self.parts.add(topic, head, body)
        except untrusted.Refused as e:
            self.parts.drop(topic)
            self.dropped.add(e.reason)
            return None

    def close(self) -> None:
        self._sock.close(linger=0)
        if self._own_ctx:
            self._ctx.term()


class Sender:
    """A PUSH socket up to the hub with a node's own keys, in the caller's context: what a fleet
    host sends for each of its devices (a process's other messages use its keys: `send`)."""

    def __init__(self, address: str, keys: channel_keys.ChannelKeys, ctx: zmq.Context):
        self._sock = ctx.socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, LINGER_MS)
        self._sock.setsockopt(zmq.SNDHWM, QUEUE)
        self._sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
        keys.secure(self._sock)
        self._sock.connect(address)

    def send_json(self, kind: str, data: dict) -> None:
        for frames in messages(kind, json_payload(data)):
            self._sock.send_multipart(frames)

    def close(self) -> None:
        self._sock.close()  # its last messages leave within LINGER_MS, when the context ends


class Heartbeat:
    """The runner's beats, seen from a node: `stopped()` once the runner said stop, or went
    silent for `timeout` seconds after the first word heard from it (a runner killed with -9).
    Any message from the runner counts as a word (`alive`), beats carry the stop (`take`)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.last: float | None = None  # no beat yet (the control network may still be being built)
        self.stop = False

    def alive(self) -> None:
        self.last = time.monotonic()

    def take(self, payload: bytes) -> None:
        self.alive()
        try:
            beat = untrusted.loads(payload, max_bytes=4096)
        except untrusted.Refused:
            return
        self.stop = self.stop or (isinstance(beat, dict) and beat.get("stop") is True)

    def stopped(self) -> bool:
        return self.stop or (self.last is not None and time.monotonic() - self.last > self.timeout)


def flush() -> None:
    """Let this process's last rows leave (up to LINGER_MS), then close its socket."""
    with _lock:
        if _open.get("pid") == os.getpid():
            _open["sock"].close(linger=LINGER_MS)
            _open["ctx"].term()
        _open.clear()
