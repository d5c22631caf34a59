"""The control channel lets in only the run's nodes, each as itself: the hub's PULL and
PUB are CURVE servers whose ZAP answers name the node of each key; a message's sender is that
node, never a name in it. On loopback here; tests/lab/test_swarm.py tries it from a lab host."""
import io
import json
import tarfile
import time

import pytest
import zmq

from testbed.node import channel, channel_keys
from testbed.node.channel_keys import ChannelKeys
from testbed.records import metrics
from testbed.records.columns import EVAL_COLUMNS, SERVER_COLUMNS, STEP_COLUMNS, TRAFFIC_COLUMNS
from testbed.runtimes.control.channel_auth import RunKeys

from helpers import HANDSHAKE, _free_port, at_handshake, loopback_hub, until

NODES = {"w0": "worker", "w1": "worker", "ps": "ps", "eval": "evaluator"}


@pytest.fixture
def hub(tmp_path):
    h = loopback_hub(tmp_path)
    for name, role in NODES.items():
        h.keys.admit(name, role)
    yield h
    h.close()


@pytest.fixture
def sockets():
    """Sockets made with `make(kind, url, keys, topics)`: CURVE clients with `keys`, plain without."""
    ctx = zmq.Context()
    made = []

    def make(kind, url, keys=None, topics=(b"",)):
        sock = ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            keys.secure(sock)
        if kind == zmq.SUB:
            for t in topics:
                sock.setsockopt(zmq.SUBSCRIBE, t)
        sock.connect(url)
        made.append(sock)
        return sock

    yield make
    for sock in made:
        sock.close(linger=0)
    ctx.term()


def _stranger(hub) -> ChannelKeys:
    """A key the run never made, with the hub's (public) key: what an outsider can hold."""
    return ChannelKeys("w0", *zmq.curve_keypair(), hub.keys.public)


def _wrong_server(hub, name: str) -> ChannelKeys:
    """A node's own keys, but another server's key: it takes an impostor for the hub."""
    k = hub.keys.of(name)
    return ChannelKeys(name, k.public, k.secret, zmq.curve_keypair()[0])


def _row(columns, **values) -> bytes:
    return metrics.format_row(columns, values)


FORGED = [[b"steps.csv", _row(STEP_COLUMNS, time=1.0, node="w0", step=1, loss=123.456)],
          [b"!state", b'{"node": "w0", "gen": 1, "running": false, "exitcode": 0}'],
          [b"!ack", b'{"node": "w0", "seq": 1, "detail": "forged"}'],
          [b"!request", b'{"id": "x", "node": "w0", "action": "kill", "fields": {}}'],
          [b"!ready", b'{"node": "broker"}'], [b"!report", b'{"name": "ps.json", "data": {"forged": 1}}']]


def _received(sub, seconds: float) -> int:
    n, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sub.poll(50):
            sub.recv_multipart()
            n += 1
    return n


def test_a_connection_closed_mid_handshake_is_told_from_a_stranger(hub):
    """A peer that goes before its handshake ends (a trainer ending, a node frozen or killed) is
    counted apart from one the hub refused: a fleet's runs showed a few of those each."""
    import socket

    host, port = hub.urls[0].rsplit("/", 1)[1].rsplit(":", 1)
    for _ in range(3):
        s = socket.create_connection((host, int(port)))
        s.close()
    assert until(lambda: sum(n for why, n in hub.drops.items() if why.startswith("handshake cut off")) == 3)
    assert HANDSHAKE not in hub.drops and all("EPIPE" in why or "ECONNRESET" in why for why in hub.drops)


def test_an_unauthenticated_push_gets_nothing_through(hub, sockets, tmp_path):
    with hub._cond:
        hub._awaited.add(("w0", 1))
    for keys in (None, _stranger(hub)):  # plain; and CURVE with a key of no node of the run
        push = sockets(zmq.PUSH, hub.urls[0], keys)
        for frames in FORGED:
            push.send_multipart(frames)
    assert until(lambda: hub.drops.get("unknown key") and at_handshake(hub.drops))
    time.sleep(1.0)
    assert hub.rows == 0 and hub.states == {} and hub._acks == {} and hub.ready == set()
    assert hub.take_requests() == [] and not (tmp_path / "ps.json").exists()
    # refused at the handshake: no message was read
    assert all(why in ("unknown key", HANDSHAKE) or why.startswith("handshake cut off") for why in hub.drops)
    node = sockets(zmq.PUSH, hub.urls[0], hub.keys.of("w0"))  # the same row from the node itself
    node.send_multipart(FORGED[0])
    assert until(lambda: hub.rows == 1)


def test_an_unauthenticated_sub_receives_nothing(hub, sockets):
    plain = sockets(zmq.SUB, hub.urls[1])
    stranger = sockets(zmq.SUB, hub.urls[1], _stranger(hub))
    node = sockets(zmq.SUB, hub.urls[1], hub.keys.of("w0"))
    time.sleep(0.5)
    hub.ask_all(["w0"], {"op": "go", "cfg": {"scenario": "the whole RoleConfig"}}, timeout=1.0)
    assert _received(plain, 1.0) == 0 and _received(stranger, 0.1) == 0
    assert _received(node, 0.1) > 2  # beats and the repeated request: the channel itself works
    assert hub.drops.get("unknown key") and at_handshake(hub.drops)


def test_a_node_with_the_wrong_server_key_receives_nothing_and_hears_no_impostor(hub, sockets):
    wrong = _wrong_server(hub, "w0")
    sub = sockets(zmq.SUB, hub.urls[1], wrong)
    push = sockets(zmq.PUSH, hub.urls[0], wrong)
    push.send_multipart(FORGED[0])
    assert _received(sub, 1.5) == 0 and hub.rows == 0
    # a publisher that is not the hub (its own server key) reaches no node, whatever it says
    ctx = zmq.Context()
    impostor = ctx.socket(zmq.PUB)
    impostor.curve_server, impostor.curve_secretkey = True, zmq.curve_keypair()[1]
    port = _free_port()
    impostor.bind(f"tcp://127.0.0.1:{port}")
    channel_keys.use(hub.keys.of("w0"))
    listener = channel.Listener(f"tcp://127.0.0.1:{port}", [channel.topic("beat"), channel.topic("node", "w0")])
    try:
        heard = []
        for _ in range(20):
            impostor.send_multipart([channel.topic("node", "w0"), b'{"op": "kill", "seq": 1}'])
            impostor.send_multipart([channel.topic("beat"), b'{"stop": true}'])
            heard += listener.poll(50)
        assert heard == []
    finally:
        listener.close()
        channel_keys.use(None)
        impostor.close(linger=0)
        ctx.term()


def _marker(hub, push, name: str) -> bool:
    """Once a node's counters with a new marker are in, what it sent before them has been taken."""
    marker = time.monotonic()
    push.send_multipart([b"!stats", json.dumps({"node": name, "marker": marker}).encode()])
    return until(lambda: hub.stats.get(name, {}).get("marker") == marker)


def test_a_node_speaking_for_another_is_dropped_and_counted(hub, sockets, tmp_path):
    """The same bytes a node sends for itself, sent with another node's key, are refused; what
    each role may send it sends (the PS its server rows, the evaluator its eval rows)."""
    with hub._cond:
        hub._awaited.add(("w0", 1))
    hub.grant_put("box-1/w0.json", "w0")
    own = [*FORGED[:4], [b"!stats", b'{"node": "w0", "rx": 1}'], [b"!put", b'{"key": "box-1/w0.json", "data": "1"}']]
    w1 = sockets(zmq.PUSH, hub.urls[0], hub.keys.of("w1"))
    for frames in own + [[b"!request", b'{"id": "y", "node": "w1", "action": "link", "fields": {"rate": 1}}'],
                         [b"eval.csv", _row(EVAL_COLUMNS, time=1.0, step=1, accuracy=0.99)],
                         [b"server.csv", _row(SERVER_COLUMNS, time=1.0, version=1, worker="w0")],
                         [b"traffic.csv", _row(TRAFFIC_COLUMNS, time=1.0, node="w1", bytes=1)], *FORGED[4:]]:
        w1.send_multipart(frames)
    assert _marker(hub, w1, "w1")
    assert hub.drops == {"row for another node": 1, "state for another node": 1, "ack for another node": 1,
                         "request for another node": 1, "stats for another node": 1,
                         "put into a slot not given to it": 1, "request beyond a node's own crash": 1,
                         "row of a table not its role's": 3, "ready not its role's": 1, "report not its role's": 1}
    assert hub.rows == 0 and "w0" not in hub.states and hub._acks == {} and hub.take_requests() == []
    assert hub.puts == {} and "w0" not in hub.stats and hub.ready == set()
    w0 = sockets(zmq.PUSH, hub.urls[0], hub.keys.of("w0"))  # the same bytes from w0 itself
    for frames in own:
        w0.send_multipart(frames)
    assert _marker(hub, w0, "w0")
    assert hub.rows == 1 and hub.states["w0"]["gen"] == 1 and hub._acks == {("w0", 1): "forged"}
    assert [r["node"] for r in hub.take_requests()] == ["w0"] and hub.puts == {"box-1/w0.json": "1"}
    for name, frames in (("ps", [b"server.csv", _row(SERVER_COLUMNS, time=1.0, version=1, worker="w0")]),
                         ("eval", [b"eval.csv", _row(EVAL_COLUMNS, time=1.0, node="eval", step=1, accuracy=0.5)])):
        sockets(zmq.PUSH, hub.urls[0], hub.keys.of(name)).send_multipart(frames)
    assert until(lambda: hub.rows == 3)
    assert sum(hub.drops.values()) == 12  # nothing more dropped
    assert (tmp_path / "steps.csv").read_text().count("123.456") == 1


def test_a_supervised_nodes_counters_acks_and_states_come_with_its_supervisors_key_alone(hub, sockets):
    """A node's own code holds its node's key: the counters behind traffic.csv and resources.csv,
    the acks (a counter read, a kill done) and the role's state it sends with it are dropped once
    the node has a supervisor's key; the same bytes with that key are taken, and that key sends
    nothing else. A node without one (netns) is as it was."""
    supervisors = hub.keys.supervisor("w0")
    with hub._cond:
        hub._awaited.add(("w0", 1))
    word = [[b"!stats", b'{"node": "w0", "rx_bytes": 1}'], [b"!ack", b'{"node": "w0", "seq": 1, "detail": "1"}'],
            [b"!state", b'{"node": "w0", "gen": 1, "running": false, "exitcode": 0}']]
    row = [b"steps.csv", _row(STEP_COLUMNS, time=1.0, node="w0", step=1, loss=0.5)]
    node = sockets(zmq.PUSH, hub.urls[0], hub.keys.of("w0"))
    for frames in [*word, row]:
        node.send_multipart(frames)
    assert until(lambda: hub.rows == 1)  # its own rows still go in (and what came before them was read)
    assert hub.drops == {"stats not with its supervisor's key": 1, "ack not with its supervisor's key": 1,
                         "state not with its supervisor's key": 1}
    assert "w0" not in hub.stats and hub._acks == {} and "w0" not in hub.states
    supervisor = sockets(zmq.PUSH, hub.urls[0], supervisors)
    for frames in [row, [b"!request", b'{"id": "x", "node": "w0", "action": "kill", "fields": {}}'], *word]:
        supervisor.send_multipart(frames)
    assert until(lambda: "w0" in hub.states)
    assert hub.stats["w0"]["rx_bytes"] == 1 and hub._acks == {("w0", 1): "1"} and hub.states["w0"]["gen"] == 1
    assert hub.drops["beyond what a supervisor sends"] == 2 and hub.rows == 1 and hub.take_requests() == []
    assert _marker(hub, sockets(zmq.PUSH, hub.urls[0], hub.keys.of("w1")), "w1")  # no supervisor's key: as before


def test_a_command_workload_reports_from_any_of_its_nodes_and_still_only_as_itself(hub, sockets):
    ps = sockets(zmq.PUSH, hub.urls[0], hub.keys.of("ps"))
    ps.send_multipart([b"steps.csv", _row(STEP_COLUMNS, time=1.0, node="ps", step=1, loss=0.5)])
    assert _marker(hub, ps, "ps") and hub.rows == 0
    hub.open_reports()
    ps.send_multipart([b"steps.csv", _row(STEP_COLUMNS, time=1.0, node="ps", step=1, loss=0.5)])
    ps.send_multipart([b"report.csv", _row(["time", "node", "step", "key", "value"], node="ps", key="k", value=1)])
    ps.send_multipart([b"report.csv", _row(["time", "node", "step", "key", "value"], node="w0", key="k", value=1)])
    assert _marker(hub, ps, "ps")
    assert hub.rows == 2 and hub.drops == {"row of a table not its role's": 1, "row for another node": 1}


def test_eval_rows_name_their_node_and_come_from_the_evaluator_alone(hub, sockets, tmp_path):
    """eval.csv's rows come from the evaluator (a command workload: the role whose program the
    scenario names as evaluating, workload.eval_role), each naming the node that wrote it; a
    worker's, or one naming another node, is dropped and counted."""
    push = {name: sockets(zmq.PUSH, hub.urls[0], hub.keys.of(name)) for name in ("w0", "eval", "ps")}

    def evaluation(sender: str, node: str, accuracy: float) -> None:
        push[sender].send_multipart([b"eval.csv", _row(EVAL_COLUMNS, time=1.0, node=node, step=1, accuracy=accuracy)])
        assert _marker(hub, push[sender], sender)

    hub.open_reports()  # a command workload: its programs report from any node
    evaluation("w0", "w0", 0.99)
    evaluation("eval", "w0", 0.98)
    evaluation("eval", "eval", 0.5)
    hub.open_reports("ps")  # a program on the PS evaluates (Flower's ServerApp)
    evaluation("eval", "eval", 0.97)
    evaluation("ps", "ps", 0.6)
    assert hub.drops == {"row of a table not its role's": 2, "row for another node": 1}
    rows = (tmp_path / "eval.csv").read_text().splitlines()
    assert rows[0].split(",")[-1] == "node"
    assert [(r.split(",")[-1], r.split(",")[3]) for r in rows[1:]] == [("eval", "0.5"), ("ps", "0.6")]


# -- how keys reach a node ---------------------------------------------------------------------------
def test_keys_travel_as_text_and_never_show_their_secret():
    keys = RunKeys().admit("w0", "worker")
    assert ChannelKeys.from_text(keys.to_text()) == keys
    assert keys.secret.decode() not in repr(keys) and keys.secret.decode() not in str([keys])
    with pytest.raises(ValueError):
        ChannelKeys.from_text(json.dumps({"node": "w0", "public": "x", "secret": "y", "server": "z"}))


def test_a_docker_node_gets_its_keys_as_a_0400_file_copied_into_its_created_container():
    """Its supervisor's keys go apart, 0000 (read by the supervisor's sender alone: test_supervisor_key.py)."""
    from testbed.runtimes.docker.runtime import put_channel_keys

    run = RunKeys()
    keys, supervisors = run.admit("w0", "worker"), run.supervisor("w0")
    put = []
    put_channel_keys(type("Api", (), {"put_archive": lambda self, *a: put.append(a)})(), "c1", keys, supervisors)
    (cid, path, data), = put
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: (m.type, m.mode) for m in tar.getmembers()}
        text = tar.extractfile("edgebed/channel.key").read().decode()
        own = tar.extractfile("edgebed/supervisor.key").read().decode()
    assert (cid, path) == ("c1", "/run") and channel_keys.KEY_FILE == "/run/edgebed/channel.key"
    assert channel_keys.SUPERVISOR_KEY_FILE == "/run/edgebed/supervisor.key"
    assert members == {"edgebed": (tarfile.DIRTYPE, 0o700), "edgebed/channel.key": (tarfile.REGTYPE, 0o400),
                       "edgebed/supervisor.key": (tarfile.REGTYPE, 0o000)}
    assert ChannelKeys.from_text(text) == keys and ChannelKeys.from_text(own) == supervisors != keys


def test_a_supervisor_without_its_key_does_not_start(monkeypatch, tmp_path, capsys):
    from testbed.node import supervisor

    monkeypatch.setattr(channel_keys, "KEY_FILE", str(tmp_path / "absent"))
    monkeypatch.delenv(channel_keys.ENV, raising=False)
    assert supervisor.main(["launch", "--supervise", "w0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]) == 2
    assert "no channel key for w0" in capsys.readouterr().err
    other = RunKeys().admit("w1", "worker")  # another node's key is not this node's
    monkeypatch.setenv(channel_keys.ENV, other.to_text())
    assert supervisor.main(["launch", "--supervise", "w0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]) == 2


def test_only_the_ps_may_ask_for_another_node_s_trainer(hub, sockets):
    """A `train` request (per-round trainers) names another node: the PS's alone, with no fields;
    the same bytes from a worker are dropped; the runner takes them apart from the timeline's."""
    train = [b"!request", b'{"id": "t", "node": "w1", "action": "train", "fields": {}}']
    w0 = sockets(zmq.PUSH, hub.urls[0], hub.keys.of("w0"))
    w0.send_multipart(train)
    assert _marker(hub, w0, "w0")
    ps = sockets(zmq.PUSH, hub.urls[0], hub.keys.of("ps"))
    ps.send_multipart([b"!request", b'{"id": "u", "node": "w1", "action": "train", "fields": {"rate": 1}}'])
    ps.send_multipart(train)
    assert _marker(hub, ps, "ps")
    assert hub.drops == {"a train request not the PS's": 2}
    assert hub.take_trainers() == ["w1"] and hub.take_trainers() == [] and hub.take_requests() == []


def test_a_generation_s_exit_code_outlives_the_next_one_s_start(hub):
    """A per-round trainer's device (docker) starts its next trainer at once: the generation before
    still reads as ended with its own exit code (not -9, superseded), and an `ended` a node sends
    is the hub's own, never the node's."""
    from testbed.runtimes.engine.supervised import role_ended

    for data in ({"node": "w0", "gen": 1, "running": True, "exitcode": None, "ended": [1, 0]},
                 {"node": "w0", "gen": 1, "running": False, "exitcode": 0},
                 {"node": "w0", "gen": 2, "running": True, "exitcode": None}):
        assert hub._on_state(data)
    assert role_ended(hub.states, "w0", 1) == 0 and role_ended(hub.states, "w0", 2) is None
    hub._on_state({"node": "w0", "gen": 3, "running": True, "exitcode": None, "ended": [2, 0]})
    assert role_ended(hub.states, "w0", 2) == -9  # never heard to end: superseded
    assert hub._on_state({"node": "w1", "gen": 1, "running": True, "exitcode": None, "ended": [0, 0]})
    assert hub.states["w1"]["ended"] is None
