"""Parameter-server transport over ZeroMQ (ROUTER at the PS, DEALER at each node).

Messages are wire.encode() frames. When the kernel cannot delay packets (no sch_netem),
link latency is emulated here: the receiver holds each message until
arrival + sender's uplink delay + own downlink delay (+ jitter), keeping FIFO order,
which is what a delay line in the path would do to a message-sized burst.
"""

from __future__ import annotations

import heapq
import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

import zmq

from testbed.node import untrusted, wire

PS_PORT = 5555
DELAY_MESSAGE = 4096  # bytes: a node's four delays


@dataclass
class DelaySpec:
    """One-way delays of this node's own access link (seconds), used only as a fallback."""

    up: float = 0.0
    up_jitter: float = 0.0
    down: float = 0.0
    down_jitter: float = 0.0
    # WAN path from each sender's site to this node's site: sender node name -> [delay, jitter]
    # (a DEALER's only sender, the PS, is "ps")
    paths: dict = field(default_factory=dict)
    # the runner's down channel ("tcp://ADDRESS:PORT", testbed.node.channel), where it publishes
    # this node's new delays {up, up_jitter, down, down_jitter} when the timeline changes its
    # latency (runtimes/live.py); "" = none. `node`: whose delays these are.
    control: str = ""
    node: str = ""
    _listener: Any = field(default=None, repr=False, compare=False)
    _next_check: float = field(default=0.0, repr=False)

    def refresh(self) -> None:
        """Take up a latency change from the runner (checked at most every 0.1 s)."""
        if not self.control:
            return
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + 0.1
        if self._listener is None:
            from testbed.node.channel import Listener, topic

            self._listener = Listener(self.control, [topic("delay", self.node)], max_message=DELAY_MESSAGE)
        got = self._listener.poll()
        if not got:
            return
        try:
            data = untrusted.loads(got[-1][1], max_bytes=DELAY_MESSAGE)
            up, up_jitter = float(data["up"]), float(data["up_jitter"])
            down, down_jitter = float(data["down"]), float(data["down_jitter"])
        except (ValueError, KeyError, TypeError, IndexError):
            return
        self.up, self.up_jitter, self.down, self.down_jitter = up, up_jitter, down, down_jitter

    @property
    def active(self) -> bool:
        return any((self.up, self.up_jitter, self.down, self.down_jitter)) or bool(self.paths) or bool(self.control)


class DelayLine:
    """Holds received messages until their emulated arrival time, FIFO per sender (like one wire each)."""

    def __init__(self, spec: DelaySpec, seed: int = 0):
        self.spec = spec
        self._rng = random.Random(seed)
        self._heap: list = []
        self._seq = 0
        self._last_release: dict = {}

    def _sample(self, mean: float, jitter: float) -> float:
        return max(0.0, self._rng.gauss(mean, jitter)) if jitter else mean

    def hold(self, item, sender, sender_up: float, sender_up_jitter: float, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        delay = self._sample(sender_up, sender_up_jitter) + self._sample(self.spec.down, self.spec.down_jitter)
        wan = self.spec.paths.get(sender if sender is not None else "ps")
        if wan:
            delay += self._sample(wan[0], wan[1])
        release = max(now + delay, self._last_release.get(sender, 0.0))  # no overtaking on one path
        self._last_release[sender] = release
        heapq.heappush(self._heap, (release, self._seq, item))
        self._seq += 1

    def ready(self, now: Optional[float] = None) -> list:
        now = time.monotonic() if now is None else now
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def next_release(self) -> Optional[float]:
        return self._heap[0][0] if self._heap else None


class Endpoint:
    """A socket plus the delay fallback plus byte counting. `peer` is None for the ROUTER side."""

    def __init__(self, sock: zmq.Socket, delay: DelaySpec, router: bool, seed: int = 0):
        self.sock = sock
        self.router = router
        self.delay = delay
        # Every endpoint keeps a delay line: a sender's uplink delay must be applied by the
        # receiver even when the receiver's own link has none.
        self.line = DelayLine(delay, seed)
        self.bytes_sent = 0
        self.bytes_received = 0
        # Messages dropped unread, by reason: any node may send anything, and nothing it sends
        # may end the receiver. `senders`, when set, are the only identities heard, each from the
        # address the plan gave it (known_senders): a node cannot speak as another.
        self.dropped = untrusted.Drops(f"{'router' if router else 'dealer'} endpoint")
        self.senders: Optional[dict[str, str]] = None

    def send(self, msg: wire.Message, to: Optional[str] = None) -> int:
        self.delay.refresh()
        if self.delay.up or self.delay.up_jitter:
            msg.meta["_up"] = self.delay.up
            msg.meta["_upj"] = self.delay.up_jitter
        frames = wire.encode(msg)
        n = wire.message_bytes(frames)
        if self.router:
            frames = [to.encode()] + frames
        self.sock.send_multipart(frames, copy=False)
        self.bytes_sent += n
        return n

    def _drain(self) -> list[tuple[Optional[str], wire.Message, int]]:
        got = []
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            n = wire.message_bytes(frames[1:] if self.router else frames)
            self.bytes_received += n
            item = self._accept(frames, n)
            if item is not None:
                got.append(item)
        return got

    def _accept(self, frames, n: int) -> Optional[tuple[Optional[str], wire.Message, int]]:
        """The message as (sender, message, bytes), or None when it is dropped (and counted)."""
        sender = None
        if self.router:
            try:
                sender = bytes(frames[0].buffer).decode()
            except UnicodeDecodeError:
                return self._drop("unnamed sender")  # a socket with no identity, not one of the run's
            if self.senders is not None:
                if sender not in self.senders:
                    return self._drop("unknown sender")
                if self.senders[sender] and frames[0].get("Peer-Address") != self.senders[sender]:
                    return self._drop("sender at another address")
            frames = frames[1:]
        try:
            msg = wire.decode(frames)
            up, upj = float(msg.meta.pop("_up", 0.0)), float(msg.meta.pop("_upj", 0.0))
        except (wire.WireError, TypeError, ValueError, OverflowError):
            return self._drop("malformed")
        if not (0.0 <= up <= 60.0 and 0.0 <= upj <= 60.0):  # a sender's own delay, as links are bounded
            return self._drop("malformed")
        msg.meta["_delay"] = (up, upj)
        return sender, msg, n

    def _drop(self, reason: str) -> None:
        self.dropped.add(reason)
        return None

    def recv(self, timeout: float) -> list[tuple[Optional[str], wire.Message, int]]:
        """Messages deliverable within `timeout` seconds (possibly none)."""
        deadline = time.monotonic() + timeout
        self.delay.refresh()
        while True:
            for item in self._drain():
                self.line.hold(item, item[0], *item[1].meta.pop("_delay"))
            ready = self.line.ready()
            if ready:
                return ready
            now = time.monotonic()
            if now >= deadline:
                return []
            wait = deadline - now
            release = self.line.next_release()
            if release is not None and release - now < wait:
                wait = max(0.0, release - now)
                if wait < 0.002:
                    # poll() counts whole milliseconds; sleep the last bit so held messages
                    # are released on time, not up to 1 ms late.
                    time.sleep(wait)
                    continue
                wait -= 0.001  # wake a little early, then sleep the remainder precisely
            self.sock.poll(timeout=max(1, int(wait * 1000)))

    def close(self) -> None:
        self.sock.close(linger=0)


def known_senders(names, addresses: dict[str, str]) -> dict[str, str]:
    """The identities a receiver hears, each with the address it must connect from ("" where the
    plan gives none: any)."""
    return {n: addresses.get(n, "") for n in names}


# Messages a ROUTER queues per sender before it stops reading from that sender's connection:
# a training node has a few in flight; a flooding one is held back by TCP, not by our memory.
RECEIVE_QUEUE = 1000
# Messages the PS queues for one node (a node waits for each answer: a few are in flight). A
# connection that stopped reading (one that took a node's identity over, say) fills it; then a
# send to it fails within SEND_TIMEOUT_MS and the node counts as unreachable, as a dead one does.
SEND_QUEUE = 1000
SEND_TIMEOUT_MS = 1000


def _seed(identity: str, seed: int) -> int:
    # Independent jitter per node: equal seeds would make the two halves of a round trip equal.
    return zlib.crc32(identity.encode()) ^ seed


def _limit(s: zmq.Socket, max_frame: Optional[int]) -> None:
    if max_frame:
        s.setsockopt(zmq.MAXMSGSIZE, max_frame)  # a sender of a larger frame is disconnected unread


def ps_endpoint(ctx: zmq.Context, address: str, delay: DelaySpec, seed: int = 0,
                max_frame: Optional[int] = None) -> Endpoint:
    s = ctx.socket(zmq.ROUTER)
    _limit(s, max_frame)
    s.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown peer -> error, not silent drop
    s.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted node takes its identity back
    s.setsockopt(zmq.SNDHWM, SEND_QUEUE)
    s.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
    s.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
    s.bind(f"tcp://{address}:{PS_PORT}")
    return Endpoint(s, delay, router=True, seed=_seed("ps", seed))


def node_endpoint(ctx: zmq.Context, ps_address: str, identity: str, delay: DelaySpec, seed: int = 0) -> Endpoint:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity.encode())
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.RECONNECT_IVL, 100)
    s.connect(f"tcp://{ps_address}:{PS_PORT}")
    return Endpoint(s, delay, router=False, seed=_seed(identity, seed))


# -- decentralized strategies: each worker receives on its own ROUTER, sends on one DEALER per peer

PEER_PORT = 5556


def peer_inbox(ctx: zmq.Context, identity: str, delay: DelaySpec, seed: int = 0,
               max_frame: Optional[int] = None) -> Endpoint:
    """Where a worker receives from its peers (senders are known by their DEALER identity)."""
    s = ctx.socket(zmq.ROUTER)
    _limit(s, max_frame)
    s.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
    s.bind(f"tcp://*:{PEER_PORT}")
    return Endpoint(s, delay, router=True, seed=_seed(identity + "/peers", seed))


def peer_outbox(ctx: zmq.Context, address: str, identity: str, delay: DelaySpec) -> Endpoint:
    """This worker's direct connection to one peer (its own TCP flow, shaped per destination)."""
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity.encode())
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RECONNECT_IVL, 100)
    s.connect(f"tcp://{address}:{PEER_PORT}")
    return Endpoint(s, delay, router=False)
