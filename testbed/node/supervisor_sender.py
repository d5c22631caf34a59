"""The one holder of a container supervisor's own channel key (node.channel_keys.SUPERVISOR_KEY_FILE).

A node's supervisor (node.supervisor) forks its role, stress and jobs: they have its memory, and so
every key it ever read. What they run holds the node's key by design, and may send rows and
requests as that node; the supervisor's word on the node (acks with the counters it read, the
role's state, the link's and cgroup's counters behind traffic.csv and resources.csv) must come
with a key they never hold (runtimes.control.hub_rules.SUPERVISOR_KINDS). So the supervisor never reads
that key: at its start, before it has a thread or a child, it forks this sender, which reads the
key (a file only CAP_DAC_OVERRIDE reads, which the forked processes drop), removes it where it
can, and sends up, with that key, what the supervisor hands it over a socket pair. Each forked
process closes its copy of the supervisor's end first (`forget`); the sender keeps its
capabilities, so a process without them can neither trace it nor read its memory.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Optional

from testbed.errors import HostCannot
from testbed.node import channel, channel_keys

MAX_MESSAGE = 4 << 20  # bytes: the longest a supervisor hands over (an ack: runtimes.control.hub_rules.KIND_LIMITS)
KINDS = ("ack", "state", "stats")  # what it sends (the hub takes only these with a supervisor's key, and puts)
START_TIMEOUT = 10.0  # s for the sender to say it holds its key
LENGTH = 4  # bytes of a message's length on the socket pair

_held: list[socket.socket] = []  # this process's supervisor's end, while it has one


class SupervisorKeyError(HostCannot):
    pass


class SupervisorSender:
    """The supervisor's side: `send(kind, data)` goes up with the supervisor's own key."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid = sock, pid
        self._lock = threading.Lock()

    @classmethod
    def start(cls, up: str, node: str, path: Optional[str] = None) -> "SupervisorSender":
        """Fork the sender (the caller has one thread), which reads node `node`'s supervisor key at
        `path`; SupervisorKeyError when it cannot."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                mine.close()
                code = _serve(theirs, up, node, path or channel_keys.SUPERVISOR_KEY_FILE)
            finally:
                os._exit(code)
        theirs.close()
        mine.settimeout(START_TIMEOUT)
        try:
            word = mine.recv(256).decode("ascii", "replace").strip()
        except OSError as e:
            word = f"no answer ({type(e).__name__})"
        if word != "ok":
            mine.close()
            os.waitpid(pid, 0)
            raise SupervisorKeyError(word or "the sender ended")
        mine.settimeout(None)
        _held.append(mine)
        return cls(mine, pid)

    def send(self, kind: str, data: dict) -> None:
        payload = kind.encode() + b"\0" + channel.json_payload(data)
        with self._lock:
            self.sock.sendall(len(payload).to_bytes(LENGTH, "big") + payload)

    def close(self, timeout: float = 10.0) -> None:
        """The end of what it will send: the sender lets its last messages leave, then exits."""
        forget()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            time.sleep(0.05)


def forget() -> None:
    """Close this process's copy of the supervisor's end (a forked role, stress or job: first)."""
    while _held:
        _held.pop().close()


def _serve(sock: socket.socket, up: str, node: str, path: str) -> int:
    """The sender: its key, then every message handed to it, until the supervisor's end closes."""
    try:
        keys = channel_keys.load(path)
    except (OSError, ValueError) as e:
        keys, why = None, f"{type(e).__name__}: {e.strerror if isinstance(e, OSError) else 'not a key'}"
    else:
        why = f"no file {path}" if keys is None else f"the key of {keys.node}, not {node}" if keys.node != node else ""
    if why:
        sock.sendall(why[:200].encode("ascii", "replace"))
        return 2
    try:
        os.unlink(path)  # a file copied into the container (docker); a secret's mount stays, read-only
    except OSError:
        pass
    channel_keys.use(keys)
    sock.sendall(b"ok")
    reader = sock.makefile("rb")
    while (message := _next(reader)) is not None:
        kind, _, payload = message.partition(b"\0")
        if kind.decode("ascii", "replace") in KINDS:
            channel.send(up, kind.decode(), payload)
    channel.flush()  # the supervisor's last state leaves before the sender does
    return 0


def _next(reader) -> Optional[bytes]:
    """The next message on the socket pair, None at its end (or at a length past MAX_MESSAGE)."""
    head = reader.read(LENGTH)
    if len(head) < LENGTH or (length := int.from_bytes(head, "big")) > MAX_MESSAGE:
        return None
    body = reader.read(length)
    return body if len(body) == length else None
