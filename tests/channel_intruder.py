"""A neighbour on the hosts' network trying a run's control channel (tests/lab/test_swarm.py runs it in
a lab host's own namespace, which is no node of the run):
`python channel_intruder.py UP DOWN SECONDS SERVER_KEY [STOLEN_KEYS]`.

For SECONDS it subscribes to the hub's PUB, and pushes forged rows, states, acks, requests for
timeline actions (one with Infinity), a 5,000-deep JSON and a 100 MiB message to its PULL (in
parts, the first declaring its length; then in one frame, which the hub's socket cuts unread):
plain; with a CURVE key of its own (it knows the hub's public SERVER_KEY: it is public); and,
given STOLEN_KEYS (a node's whole keys, as its file holds them), as that node but naming another.
Prints what its subscribers received, as JSON."""

import json
import sys
import time

import zmq

from testbed.node import channel

FORGED_LOSS = 123.456  # a loss no run records: a forged row found in steps.csv shows by it
HUNDRED_MIB = b"x" * (100 << 20)


def forged(victim: str, big: bool) -> list[list[bytes]]:
    row = f"1.0,{victim},1,{FORGED_LOSS},32,0.1,0,0,0,0,0,\n".encode()  # steps.csv's columns
    return [[b"steps.csv", row],
            [b"!state", json.dumps({"node": victim, "gen": 1, "running": False, "exitcode": 0}).encode()],
            [b"!ack", json.dumps({"node": victim, "seq": 1, "detail": "forged"}).encode()],
            [b"!request", b'{"id": "x", "node": "' + victim.encode() + b'", "action": "kill", "at": Infinity}'],
            [b"!request", b"[" * 5_000 + b"]" * 5_000],
            [b"!request", json.dumps({"id": "forged", "node": victim, "action": "kill", "fields": {}}).encode()],
            [b"!request", json.dumps({"id": "forged2", "node": "ps", "action": "link",
                                      "fields": {"direction": "up", "rate": "1kbit"}}).encode()],
            [b"!report", b'{"name": "ps.json", "data": {"forged": true}}']] + (
        [channel.framed(b"!request", HUNDRED_MIB)[0], [b"!request", HUNDRED_MIB]] if big else [])


def _socket(ctx, kind, url, public=None, secret=None, server=None):
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 20)
    if server is not None:
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(url)
    return sock


def main(up: str, down: str, seconds: float, server: bytes, stolen: dict | None) -> dict:
    ctx = zmq.Context()
    own = zmq.curve_keypair()
    subs = {"plain": _socket(ctx, zmq.SUB, down), "own key": _socket(ctx, zmq.SUB, down, *own, server)}
    pushes = [(_socket(ctx, zmq.PUSH, up), "w1"), (_socket(ctx, zmq.PUSH, up, *own, server), "w1")]
    if stolen:  # a node's key, naming another node (w1) in what it sends
        pushes.append((_socket(ctx, zmq.PUSH, up, stolen["public"].encode(), stolen["secret"].encode(), server),
                       "w1"))
    received = {name: 0 for name in subs}
    deadline, first = time.monotonic() + seconds, True
    while time.monotonic() < deadline:
        for push, victim in pushes:
            for frames in forged(victim, big=first):  # (the 100 MiB once from each)
                try:
                    push.send_multipart(frames, flags=zmq.NOBLOCK)
                except zmq.Again:  # a plain socket never connects: its queue fills
                    pass
        for name, sub in subs.items():
            while sub.poll(100):
                sub.recv_multipart()
                received[name] += 1
        first = False
        time.sleep(1.0)
    for sock in [*subs.values(), *(p for p, _ in pushes)]:
        sock.close(linger=0)
    ctx.term()
    return received


if __name__ == "__main__":
    stolen_keys = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    print(json.dumps(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4].encode(), stolen_keys)))
