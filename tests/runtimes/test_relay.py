"""The relay to an external broker: one port at the run's gateway address, inside the run's own
namespace, onward from this host's namespace. The host gets no address on the run's network."""
import socket
import subprocess
import sys
import threading

import pytest

from testbed.runtimes.relay import PortRelay

from helpers import needs_root

pytestmark = [needs_root, pytest.mark.root]

GATEWAY, PORT = "10.66.0.1", 19999
CLIENT = ("import socket, sys\n"
          "try:\n"
          "    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
          "    s.sendall(b'ping'); print(s.recv(16).decode() or 'closed')\n"
          "except OSError as e:\n"
          "    print(type(e).__name__)\n")


def _listen(reply: bytes):
    """A service on this host (all addresses): answers `reply` + what it got."""
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.sendall(reply + conn.recv(16))

    threading.Thread(target=serve, daemon=True).start()
    return srv


def _from(netns: str, port: int) -> str:
    r = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", CLIENT, GATEWAY, str(port)],
                       capture_output=True, text=True, timeout=30)
    return r.stdout.strip()


def _host_addresses() -> str:
    return subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout


def test_two_runs_on_one_subnet_each_relay_one_port_of_their_gateway():
    broker, other = _listen(b"broker:"), _listen(b"other:")
    names = ["ebtest-relay-a", "ebtest-relay-b"]
    relays = []
    try:
        for ns in names:  # two runs' switches, both with the same gateway address
            subprocess.run(["ip", "netns", "add", ns], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{GATEWAY}/24", "dev", "lo"], check=True)
            relays.append(PortRelay(ns, GATEWAY, PORT, ("127.0.0.1", broker.getsockname()[1])))
        for ns in names:
            assert _from(ns, PORT) == "broker:ping"
            # the host's other service listens on all its addresses, yet is not at the gateway
            assert _from(ns, other.getsockname()[1]) == "ConnectionRefusedError"
        assert [r.connections for r in relays] == [1, 1]
        assert f"inet {GATEWAY}/" not in _host_addresses()
        relays.pop(0).close()
        assert _from(names[0], PORT) == "ConnectionRefusedError"  # closed with the run
        assert _from(names[1], PORT) == "broker:ping"  # the other run's relay is its own
    finally:
        for r in relays:
            r.close()
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        broker.close()
        other.close()


def test_a_relay_whose_broker_is_down_closes_the_nodes_connection():
    name = "ebtest-relay-c"
    unused = socket.socket()
    unused.bind(("127.0.0.1", 0))  # a port nothing listens on
    relay = None
    try:
        subprocess.run(["ip", "netns", "add", name], check=True)
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", f"{GATEWAY}/24", "dev", "lo"], check=True)
        relay = PortRelay(name, GATEWAY, PORT, ("127.0.0.1", unused.getsockname()[1]))
        assert _from(name, PORT) in ("closed", "ConnectionResetError")
    finally:
        if relay is not None:
            relay.close()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        unused.close()
