"""Nothing a peer or an outsider sends ends a receiver: NaN, Infinity, numbers beyond
int64, 10,000-deep JSON and oversized messages are refused by the one strict loader
(node.untrusted) at the wire, the control hub, a node's supervisor and the timeline; each drop is
counted by reason, and the receiver goes on taking good messages."""
import itertools
import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from testbed.node import channel, channel_keys, transport, untrusted
from testbed.node.untrusted import Refused
from testbed.node.wire import MAGIC, Message, WireError, decode, encode
from testbed.run.timeline import Change, Timeline

from helpers import _free_port, _speak_as, loopback_hub, until

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEEP = b"[" * 10_000 + b"]" * 10_000
HOSTILE_VALUES = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", str(10 ** 400).encode(),
                  str(-10 ** 400).encode(), str(2 ** 63).encode(), DEEP]

finite_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)


def _with_hostile(doc: bytes, value: bytes) -> bytes:
    """`doc` (JSON text of a mapping) with one more key holding `value`'s raw bytes."""
    return doc[:-1] + (b', ' if doc != b"{}" else b"") + b'"x": ' + value + b"}"


# -- the loader ----------------------------------------------------------------------------------
@SETTINGS
@given(finite_json)
def test_what_dumps_writes_loads_reads_back(value):
    assert untrusted.loads(untrusted.dumps(value)) == json.loads(json.dumps(value))


@SETTINGS
@given(st.dictionaries(st.text(max_size=8), finite_json, max_size=4), st.sampled_from(HOSTILE_VALUES))
def test_nan_infinity_huge_numbers_and_deep_nesting_are_refused_anywhere(doc, value):
    with pytest.raises(Refused):
        untrusted.loads(_with_hostile(json.dumps(doc).encode(), value), max_bytes=1 << 20)


@SETTINGS
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_the_loader_raises_only_refused(data):
    try:
        untrusted.loads(data)
    except Refused as e:
        assert e.reason in ("too large", "nested too deep", "not a number", "number out of range", "not JSON")


def test_each_refusal_says_why_and_brackets_inside_strings_do_not_count():
    reasons = {v[:12]: _reason(v) for v in HOSTILE_VALUES}
    assert reasons == {b"NaN": "not a number", b"Infinity": "not a number", b"-Infinity": "not a number",
                       b"1e400": "number out of range", b"-1e400": "number out of range",
                       str(10 ** 400).encode()[:12]: "number out of range",
                       str(-10 ** 400).encode()[:12]: "number out of range",
                       str(2 ** 63).encode()[:12]: "number out of range", DEEP[:12]: "nested too deep"}
    assert _reason(b"x" * (2 << 20)) == "too large"
    assert untrusted.loads(json.dumps({"cmd": "[" * 500 + '\\"{{{', "n": 2 ** 63 - 1}))["n"] == 2 ** 63 - 1
    assert untrusted.loads(b"[" * 64 + b"]" * 64) is not None
    assert _reason(b"[" * 65 + b"]" * 65) == "nested too deep"
    assert untrusted.dumps({"loss": float("nan"), "v": [float("inf"), 1.5]}) == '{"loss": null, "v": [null, 1.5]}'


def _reason(data: bytes) -> str:
    try:
        untrusted.loads(data)
    except Refused as e:
        return e.reason
    return "accepted"


def test_a_deep_scan_of_a_megabyte_is_quick():
    started = time.perf_counter()
    assert _reason(b"[" * 500_000 + b"]" * 500_000) == "nested too deep"
    assert untrusted.nesting(b"[" * 500_000 + b"]" * 500_000) == 500_000
    assert time.perf_counter() - started < 2.0


# -- the wire ------------------------------------------------------------------------------------
def _frames_with_meta(raw_meta: bytes) -> list[bytes]:
    t = torch.zeros(3)
    head = b'{"kind":"push","tensors":[{"name":"g","dtype":"float32","shape":[3]}],"meta":' + raw_meta + b"}"
    return [MAGIC + head, t.numpy().tobytes()]


@SETTINGS
@given(st.dictionaries(st.text(max_size=8), finite_json, max_size=4), st.sampled_from(HOSTILE_VALUES))
def test_a_header_with_nan_infinity_huge_numbers_or_deep_nesting_is_a_wire_error(meta, value):
    with pytest.raises(WireError, match="bad header"):
        decode(_frames_with_meta(_with_hostile(json.dumps(meta).encode(), value)))


def test_a_shape_beyond_int64_is_a_wire_error_and_a_nan_meta_travels_as_null():
    head = b'{"kind":"m","tensors":[{"name":"g","dtype":"float32","shape":[' + str(10 ** 400).encode() + b"]}]}"
    with pytest.raises(WireError, match="number out of range"):
        decode([MAGIC + head, b""])
    got = decode(encode(Message("push", {"g": torch.ones(2)}, {"loss": float("nan"), "base_version": 3})))
    assert got.meta == {"loss": None, "base_version": 3} and torch.equal(got.tensors["g"], torch.ones(2))


def test_an_endpoint_counts_hostile_headers_and_still_takes_good_messages():
    ctx = zmq.Context()
    port = _free_port()
    rx = ctx.socket(zmq.ROUTER)
    rx.bind(f"tcp://127.0.0.1:{port}")
    ep = transport.Endpoint(rx, transport.DelaySpec(), router=True)
    tx = ctx.socket(zmq.DEALER)
    tx.setsockopt(zmq.IDENTITY, b"w0")
    tx.connect(f"tcp://127.0.0.1:{port}")
    try:
        for value in HOSTILE_VALUES:
            tx.send_multipart(_frames_with_meta(b'{"base_version": ' + value + b"}"))
        tx.send_multipart(_frames_with_meta(b'{"_up": 1e308}'))  # a sender's delay beyond any link's
        tx.send_multipart(encode(Message("push", {"g": torch.zeros(3)}, {"base_version": 1})))
        got = _recv_until(ep, 1)
        assert [(s, m.kind, m.meta) for s, m, _ in got] == [("w0", "push", {"base_version": 1})]
        assert ep.dropped == {"malformed": len(HOSTILE_VALUES) + 1}
    finally:
        tx.close(linger=0)
        ep.close()
        ctx.term()


def _recv_until(ep, n: int, limit: float = 5.0) -> list:
    got, deadline = [], time.monotonic() + limit
    while len(got) < n and time.monotonic() < deadline:
        got += ep.recv(0.1)
    return got


# -- the roles -----------------------------------------------------------------------------------
def test_a_peer_and_the_ps_count_a_handler_error_and_go_on():
    """Whatever a handler raises on one message (an error in a strategy, a number that overflows),
    that message is dropped and counted; the next is taken."""
    from testbed.node.roles.peer import PeerWorker
    from testbed.node.roles.ps import ParameterServer

    taken = []

    def take(sender, msg):
        if msg.kind == "boom":
            raise ZeroDivisionError("a strategy's bug")
        if msg.kind == "huge":
            int(float("inf"))
        taken.append(msg.kind)

    peer = SimpleNamespace(received=0, take=take, inbox=SimpleNamespace(dropped=untrusted.Drops("test inbox")))
    msgs = [("w1", Message(k), 10) for k in ("boom", "huge", "grad", "boom")]
    PeerWorker.absorb(peer, msgs)
    assert taken == ["grad"] and peer.received == 40
    assert peer.inbox.dropped == {"handler error (ZeroDivisionError)": 2, "refused": 1}

    ps = SimpleNamespace(faulty=set(), ep=SimpleNamespace(dropped=untrusted.Drops("test ps")), refusals=[])
    ps.handle = lambda sender, msg, n: take(sender, msg)
    ps.refuse = lambda sender, kind, e: ParameterServer.refuse(ps, sender, kind, e)
    ps.events = SimpleNamespace(write=lambda **row: ps.refusals.append(row["detail"]))
    ps.cfg = SimpleNamespace(now=lambda: 1.0)
    ps.members = SimpleNamespace(joined=set())
    ParameterServer.serve(ps, msgs)
    assert taken == ["grad", "grad"]
    assert ps.ep.dropped == {"handler error (ZeroDivisionError)": 2, "refused": 1}
    assert ps.refusals[1] == "huge: OverflowError: cannot convert float infinity to integer"


def test_the_coordinator_drops_progress_from_no_worker_and_what_its_handlers_cannot_use():
    from testbed.node.roles.coordinator import Coordinator

    co = SimpleNamespace(ep=SimpleNamespace(dropped=untrusted.Drops("test coordinator")), started=True,
                         joined=set(), workers={"w0"}, steps={"w0": 0})
    co.handle = lambda sender, msg: Coordinator.handle(co, sender, msg)
    co.note_inbox_drops = lambda sender, meta: None
    co.maybe_snapshot = lambda: None
    Coordinator.serve(co, [("eval", Message("progress", meta={"step": 5}), 1),
                           ("w0", Message("progress", meta={"step": "x"}), 1),
                           ("w0", Message("progress", meta={"step": 1e300}), 1),
                           ("w0", Message("progress", meta={"step": 7}), 1)])
    assert co.steps == {"w0": 7}
    assert co.ep.dropped == {"refused": 2}  # a float this large is still an int (Python's are unbounded)


# -- the control hub ------------------------------------------------------------------------------
@pytest.fixture
def hub(tmp_path):
    h = loopback_hub(tmp_path)
    _speak_as(h, "w0", "worker")  # what follows comes from a node of the run, with its own key
    yield h
    h.close()
    channel.flush()
    channel_keys.use(None)


@pytest.fixture
def pusher(hub):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    hub.keys.of("w0").secure(sock)
    sock.connect(hub.urls[0])
    yield sock
    sock.close(linger=0)
    ctx.term()


def _hub_beats(hub) -> bool:
    """Whether the hub still publishes its beats (a fresh subscriber hears one)."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, channel.topic("beat"))
    hub.keys.of("w0").secure(sub)
    sub.connect(hub.urls[1])
    try:
        return bool(sub.poll(3000)) and sub.recv_multipart()[0] == channel.topic("beat")
    finally:
        sub.close(linger=0)
        ctx.term()


def test_the_hub_survives_infinity_deep_json_huge_numbers_and_a_100_mib_message(hub, pusher, tmp_path):
    hundred_mib = b"x" * (100 << 20)
    hostile = [[b"!ack", b'{"node": "w0", "seq": Infinity}'], [b"!ack", b'{"node": "w0", "seq": NaN}'],
               [b"!ack", b'{"node": "w0", "seq": ' + str(10 ** 400).encode() + b"}"],
               [b"!ack", DEEP],
               [b"!ack", b'{"node": "w0", "seq": 1, "x": ' + b'{"a": ' * 10_000 + b"1" + b"}" * 10_001],
               [b"!ack", hundred_mib],
               [b"!replica", b"x" * 1000],  # a run with no replicas
               [b"!stats", b'{"node": "w0", "rx": 1e400}'], [b"!nonsense", b"{}"], [b"!ack", b"[1]"],
               [b"!state", b'{"node": "' + b"n" * 1000 + b'", "gen": 1, "running": true, "exitcode": null}']]
    hub.max_replica = 0
    for head, payload in hostile:
        parts = channel.framed(head, payload)  # over channel.CHUNK: in parts, as a node sends it
        for frames in parts[:1] if payload is hundred_mib else parts:  # (its first part is dropped: enough)
            pusher.send_multipart(frames)
    assert until(lambda: hub.dropped == len(hostile), limit=30)
    pusher.send_multipart([b"!ack", hundred_mib])  # in one frame: the hub cuts the connection, unread
    steps = channel.RemoteTable(hub.urls[0], "steps.csv")  # the hub still takes a node's rows
    steps.write(time=1.0, node="w0", step=1, loss=0.5)
    channel.flush()
    assert until(lambda: hub.rows == 1)
    assert hub._thread.is_alive() and _hub_beats(hub)
    assert hub.drops == {"not a number": 2, "number out of range": 2, "nested too deep": 2, "ack too large": 1,
                         "replica too large": 1, "unknown kind": 1, "ack not a mapping": 1,
                         "state for another node": 1}
    assert hub.states == {} and hub.take_requests() == [] and hub.stats == {}
    assert (tmp_path / "steps.csv").read_text().splitlines()[1].startswith("1,w0,1,")


def _marker(pusher, hub) -> bool:
    """Whether a message sent after the others has been taken (the hub takes a node's messages
    in order): w0's counters, carrying a number of their own."""
    marker = next(MARKERS)
    pusher.send_multipart([b"!stats", json.dumps({"node": "w0", "marker": marker}).encode()])
    return until(lambda: hub.stats.get("w0", {}).get("marker") == marker, limit=10)


def test_a_forged_ack_answers_no_request_and_a_handler_error_is_counted(hub, pusher):
    pusher.send_multipart([b"!ack", b'{"node": "w0", "seq": 1, "detail": "forged"}'])
    assert _marker(pusher, hub)
    assert hub._acks == {} and hub.dropped == 0  # no request asked for it: not kept for a later one's answer
    hub._on_put = lambda data: 1 / 0  # a bug in a handler is the message's drop, not the hub's end
    hub.grant_put("k", "w0")
    pusher.send_multipart([b"!put", b'{"key": "k", "data": ""}'])
    assert until(lambda: hub.drops.get("handler error (ZeroDivisionError)") == 1)
    assert hub._thread.is_alive() and _hub_beats(hub)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.sampled_from([b"!ack", b"!state", b"!report", b"!request", b"!ready", b"!stats", b"!put", b"steps.csv",
                        b"!", b"x"]),
       st.one_of(st.binary(max_size=300), finite_json.map(lambda v: json.dumps(v).encode()),
                 st.sampled_from(HOSTILE_VALUES).map(lambda v: _with_hostile(b'{"node": "w0", "seq": 1}', v))))
def test_fuzz_every_message_to_the_hub_is_taken_or_dropped_and_the_hub_goes_on(hub, pusher, kind, payload):
    pusher.send_multipart([kind, payload])
    assert _marker(pusher, hub)
    assert hub._thread.is_alive()


MARKERS = itertools.count()


# -- a node's supervisor ----------------------------------------------------------------------------
def test_a_supervisor_counts_what_it_cannot_read_and_answers_the_next_request(hub):
    from testbed.node.supervisor import RoleSupervisor

    ctx = zmq.Context()
    down = ctx.socket(zmq.PUB)  # a down channel with the hub's key (no other reaches a node): whatever it publishes
    down.curve_server, down.curve_secretkey = True, hub.keys.secret
    port = _free_port()
    down.bind(f"tcp://127.0.0.1:{port}")
    sup = RoleSupervisor("w0", hub.urls[0], f"tcp://127.0.0.1:{port}")
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        hostile = [b'{"op": "go", "seq": Infinity}', b'{"op": "go", "seq": ' + str(10 ** 400).encode() + b"}",
                   DEEP, b"[1, 2]", b'{"op": "go", "seq": "7"}', b"\xff\xfe",
                   b"x" * (2 << 20)]  # (2 MiB: a "go" may be large)
        for payload in hostile:
            for frames in channel.framed(channel.topic("node", "w0"), payload):  # (a long one in parts, as the hub's)
                down.send_multipart(frames)
        down.send_multipart([channel.topic("beat"), b'{"stop": NaN}'])
        down.send_multipart([channel.topic("node", "w0"), b'{"op": "go", "idle": true, "seq": 5}'])
        with hub._cond:
            hub._awaited.add(("w0", 5))
        deadline = time.monotonic() + 10
        while ("w0", 5) not in hub._acks and time.monotonic() < deadline:
            sup._listen(50)
        assert hub._acks[("w0", 5)] == "idle"  # the good request after all that, answered
        assert not sup.stop.is_set() and not sup.beat.stop
        assert sup.dropped == {"not a number": 1, "number out of range": 1, "nested too deep": 1,
                               "not a request": 2, "not JSON": 2}
        assert until(lambda: hub.node_drops.get("w0") == dict(sup.dropped))  # with its ack, for summary.json
    finally:
        sup.listener.close()
        channel.flush()
        down.close(linger=0)
        ctx.term()


# -- the timeline -------------------------------------------------------------------------------------
def test_the_timeline_refuses_bad_node_requests_and_runs_the_rest_of_its_events(tmp_path):
    """A node's request with a bad `at` (or a trace, or a number beyond any bound) once killed the
    timeline thread; now it is refused and counted, and the scenario's later events still run."""
    inbox = [[{"id": "r1", "node": "w0", "action": "kill", "fields": {"at": "soon"}},
              {"id": "r2", "node": "w0", "action": "link", "fields": {"trace": "/etc/passwd"}},
              {"id": "r3", "node": "w0", "action": "stress", "fields": {"load": 10 ** 30}},
              {"id": ["x"], "node": "w0", "action": "pause", "fields": []},
              {"id": "r5", "node": "w1", "action": "pause", "fields": {}}]]
    (tmp_path / "1-inf.json").write_text('{"node": "w0", "action": "cpu", "fields": {"cpus": Infinity}}')
    (tmp_path / "2-bytes.json").write_bytes(b"\xff\xfe{")
    (tmp_path / "3-deep.json").write_bytes(DEEP)
    applied, recorded = [], []

    def record(change, at, detail):
        recorded.append((change.action, detail))
        if change.node == "w1":
            raise OSError("disk full")  # the change is made; the timeline goes on

    clock = {"t": 0.0}
    tl = Timeline([Change(0.5, None, "w2", "kill")], lambda c: applied.append((c.node, c.action)) or "done",
                  record, t0=0.0, clock=lambda: clock["t"], sleep=lambda s: None, control_dir=tmp_path,
                  inbox=lambda: inbox.pop(0) if inbox else [])
    tl.run_once()
    clock["t"] = 1.0
    tl.run_once()
    assert applied == [("w1", "pause"), ("w2", "kill")]
    assert tl.counts == {"applied": 2, "failed": 0, "refused": 7}
    refusals = [d for a, d in recorded if a == "refused"]
    assert any("may not set at" in d for d in refusals) and any("may not set trace" in d for d in refusals)
    assert any("1-inf.json: not a number" in d for d in refusals) and any("3-deep.json: nested too deep" in d
                                                                            for d in refusals)
    assert any("recording pause w1: OSError: disk full" in e for e in tl.errors)
    assert not list(tmp_path.glob("*.json"))


def test_the_timeline_thread_outlives_an_error_outside_any_change():
    calls = {"n": 0}

    def step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the step counter broke once")
        return 0

    done = threading.Event()
    tl = Timeline([Change(0.0, None, "w0", "kill"), Change(0.2, None, "w1", "kill")],
                  lambda c: (done.set() if c.node == "w1" else None) or "done", lambda *a: None, t0=time.time(),
                  step=step, poll=0.02)
    tl.start()
    try:
        assert done.wait(5)
    finally:
        tl.stop()
    assert tl.counts["failed"] == 1 and tl.counts["applied"] == 2
    assert tl.errors[0] == "timeline: RuntimeError: the step counter broke once"


def test_what_the_channel_dropped_lands_in_the_summary_by_reason():
    from testbed.run.summary import control_drops

    hub = SimpleNamespace(drops={"not a number": 2}, node_drops={"w1": {"not JSON": 1}})
    assert control_drops(hub) == {"not a number": 2, "w1 supervisor: not JSON": 1}
