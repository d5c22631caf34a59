"""The control channel bounded in bytes: what a node that sends too much, or a subscriber that never
reads, costs the hub, and what a flood of replicas costs the coordinator. The hub and the board
run in processes of their own (tests/hub_process.py), so that their memory is theirs alone."""
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from testbed.node import channel, channel_keys, untrusted
from testbed.node.channel_keys import ChannelKeys
from testbed.node.roles.common import RoleConfig
from testbed.node.roles.replicas import REPLICA_QUEUE, ReplicaBoard, replica_limit, send_replica
from testbed.records import metrics
from testbed.runtimes.control import hub_rules
from testbed.runtimes.control.hub import PUB_QUEUE, ControlHub, Shares

from helpers import REPO, until

HELPER = REPO / "tests" / "hub_process.py"
STUCK_SUBSCRIBER_MIB = PUB_QUEUE * channel.CHUNK / (1 << 20)  # the hub's bound: 16 MiB
SLACK_MIB = 8  # what else the hub's process may take meanwhile (its allocator's, the parts in flight)


class Helper:
    """tests/hub_process.py in a process of its own: ask it a line, read its JSON answer."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(HELPER), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=REPO)
        self.first = json.loads(self.proc.stdout.readline())

    def ask(self, line: str):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def hub(tmp_path):
    h = Helper("hub", str(tmp_path))
    h.up, h.down = h.first["up"], h.first["down"]
    h.keys = {name: ChannelKeys.from_text(text) for name, text in h.first["keys"].items()}
    yield h
    channel.flush()
    channel_keys.use(None)
    h.close()


def loopback_hub(tmp_path) -> ControlHub:
    """A hub in this process, on 127.0.0.1; its (up, down) URLs in `.urls`."""
    metrics.init_tables(tmp_path)
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    hub = ControlHub(None, "127.0.0.1", ports[0], ports[1], tmp_path)
    hub.urls = tuple(f"tcp://127.0.0.1:{port}" for port in ports)
    return hub


def _stuck_subscriber(ctx: zmq.Context, hub, node: str = "ps") -> zmq.Socket:
    """A SUB with `node`'s key to everything it may hear (the PS's: the replicas too) that takes
    one message and never reads again (a coordinator frozen, or one that stopped reading)."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.RCVBUF, 4096)
    sub.setsockopt(zmq.LINGER, 0)
    hub.keys[node].secure(sub)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(hub.down)
    assert sub.poll(10_000)  # subscribed: a beat has come (it stays unread)
    return sub


def _speak_as(keys: ChannelKeys) -> None:
    """This process's channel socket speaks with `keys` from now on."""
    channel.flush()
    channel_keys.use(keys)


def _flood(hub, coordinator: channel.Listener, replicas: int, size: int) -> int:
    """`replicas` replicas of `size` bytes from w0; how many the coordinator heard whole (it waits
    for a last one, sent after them: the hub forwards in order)."""
    last = os.urandom(8)
    _speak_as(hub.keys["w0"])
    for _ in range(replicas):
        channel.send(hub.up, "replica", b"r" * size)
    channel.send(hub.up, "replica", last)
    heard, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        for t, payload in coordinator.poll(100):
            if payload == last:
                return heard
            heard += t == channel.topic("replica", "w0")
    raise AssertionError("the last replica never came")


def test_a_subscriber_that_never_reads_costs_the_hub_a_bounded_number_of_mib(hub):
    """80 replicas of 4 MiB published while a coordinator's subscriber to everything reads nothing:
    the hub holds at most its bound for it (it held every one of them: 320 MiB), and another
    reader of them still gets them. (A first flood with no such subscriber brings the hub's
    allocator to what such a flood takes anyway.)"""
    ctx = zmq.Context()
    coordinator = channel.Listener(hub.down, [b"replica:", channel.topic("beat")], keys=hub.keys["ps"])
    try:
        assert coordinator.poll(10_000)  # subscribed: a beat has come
        _flood(hub, coordinator, 80, 4 << 20)
        stuck = _stuck_subscriber(ctx, hub)
        before = hub.ask("memory")["rss"]
        assert _flood(hub, coordinator, 80, 4 << 20) > 0  # a reader's replicas still come
        grown = hub.ask("memory")["rss"] - before
        assert grown <= STUCK_SUBSCRIBER_MIB + SLACK_MIB, f"the hub grew {grown:.0f} MiB"
        stuck.close(linger=0)
    finally:
        coordinator.close()
        ctx.term()


def _cut_off(monitor: zmq.Socket) -> bool:
    """Whether the hub has closed the connection `monitor` watches."""
    while monitor.poll(0):
        if recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED:
            return True
    return False


def test_a_frame_over_the_hubs_bound_is_refused_before_the_hub_allocates_it(hub):
    """A state of 64 MiB (a kind of 16 KiB at most) in one frame: the hub closes the connection at
    the frame's header, unread (it took the 64 MiB in, then dropped them as "state too large")."""
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    hub.keys["w0"].secure(push)
    monitor = push.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    push.connect(hub.up)
    try:
        before = hub.ask("memory")["peak"]
        push.send_multipart([b"!state", b"s" * (64 << 20)])
        assert until(lambda: _cut_off(monitor) or hub.ask("drops"))
        marker = ctx.socket(zmq.PUSH)  # a message after it, on a connection of its own
        hub.keys["w0"].secure(marker)
        marker.connect(hub.up)
        marker.send_multipart([b"!nonsense", b"{}"])
        assert until(lambda: "unknown kind" in hub.ask("drops"))
        marker.close(linger=0)
        assert hub.ask("drops") == {"unknown kind": 1}
        grown = hub.ask("memory")["peak"] - before
        assert grown <= SLACK_MIB, f"the hub's peak grew {grown:.0f} MiB"
    finally:
        push.disable_monitor()
        monitor.close(linger=0)
        push.close(linger=0)
        ctx.term()


def test_a_coordinator_that_reads_slowly_loses_no_replica(hub):
    """The hub waits for room in a slow reader's queue (the workers then wait for the hub) rather
    than drop parts of replicas: 40 of 1 MiB to a coordinator whose ZeroMQ holds 16 parts."""
    coordinator = channel.Listener(hub.down, [b"replica:", channel.topic("beat")], keys=hub.keys["ps"], queue=16)
    heard: list[bytes] = []
    try:
        assert coordinator.poll(10_000)  # subscribed: a beat has come
        _speak_as(hub.keys["w0"])
        replicas = [os.urandom(1 << 20) for _ in range(40)]
        for replica in replicas:
            channel.send(hub.up, "replica", replica)
        deadline = time.monotonic() + 60
        while len(heard) < len(replicas) and time.monotonic() < deadline:
            heard += [p for t, p in coordinator.poll(100, most=8) if t == channel.topic("replica", "w0")]
            time.sleep(0.005)  # a reader slower than the hub
        assert [replicas.index(p) if p in replicas else -1 for p in heard] == list(range(len(replicas)))
        assert coordinator.dropped == {}
        assert hub.ask("drops") == {}
    finally:
        coordinator.close()


def test_a_coordinator_that_stopped_reading_holds_the_beats_back_once_at_most(hub):
    """20 replicas of 1 MiB (320 parts) while the coordinator reads nothing: the hub waits
    FORWARD_WAIT for room once (its lossy send then sets the full queue aside, and later parts do
    not wait for it), so a worker keeps hearing beats (a wait for every part would hold the hub,
    and every beat, 0.5 s a part)."""
    ctx = zmq.Context()
    stuck = _stuck_subscriber(ctx, hub)
    worker = channel.Listener(hub.down, [channel.topic("beat")], keys=hub.keys["w1"])
    try:
        assert worker.poll(10_000)  # subscribed: a beat has come
        _speak_as(hub.keys["w0"])
        for _ in range(20):
            channel.send(hub.up, "replica", b"r" * (1 << 20))
        beats, deadline = [time.monotonic()], time.monotonic() + 8
        while time.monotonic() < deadline:
            if worker.poll(100):
                beats.append(time.monotonic())
        gaps = [b - a for a, b in zip(beats, beats[1:] + [deadline])]
        assert max(gaps) < 2.5, f"no beat for {max(gaps):.1f} s"
        assert hub.ask("drops").get("replica part lost by a subscriber behind", 0) > 0
    finally:
        worker.close()
        stuck.close(linger=0)
        ctx.term()


def test_replicas_go_to_the_coordinator_alone(hub):
    """A worker that subscribes to everything, or to the replicas, hears beats and no replica: no
    other node's queue can hold the hub's forwarding back (nor read another's replica). (Its
    subscription to everything is one to every other kind of topic.)"""
    ctx = zmq.Context()
    nosy = ctx.socket(zmq.SUB)
    hub.keys["w1"].secure(nosy)
    for prefix in (b"", b"replica:", channel.topic("beat")):
        nosy.setsockopt(zmq.SUBSCRIBE, prefix)
    nosy.connect(hub.down)
    coordinator = channel.Listener(hub.down, [b"replica:", channel.topic("beat")], keys=hub.keys["ps"])
    try:
        assert nosy.poll(10_000) and coordinator.poll(10_000)  # both subscribed: beats came
        assert _flood(hub, coordinator, 3, 100_000) == 3
        heard = {nosy.recv_multipart()[0] for _ in range(20) if nosy.poll(100)}
        assert heard == {channel.topic("beat")}
        assert hub.ask("drops") == {"subscription to replicas, not the coordinator's": 2}
    finally:
        coordinator.close()
        nosy.close(linger=0)
        ctx.term()


# -- subscriptions -------------------------------------------------------------------------------
def _subscriber(ctx: zmq.Context, hub, keys: ChannelKeys, prefixes, kind: int = zmq.SUB) -> zmq.Socket:
    """A socket of `kind` with `keys` that has subscribed to `prefixes` (sent when it connects, in
    their bytes' order), connected to the hub."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # every subscription goes (ZeroMQ drops those past its queue)
    keys.secure(sock)
    for prefix in prefixes if kind == zmq.SUB else ():
        sock.setsockopt(zmq.SUBSCRIBE, prefix)
    sock.connect(hub.urls[1])
    return sock


def _topics_heard(sock: zmq.Socket, seconds: float) -> set[bytes]:
    heard, deadline = set(), time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sock.poll(50):
            heard.add(sock.recv_multipart()[0])
    return heard


def test_a_nodes_subscriptions_are_bounded_in_number_and_length(tmp_path):
    """A node that subscribes to 10,000 distinct prefixes gets MAX_SUBSCRIPTIONS of them over all
    its connections, the rest refused and counted (a delay published on one of them does not
    reach it), as are one longer than any topic and one to no topic; a subscription of 100 KiB
    closes its connection unread. What the node subscribes to as a node does still comes."""
    hub = loopback_hub(tmp_path)
    keys = hub.keys.admit("w1", "worker")
    ctx = zmq.Context()
    own = channel.Listener(hub.urls[1], [channel.topic("beat"), channel.topic("delay", "w1")], keys=keys)
    greedy = huge = None
    try:
        assert own.poll(10_000) and until(lambda: len(hub.shares.held["w1"]) == 2)  # its own prefixes taken
        taken = hub_rules.MAX_SUBSCRIPTIONS - 2
        names = [f"n{i:05d}" for i in range(10_000)]
        longest = b"delay:" + b"n" * (hub_rules.MAX_TOPIC - len(b"delay:") + 1)
        greedy = _subscriber(ctx, hub, keys, [*(b"delay:" + n.encode() for n in names), longest, b"nonsense"])
        refused = {"subscription beyond a node's share": len(names) - taken,
                   "subscription longer than any topic": 1, "subscription to no topic": 1}
        assert until(lambda: hub.drops == refused), dict(hub.drops)
        assert hub.shares.held["w1"].keys() == {channel.topic("beat"), channel.topic("delay", "w1"),
                                                *(b"delay:" + n.encode() for n in names[:taken])}
        huge = _subscriber(ctx, hub, keys, [b"delay:" + b"n" * (100 << 10)])
        monitor = huge.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        assert until(lambda: _cut_off(monitor))
        huge.disable_monitor()
        monitor.close(linger=0)
        for node in (names[taken - 1], names[taken], "w1"):  # the last one taken, the first refused, its own
            hub.set_delay(node, {"delay_ms": 5})  # (and again with each beat)
        assert _topics_heard(greedy, 2.0) == {channel.topic("delay", names[taken - 1])}
        heard = {t for _ in range(20) for t, _ in own.poll(100)}
        assert heard == {channel.topic("beat"), channel.topic("delay", "w1")}
        assert hub.drops == refused  # the 100 KiB never read
    finally:
        own.close()
        for sock in (greedy, huge):
            if sock is not None:
                sock.close(linger=0)
        ctx.term()
        hub.close()


def test_a_closed_connection_gives_its_subscriptions_back_and_an_unsubscription_does_not(tmp_path):
    """A node's share is its connections' together: one that closes gives back what it held (ZeroMQ
    says so without the node's name); an unsubscription gives nothing back (sent from another
    connection than the one that holds the prefix, it would free a prefix still held); and a
    node that asked beyond its share gets no new prefix."""
    hub = loopback_hub(tmp_path)
    keys = hub.keys.admit("w0", "worker")
    ctx = zmq.Context()
    share = hub_rules.MAX_SUBSCRIPTIONS
    socks = []
    try:
        first = _subscriber(ctx, hub, keys, [b"delay:a%02d" % i for i in range(share)])
        assert until(lambda: len(hub.shares.held.get("w0", ())) == share)
        first.close(linger=0)
        assert until(lambda: hub.shares.held["w0"] == {})
        second = _subscriber(ctx, hub, keys, [b"delay:b%02d" % i for i in range(share)])
        socks.append(second)
        assert until(lambda: len(hub.shares.held["w0"]) == share) and hub.drops == {}
        other = _subscriber(ctx, hub, keys, [], kind=zmq.XSUB)
        socks.append(other)
        other.setsockopt(zmq.ONLY_FIRST_SUBSCRIBE, 1)  # a second frame goes as it is: here, an unsubscription
        other.send_multipart([b"not a subscription", b"\0delay:b00"])  # of a prefix this connection never held
        other.send(b"\1delay:c")  # read after it (one connection's come in order)
        assert until(lambda: hub.drops == {"subscription beyond a node's share": 1})
        hub.set_delay("b00", {"delay_ms": 5})
        hub.set_delay("c", {"delay_ms": 5})
        assert _topics_heard(second, 1.0) == {channel.topic("delay", "b00")}
        second.close(linger=0)
        assert until(lambda: hub.shares.held["w0"] == {})
        socks.append(_subscriber(ctx, hub, keys, [b"delay:d"]))
        assert until(lambda: hub.drops == {"subscription beyond a node's share": 2})
    finally:
        for sock in socks:
            sock.close(linger=0)
        ctx.term()
        hub.close()


def test_subscription_rules():
    """A subscription starts a topic the hub publishes, no longer than the longest; a node holds
    MAX_SUBSCRIPTIONS distinct ones, and after it asked beyond them no new one."""
    refused = hub_rules.subscription_refused
    longest = channel.topic("replica", "\U0001F600" * hub_rules.MAX_NAME)  # MAX_NAME characters of 4 bytes
    for prefix in (b"", b"b", b"beat:", channel.topic("beat"), b"replica:", channel.topic("replica", "w0"),
                   b"node:w", channel.topic("node", "w10"), channel.topic("put", "bench-1a2b/w1.json"),
                   b"del", longest, channel.topic("delay", "ü" * hub_rules.MAX_NAME)):
        assert refused(prefix) is None, prefix
    assert len(longest) == hub_rules.MAX_TOPIC
    assert refused(longest + b"x") == refused(b"put:" + b"k" * hub_rules.MAX_TOPIC) == \
        "subscription longer than any topic"
    for prefix in (b"x", b"beat:x", b"beat:\0\0", b"node:\0", b"node:w0\0x", b"node:w\0w\0", b"replicas",
                   b"put:" + b"k" * (4 * hub_rules.MAX_NAME + 1)):
        assert refused(prefix) == "subscription to no topic", prefix
    share = hub_rules.share_refused
    full = {b"beat:%d" % i: 1 for i in range(hub_rules.MAX_SUBSCRIPTIONS)}
    assert share(b"node:w0", {}, False) is None and share(b"node:w0", dict(list(full.items())[1:]), False) is None
    assert share(b"node:w0", full, False) == share(b"node:w0", {}, True) == "subscription beyond a node's share"
    assert share(b"beat:1", full, False) is None and share(b"beat:1", full, True) is None  # held: again


def test_shares_count_each_nodes_connections_and_give_back_what_a_closed_one_held():
    shares = Shares()
    assert shares.take("w0", b"beat:") is None and shares.take("w0", b"beat:") is None  # two connections
    assert shares.take("w1", b"beat:") is None and shares.take("w1", b"node:w1") is None
    shares.closed(b"beat:")  # whose is unknown: one fewer for each (never more than a node holds)
    assert shares.held == {"w0": {b"beat:": 1}, "w1": {b"node:w1": 1}}
    shares.closed(b"put:unheld")
    for i in range(hub_rules.MAX_SUBSCRIPTIONS - 1):
        assert shares.take("w0", b"put:%d" % i) is None
    assert shares.take("w0", b"put:x") == "subscription beyond a node's share"
    shares.closed(b"beat:")
    assert shares.take("w0", b"put:x") == "subscription beyond a node's share"  # asked beyond: no new one
    assert shares.take("w0", b"put:0") is None and shares.take("w1", b"put:x") is None
    assert len(shares.held["w0"]) == hub_rules.MAX_SUBSCRIPTIONS - 1 and shares.held["w0"][b"put:0"] == 2


# -- messages in parts -------------------------------------------------------------------------
def test_parts_are_put_together_in_order_and_nothing_else_is_kept():
    payload = os.urandom(3 * channel.CHUNK + 5)
    parts = channel.framed(b"t", payload)
    assert [len(m[2]) for m in parts] == [channel.CHUNK] * 3 + [5] and channel.framed(b"t", b"x") == [[b"t", b"x"]]
    heads = [channel.part_header(m[1], len(m[2])) for m in parts]
    whole = channel.Parts()
    assert [whole.add("k", h, bytes(m[2])) for h, m in zip(heads, parts)] == [None, None, None, payload]
    for order in ([0, 2], [1], [0, 1, 3]):  # a part missing: what was begun is dropped with the next
        whole = channel.Parts()
        with pytest.raises(untrusted.Refused, match="part out of place"):
            for i in order:
                whole.add("k", heads[i], bytes(parts[i][2]))
        assert whole._open == {}
    other = channel.framed(b"t", payload)  # another message of the same length: its parts are not these
    whole = channel.Parts()
    whole.add("k", heads[0], bytes(parts[0][2]))
    with pytest.raises(untrusted.Refused, match="part out of place"):
        whole.add("k", channel.part_header(other[1][1], channel.CHUNK), bytes(other[1][2]))
    short = channel.PART.pack(1, 0, channel.CHUNK)  # a message that fits one frame, in parts
    for header, body in ((parts[0][1], channel.CHUNK - 1), (parts[0][1][:-1], channel.CHUNK), (short, channel.CHUNK),
                         (channel.PART.pack(1, 9, 3 * channel.CHUNK), channel.CHUNK)):
        with pytest.raises(untrusted.Refused, match="malformed part"):
            channel.part_header(header, body)


def test_a_message_longer_than_its_kind_allows_is_dropped_at_its_first_part(tmp_path):
    hub = loopback_hub(tmp_path)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    hub.keys.admit("w0", "worker").secure(push)
    push.connect(hub.urls[0])
    try:
        state = channel.messages("state", b"s" * (1 << 20))  # 16 KiB at most
        ack = channel.messages("ack", b"a" * (3 * channel.CHUNK))
        for frames in state[:3] + ack[1:] + [[b"!ack", b"\0" * 3, b"a"]]:
            push.send_multipart(frames)
        assert until(lambda: hub.dropped == 3 + 2 + 1)
        assert hub.drops == {"state too large": 3, "part out of place": 2, "malformed part": 1}
        assert hub._parts._open == {}  # nothing of them kept
    finally:
        push.close(linger=0)
        ctx.term()
        hub.close()


def test_long_messages_travel_in_parts_both_ways(tmp_path):
    """A request, a report and a replica longer than channel.CHUNK arrive whole."""
    hub = loopback_hub(tmp_path)
    up, down = hub.urls
    keys = {name: hub.keys.admit(name, role) for name, role in (("ps", "ps"), ("w0", "worker"), ("w1", "worker"))}
    weight = torch.rand(300_000)  # 1.2 MB
    _speak_as(keys["ps"])
    board = ReplicaBoard(down, {"w0"}, {"weight": weight.shape}, max_bytes=replica_limit({"weight": weight}))
    w1 = channel.Listener(down, [channel.topic("node", "w1")], keys=keys["w1"], max_message=1 << 20)
    cfg = RoleConfig(node="w0", role="worker", rank=0, run_dir="/nonexistent", t0=time.time(), scenario={},
                     ps_address="127.0.0.1", threads=1, records=up, control=down)
    answered = []
    try:
        channel.report(cfg, "ps.json", {"blob": "p" * 300_000})
        _speak_as(keys["w0"])
        board_heard = until(lambda: board.refresh(50) is not None and _replica_sent(cfg, weight, board), 20)
        asker = threading.Thread(target=lambda: answered.append(hub.request("w1", {"op": "go", "cfg": "c" * 300_000})))
        asker.start()
        request = _first(w1)
        _speak_as(keys["w1"])
        channel.send_json(up, "ack", {"node": "w1", "seq": request["seq"], "detail": "d" * 200_000})
        asker.join(10)
        assert board_heard and torch.equal(board.latest["w0"]["params"]["weight"], weight)
        assert request["cfg"] == "c" * 300_000 and answered == ["d" * 200_000]
        assert until(lambda: (tmp_path / "ps.json").exists())
        assert json.loads((tmp_path / "ps.json").read_text()) == {"blob": "p" * 300_000}
    finally:
        w1.close()
        board.close()
        channel.flush()
        hub.close()


def _replica_sent(cfg, weight, board) -> bool:
    """Whether the board has w0's replica (sent again until it has: the board subscribes late)."""
    if "w0" not in board.latest:
        send_replica(cfg, {"weight": weight}, step=1)
    return "w0" in board.latest


def _first(listener: channel.Listener) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for _, payload in listener.poll(100):
            return json.loads(payload)
    raise AssertionError("nothing came")


# -- the coordinator ----------------------------------------------------------------------------
def test_the_coordinators_board_holds_a_bounded_number_of_bytes(hub):
    """80 replicas of 4 MiB while the coordinator reads none: its ZeroMQ holds REPLICA_QUEUE parts
    (it took them all in); it takes the next replica once it reads, and drops one longer than the
    model's at its first part."""
    weight = torch.zeros(1 << 20)  # 4 MiB
    board = Helper("board", hub.down, hub.keys["ps"].to_text(), str(weight.numel()))
    coordinator = channel.Listener(hub.down, [b"replica:"], keys=hub.keys["ps"])  # another reader: when all came
    try:
        _speak_as(hub.keys["w1"])
        assert until(lambda: _board_has(board, hub, {"w1": 0}, _replica(weight, "w1", 0)))  # subscribed
        before = board.ask("memory")["rss"]
        assert _flood(hub, coordinator, 80, 4 << 20) > 0
        grown = max(board.ask("memory")["rss"] for _ in range(5) if time.sleep(0.1) is None) - before
        assert grown <= REPLICA_QUEUE * channel.CHUNK / (1 << 20) + SLACK_MIB, f"the board grew {grown:.0f} MiB"
        board.ask("refresh")
        _speak_as(hub.keys["w0"])
        too_long = _replica(torch.zeros(2 << 20), "w0", 3)  # longer than the model's: each part is dropped
        channel.send(hub.up, "replica", too_long)
        assert until(lambda: _board_has(board, hub, {"w0": 2, "w1": 0}, _replica(weight, "w0", 2)))
        assert board.ask("dropped")["message too long"] == len(channel.framed(b"", too_long))
    finally:
        coordinator.close()
        board.close()


def _replica(weight: torch.Tensor, node: str, step: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"node": node, "step": step, "params": {"weight": weight}}, buf)
    return buf.getvalue()


def _board_has(board: Helper, hub, steps: dict, replica: bytes) -> bool:
    """Whether the board has these steps (else `replica` is sent again, from this process's node)."""
    if board.ask("refresh") == steps:
        return True
    channel.send(hub.up, "replica", replica)
    return False


def test_a_flood_of_subscriptions_holds_the_hubs_loop_one_batch_at_most():
    """The hub's loop takes at most RECEIVE_BATCH subscriptions a pass, then answers handshakes
    and rows again: an endless flood does not keep it in the drain."""
    from testbed.runtimes.control.hub import RECEIVE_BATCH

    class EndlessSubscriptions:
        closed, read = False, 0

        def poll(self, timeout):
            return True

        def recv(self, flags, copy):
            self.read += 1
            return zmq.Frame(b"\x01flood")

    hub = ControlHub.__new__(ControlHub)
    hub._pub_lock, hub._pub = threading.Lock(), EndlessSubscriptions()
    hub._subscription = lambda subscribe, prefix, sender: None
    hub._subscriptions()
    assert hub._pub.read == RECEIVE_BATCH
