"""A fleet host's trainer forkserver (runtime swarm's fleets): the process that forks
every device's trainer, stress and measuring job, warm with torch and the run's dataset, so
each starts from shared pages in a fraction of a second.

The host's one process that speaks for its devices (node.fleet.host's HostAgent) asks for a
process with one message on a SOCK_SEQPACKET pair: a small JSON header (what to run, for which
device) and three file descriptors: the device's network namespace, a memfd of the arguments
and a memfd of that device's channel keys. The forkserver forks first and reads nothing: the
child enters the namespace, reads its arguments and its own keys, and becomes the role (which
joins the device's cgroup and drops every capability before it runs anything of the user's:
node.supervisor). So the forkserver never holds a key, and no trainer finds another device's in the
memory it was forked with. Answers on the same socket: {"pid": P} for each request, in order,
and {"exited": P, "code": C} when a child ends (C as multiprocessing gives it: -9 for SIGKILL).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import socket
import sys
import time
import traceback
from typing import Callable, Optional

from testbed.errors import RunFailed

CLONE_NEWNET = 0x40000000
HEADER_MAX = 4096
KINDS = ("role", "stress", "job")
STOP_GRACE = 2.0  # s the children have after the forkserver's end before they are killed (the host's
# process gave them 5 s from the run's stop already)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _child(header: dict, fds: list[int], stop, hidden: tuple[str, ...] = ()) -> int:
    """A forked child: into the device's namespace, its arguments and keys, its cgroup, a mount
    namespace without the mounts at `hidden`, then its target."""
    from testbed.kernel.identity import container_identity
    from testbed.kernel.mounts import hide_mounts
    from testbed.node import channel_keys, supervisor_sender
    from testbed.node.channel_keys import ChannelKeys
    from testbed.node.supervisor import job_main, join_cgroups, role_main, stress_main

    netns, args_fd, key_fd = fds
    if ctypes.CDLL(None, use_errno=True).setns(netns, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns into the device's namespace")
    os.close(netns)
    keys = ChannelKeys.from_text(_read_all(key_fd).decode())
    if keys.node != header["device"]:
        raise ValueError(f"{header['device']} was handed {keys.node}'s keys")
    channel_keys.use(keys)
    args = json.loads(_read_all(args_fd))
    if args.get("cpuset"):
        from testbed.scenario.units import parse_cpuset

        os.sched_setaffinity(0, parse_cpuset(args["cpuset"]))
    cgroups, identity = tuple(header["cgroups"]), container_identity(1 + int(header["index"]))
    supervisor_sender.forget()
    join_cgroups(cgroups)  # through the host's cgroup hierarchy, which the device's processes then do not see
    hide_mounts(hidden)
    cgroups = ()
    if header["kind"] == "role":
        role_main(args["cfg"], stop, cgroups, identity)
    elif header["kind"] == "stress":
        stress_main(float(args["load"]), stop, cgroups, identity)
    else:
        job_main(args["target"], args["kwargs"], cgroups, identity)
    return 0


class Forkserver:
    """The forkserver's side: forks on request, reports each child's end, and at the host's end
    (its socket closed, or SIGTERM) stops its children. Each child joins its device's cgroups,
    then leaves the mounts at `hidden` (the host's cgroup hierarchy) out of its mount namespace."""

    def __init__(self, sock: socket.socket, stop, warm: Callable[[], None], hidden: tuple[str, ...] = ()):
        self.sock, self.stop, self.warm, self.hidden = sock, stop, warm, hidden
        self.children: set[int] = set()
        self.ending = False

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "ending", True))
        self.warm()
        gc.freeze()  # what is loaded stays shared: a collection in a trainer would write to every object's header
        self.sock.settimeout(0.2)
        while not self.ending:
            self._reap()
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, HEADER_MAX, 3)
            except socket.timeout:
                continue
            except OSError:
                break
            if not data:
                break  # the host's process ended
            self._answer({"pid": self._fork(data, fds)})
        self._stop_children()
        return 0

    def _fork(self, data: bytes, fds: list[int]) -> int:
        """A child for the request `data` with `fds` (-1: a request that was not one)."""
        try:
            header = json.loads(data)
            if header.get("kind") not in KINDS or len(fds) != 3:
                raise ValueError("not a request")
        except ValueError:
            for fd in fds:
                os.close(fd)
            return -1
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                self.sock.close()
                code = _child(header, fds, self.stop, self.hidden)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        for fd in fds:
            os.close(fd)
        self.children.add(pid)
        return pid

    def _answer(self, message: dict) -> None:
        try:
            self.sock.send(json.dumps(message).encode())
        except OSError:
            self.ending = True

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self._answer({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def _stop_children(self) -> None:
        self.stop.set()
        deadline = time.monotonic() + STOP_GRACE
        while self.children and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.1)
        for pid in self.children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in list(self.children):  # reaped: no zombie is left to the container's first process
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.children.clear()


class RemoteProcess:
    """A child of the forkserver, as the host's process sees it (multiprocessing.Process's
    pid, is_alive, exitcode and join): its end comes as a message (Forks.pump)."""

    def __init__(self, forks: "Forks", pid: int):
        self.forks, self.pid = forks, pid

    @property
    def exitcode(self) -> Optional[int]:
        return self.forks.exits.get(self.pid)

    def is_alive(self) -> bool:
        return self.pid not in self.forks.exits

    def join(self, timeout: Optional[float] = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else 3600)
        while self.is_alive() and time.monotonic() < deadline:
            self.forks.pump(wait=0.05)


class Forks:
    """The host's side of the forkserver's socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.exits: dict[int, int] = {}  # pid -> exit code, for every child that ended

    def fileno(self) -> int:
        return self.sock.fileno()

    def fork(self, kind: str, device: str, netns_path: str, args: dict, keys_text: str, cgroups: tuple,
             index: int = 0) -> RemoteProcess:
        """A `kind` process for `device` (the host's `index`th: its uid) with `args`, in its
        namespace with its keys."""
        header = json.dumps({"kind": kind, "device": device, "cgroups": list(cgroups), "index": index}).encode()
        netns = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        args_fd, key_fd = _memfd("args", json.dumps(args).encode()), _memfd("keys", keys_text.encode())
        try:
            socket.send_fds(self.sock, [header], [netns, args_fd, key_fd])
        finally:
            for fd in (netns, args_fd, key_fd):
                os.close(fd)
        while True:
            answer = self._read(timeout=30.0)
            if answer is None:
                raise RunFailed("the forkserver did not answer in 30 s")
            if "pid" in answer:
                if answer["pid"] < 0:
                    raise RunFailed("the forkserver refused the request")
                return RemoteProcess(self, int(answer["pid"]))

    def pump(self, wait: float = 0.0) -> None:
        """Take the ends reported so far (after up to `wait` s for the first)."""
        timeout = wait
        while (answer := self._read(timeout)) is not None:
            timeout = 0.0
            if "pid" in answer:
                raise RunFailed(f"the forkserver answered a request that was not asked: {answer}")

    def _read(self, timeout: float) -> Optional[dict]:
        """One answer (an end is taken in passing and None returned after `timeout` s with none)."""
        self.sock.settimeout(max(timeout, 0.0))  # 0: do not wait
        try:
            data = self.sock.recv(HEADER_MAX)
        except (BlockingIOError, socket.timeout):
            return None
        if not data:
            raise RunFailed("the forkserver ended")
        answer = json.loads(data)
        if "exited" in answer:
            self.exits[int(answer["exited"])] = int(answer["code"])
        return answer


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    return fd
