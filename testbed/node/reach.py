"""What a node's code can reach, tried from inside a node as its code would try it (a measuring
job: `runtime.start(node, "testbed.node.reach:probe", {...})`): the answer for each attempt is
"ok" or the error the kernel gave. SECURITY.md's promises for each runtime are these answers
(tests/node/test_sealed_node.py asks them on netns, docker and the lab's swarm).

Nothing here changes what it reaches: a file is opened for writing and closed unwritten, a
signal is 0 (a permission check), a link planted or a file made where it is allowed is removed
at once.
"""

from __future__ import annotations

import json
import os
import socket
from functools import partial
from typing import Callable, Sequence

from testbed.node import mailbox

# host-wide knobs no node may turn (opened for writing, never written)
KNOBS = ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/devices/system/cpu/cpu1/online", "/sys/power/state")


def _attempt(fn: Callable[[], object]) -> str:
    try:
        fn()
        return "ok"
    except OSError as e:
        return os.strerror(e.errno) if e.errno is not None else type(e).__name__


def _open_for_writing(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CLOEXEC))


def _read(path: str) -> None:
    with open(path, "rb") as f:
        f.read(1)


def _plant(path: str) -> None:
    os.symlink("/proc/self/ns/net", path)
    os.unlink(path)


def _create(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    os.unlink(path)


def _connect(address: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(address)


def attempts(read: Sequence[str], write: Sequence[str], signal: Sequence[int], plant: Sequence[str],
             connect: Sequence[str], create: Sequence[str] = ()) -> dict:
    """Each target tried: files read, files opened for writing (the knobs too), processes
    signalled (0) and their environ read, links planted, unix sockets connected to, files made
    (and removed)."""
    return {"ids": [list(os.getresuid()), list(os.getresgid()), os.getgroups()],
            "read": {p: _attempt(partial(_read, p)) for p in read},
            "write": {p: _attempt(partial(_open_for_writing, p)) for p in [*write, *KNOBS] if os.path.exists(p)},
            "signal": {str(p): _attempt(partial(os.kill, p, 0)) for p in signal},
            "environ": {str(p): _attempt(partial(_read, f"/proc/{p}/environ")) for p in signal},
            "listed": [p for p in signal if os.path.exists(f"/proc/{p}")],
            "plant": {p: _attempt(partial(_plant, p)) for p in plant},
            "connect": {p: _attempt(partial(_connect, p)) for p in connect},
            "create": {p: _attempt(partial(_create, p)) for p in create},
            "modules": _attempt(partial(_open_for_writing, __file__))}

def probe(slot: str, read: Sequence[str] = (), write: Sequence[str] = (), signal: Sequence[int] = (),
          plant: Sequence[str] = (), connect: Sequence[str] = (), create: Sequence[str] = ()) -> None:
    """The attempts' answers, put into the runner's mailbox slot."""
    mailbox.write_text(slot, json.dumps(attempts(read, write, signal, plant, connect, create)))
