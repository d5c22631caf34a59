"""Who may speak on a run's control channel: the run's CURVE keys and the hub's ZAP answers.

Each run makes its own keys on the runner's machine: the hub's server pair, and a pair per node
(or site router), made as each node is (`RunKeys.admit`) and handed to that node alone
(node.channel_keys says how); a node run under a supervisor (docker, swarm, a fleet's device) has
a second pair, its supervisor's (`RunKeys.supervisor`), which what the node runs never holds. The
hub's sockets are CURVE servers that ask ZAP (ZeroMQ's authentication protocol, RFC 27) at each
handshake; the hub answers (`answer_zap`): a key of the run passes, with its node's name as the
connection's User-Id and, for a supervisor's key, the property HOLDER = SUPERVISOR, which ZeroMQ
attaches to every message that comes over it; any other key is refused. A client without CURVE, or one that
holds a wrong hub key, fails its handshake before ZAP is asked: the hub counts those from its
sockets' monitors (`handshake_failures`).
"""

from __future__ import annotations

import errno
from typing import Optional

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from testbed.node.channel_keys import ChannelKeys

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks, in the sockets' own context
DOMAIN = b"edgebed"
# A handshake that failed before ZAP was asked: no CURVE (a plain client), or a wrong hub key.
HANDSHAKE_REFUSED = "handshake failed (no CURVE, or not the hub's key)"
HOLDER, SUPERVISOR = "Holder", b"supervisor"  # the ZAP property a supervisor's key's messages carry


class RunKeys:
    """A run's keys: the hub's pair, each node's (its name and role with it), and each supervised
    node's supervisor's."""

    def __init__(self):
        self.public, self.secret = zmq.curve_keypair()
        self._nodes: dict[str, ChannelKeys] = {}
        self._supervisors: dict[str, ChannelKeys] = {}
        self._names: dict[bytes, str] = {}  # a node's or its supervisor's public key, raw -> the node's name
        self._supervisor_keys: set[bytes] = set()  # the supervisors' public keys, raw
        self.roles: dict[str, str] = {}  # node -> its role (what it may send: runtimes.control.hub)

    def admit(self, name: str, role: str) -> ChannelKeys:
        """The keys of node `name` (made on its first call): what the node alone is handed."""
        if name not in self._nodes:
            public, secret = zmq.curve_keypair()
            self._nodes[name] = ChannelKeys(name, public, secret, self.public)
            self.roles[name] = role
            self._names[z85.decode(public)] = name
        return self._nodes[name]

    def supervisor(self, name: str) -> ChannelKeys:
        """The keys of admitted node `name`'s supervisor (made on its first call), handed to the
        supervisor alone: from then on the node's acks, states and counters come only with them."""
        if name not in self._supervisors:
            public, secret = zmq.curve_keypair()
            self._supervisors[name] = ChannelKeys(name, public, secret, self.public)
            self._names[z85.decode(public)] = name
            self._supervisor_keys.add(z85.decode(public))
        return self._supervisors[name]

    def supervised(self, name: str) -> bool:
        """Whether node `name` has a supervisor's key."""
        return name in self._supervisors

    def of(self, name: str) -> ChannelKeys:
        return self._nodes[name]

    def name_of(self, raw_public: bytes) -> Optional[str]:
        return self._names.get(raw_public)

    def is_supervisors(self, raw_public: bytes) -> bool:
        return raw_public in self._supervisor_keys

    def serve(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE server with the hub's key that lets in only what ZAP passes (before it binds)."""
        sock.curve_server = True
        sock.curve_secretkey = self.secret
        sock.zap_domain = DOMAIN
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP answer: no one in (libzmq's default lets all in)


def answer_zap(sock: zmq.Socket, keys: RunKeys) -> Optional[str]:
    """Answer the ZAP request waiting on `sock` (a REP bound at ZAP_ENDPOINT): a key of the run
    passes, its node's name the User-Id; why it was refused, else None."""
    frames = sock.recv_multipart()
    request_id = frames[1] if len(frames) > 1 else b""
    name, metadata = None, b""
    if len(frames) == 7 and frames[0] == b"1.0" and frames[2] == DOMAIN and frames[5] == b"CURVE":
        name = keys.name_of(frames[6])
        if name and keys.is_supervisors(frames[6]):
            metadata = _property(HOLDER, SUPERVISOR)
    status = [b"200", b"OK"] if name else [b"400", b"not a key of this run"]
    sock.send_multipart([b"1.0", request_id, *status, (name or "").encode(), metadata])
    return None if name else "unknown key"


def _property(name: str, value: bytes) -> bytes:
    """One ZAP metadata property as ZMTP encodes it (a name's length in a byte, a value's in four)."""
    return bytes([len(name)]) + name.encode() + len(value).to_bytes(4, "big") + value


def by_supervisor(frame: zmq.Frame) -> bool:
    """Whether a message came with a supervisor's key (its connection's ZAP property)."""
    try:
        holder = frame.get(HOLDER)
    except zmq.ZMQError:  # a node's key: no such property
        return False
    return isinstance(holder, str) and holder.encode() == SUPERVISOR


def handshake_failures(monitor: zmq.Socket) -> list[str]:
    """Why each handshake failed among the events waiting on a socket's monitor: a client that is
    no node of the run (no CURVE, a wrong hub key: a protocol failure, before ZAP), or a connection
    that closed before its handshake ended (libzmq gives the errno: a trainer that ended, a node
    frozen or killed, a port scan)."""
    out: list[str] = []
    while True:
        try:
            event = parse_monitor_message(monitor.recv_multipart(flags=zmq.NOBLOCK))
        except zmq.Again:
            return out
        if event["event"] & zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            out.append(HANDSHAKE_REFUSED)
        elif event["event"] & zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            code = errno.errorcode.get(event["value"], str(event["value"]))
            out.append(f"handshake cut off ({code}: the peer closed before it ended)")