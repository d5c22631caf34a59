"""A node's credentials on the control channel (ZeroMQ CURVE): its own keypair, made for this run
and this node alone, and the hub's public key. Every socket a node's processes open to the hub
(node.channel: rows and messages up, its Listeners down) is a CURVE client with them: the hub
knows the node by its key (never by a name in a message), and the node hears only a publisher
that holds the hub's secret key; both directions are encrypted.

How they reach a node (never the scenario, a command line, a service's environment or the run
directory): netns, in the forked process's arguments (runtimes.netns.runtime); docker, a file put into
its container alone before it starts; swarm, the node's own Docker secret; both at KEY_FILE,
read by the container's supervisor (node.supervisor) and inherited by what it forks. A command
workload's program gets its node's in its own environment (ENV), for `edgebed.report`. A
supervisor's own keys (its acks, its role's state, its counters) are apart: at
SUPERVISOR_KEY_FILE, read by node.supervisor_sender alone; a fleet's devices' in their host's
keys file (node.fleet.plan), never handed to a device's processes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional

import zmq

KEY_FILE = "/run/edgebed/channel.key"
# The node's supervisor's own key (docker and swarm): readable only with CAP_DAC_OVERRIDE, which
# nothing the node runs has (node.supervisor_sender reads it; runtimes.docker.nodes, runtimes.swarm.runtime)
SUPERVISOR_KEY_FILE = "/run/edgebed/supervisor.key"
ENV = "EDGEBED_CHANNEL_KEY"
Z85_KEY = 40  # characters of a CURVE key in Z85


@dataclass(frozen=True)
class ChannelKeys:
    node: str
    public: bytes  # the node's, Z85
    secret: bytes = b""  # the node's, Z85 (a hub's copy of another node's keys has none)
    server: bytes = b""  # the hub's public key, Z85

    def __repr__(self) -> str:  # a secret never lands in a log or a traceback
        return f"ChannelKeys(node={self.node!r}, public={self.public.decode()})"

    def to_text(self) -> str:
        return json.dumps({"node": self.node, "public": self.public.decode(), "secret": self.secret.decode(),
                           "server": self.server.decode()})

    @classmethod
    def from_text(cls, text: str) -> "ChannelKeys":
        data = json.loads(text)
        keys = cls(str(data["node"]), *(data[k].encode("ascii") for k in ("public", "secret", "server")))
        if not all(len(k) == Z85_KEY for k in (keys.public, keys.secret, keys.server)):
            raise ValueError("a channel key is not 40 characters of Z85")
        return keys

    def secure(self, sock: zmq.Socket) -> None:
        """Make `sock` a CURVE client of the hub with these keys (before it connects)."""
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server


_held: dict[str, ChannelKeys] = {}  # this process's keys (one process speaks for one node)


def use(keys: Optional[ChannelKeys]) -> None:
    """The keys this process's channel sockets are made with from now on (None: none)."""
    _held.pop("keys", None)
    if keys is not None:
        _held["keys"] = keys


def held() -> Optional[ChannelKeys]:
    return _held.get("keys")


def secure(sock: zmq.Socket) -> None:
    """A channel socket with this process's keys; left plain where it holds none (a role run
    outside a run, in tests: the hub refuses it)."""
    keys = held()
    if keys is not None:
        keys.secure(sock)


def load(path: Optional[str] = None) -> Optional[ChannelKeys]:
    """The keys the runtime put at `path` (KEY_FILE: docker, swarm), or None where there is no such file."""
    try:
        with open(path or KEY_FILE) as f:
            return ChannelKeys.from_text(f.read())
    except FileNotFoundError:
        return None


def from_environment() -> Optional[ChannelKeys]:
    """A command workload's program: its node's keys, as its role handed them (ENV)."""
    text = os.environ.get(ENV, "")
    return ChannelKeys.from_text(text) if text else None
