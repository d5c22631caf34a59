"""One TCP port relayed from the run's network to a service on this host (an external broker).

The nodes reach the run's gateway address on one port, and nothing else of the host: the relay
listens there inside the run's own network (the netns runtime's switch namespace; on Docker,
the run's bridge) and opens each connection onward from this host's own namespace. Two runs
on the same subnet each have their gateway in their own namespace, so they do not collide.
"""

from __future__ import annotations

import socket
import threading
from typing import Optional

from testbed.kernel.netlink import listening_socket

CHUNK = 1 << 16


class PortRelay:
    """gateway:port inside `netns` -> upstream (host, port) from this host's namespace."""

    def __init__(self, netns: Optional[str], address: str, port: int, upstream: tuple[str, int]):
        self.upstream = upstream
        self.connections = 0  # accepted so far
        self._listener = listening_socket(netns, address, port)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="edgebed-relay", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()  # the node sees a refused connection, as it would without a relay
                continue
            if not self._track(client, server):
                return
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True, name="edgebed-relay-pump").start()

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                for s in socks:
                    s.close()
                return False
            self._open.update(socks)
            return True

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # either side gone: both go (a half-open Kafka connection is useless)
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._open = list(self._open), set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._thread.join(timeout=5)
