"""The control channel: a node's rows and messages reach the runner's hub, which is the only
writer of the run directory and drops what is not a row or a message it knows; the hub's beats,
requests, delays and replicas reach the nodes. Each node here speaks with its own channel keys
(test_channel_auth.py: what happens without them)."""
import json
import os
import threading
import time

import pytest
import zmq

from testbed.node import channel, channel_keys
from testbed.node.roles.common import RoleConfig
from testbed.records import metrics
from testbed.records.columns import STEP_COLUMNS
from testbed.runtimes.control.hub import ControlHub

from helpers import _free_port, _speak_as, until


def _cfg(run_dir, records=""):
    return RoleConfig(node="w0", role="worker", rank=0, run_dir=str(run_dir), t0=time.time(), scenario={},
                      ps_address="127.0.0.1", threads=1, records=records)


def _hub(tmp_path) -> tuple[ControlHub, str, str]:
    """A hub on loopback; this process speaks as its worker w0 until told otherwise (_speak_as)."""
    up, down = _free_port(), _free_port()
    hub = ControlHub(None, "127.0.0.1", up, down, tmp_path)
    _speak_as(hub, "w0", "worker")
    return hub, f"tcp://127.0.0.1:{up}", f"tcp://127.0.0.1:{down}"


@pytest.fixture(autouse=True)
def _no_keys_after():
    yield
    channel.flush()
    channel_keys.use(None)


def test_rows_travel_to_the_collector_and_bad_ones_are_dropped(tmp_path):
    metrics.init_tables(tmp_path)
    collector, up, _ = _hub(tmp_path)
    port = int(up.rsplit(":", 1)[1])
    try:
        steps = channel.open_table(_cfg(tmp_path, f"tcp://127.0.0.1:{port}"), "steps.csv")
        assert isinstance(steps, channel.RemoteTable)
        for k in range(3):
            steps.write(time=float(k), node="w0", step=k, loss=0.5, note_not_a_column="ignored")
        ctx = zmq.Context()
        rogue = ctx.socket(zmq.PUSH)  # a node of the run sending what it should not
        collector.keys.of("w0").secure(rogue)
        rogue.connect(f"tcp://127.0.0.1:{port}")
        for frames in ([b"steps.csv", b"1,2\n"], [b"../etc/passwd", b"x\n"], [b"steps.csv"],
                       [b"steps.csv", metrics.format_row(STEP_COLUMNS, {"node": "w9"}) * 2],
                       [b"steps.csv", b"\xff" * 10 + b"\n"]):
            rogue.send_multipart(frames)
        rogue.send_multipart([b"steps.csv", b"x" * (64 * 1024) + b"\n"])  # over a row's size limit
        for frames in ([b"!report", b'{"name": "../../etc/passwd", "data": {}}'], [b"!nonsense", b"{}"],
                       [b"!ack", b"not json"], [b"!state", b"[1, 2]"], [b"!ack", b'{"node": "w0", "seq": "x"}'],
                       [b"!state", b'{"node": "w0", "gen": "1", "running": true, "exitcode": null}']):
            rogue.send_multipart(frames)
        deadline = time.monotonic() + 5
        while collector.rows + collector.dropped < 15 and time.monotonic() < deadline:
            time.sleep(0.05)
        steps.write(time=9.0, node="w0", step=9, loss=0.5)  # the hub still takes rows after all that
        assert until(lambda: collector.rows == 4)
        rogue.close(linger=0)
        ctx.term()
        channel.flush()
        collector.drain(quiet=0.3)
    finally:
        collector.close()
    lines = (tmp_path / "steps.csv").read_text().splitlines()
    assert lines[0] == ",".join(STEP_COLUMNS)
    assert [line.split(",")[:3] for line in lines[1:]] == [["0", "w0", "0"], ["1", "w0", "1"], ["2", "w0", "2"],
                                                          ["9", "w0", "9"]]
    assert collector.rows == 4 and collector.dropped == 12 and collector.states == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(metrics.TABLES)  # no file but the tables


def test_without_a_control_network_a_node_writes_the_table_itself(tmp_path):
    metrics.init_tables(tmp_path)
    table = channel.open_table(_cfg(tmp_path), "eval.csv")
    assert isinstance(table, metrics.CsvLog)
    table.write(time=1.0, step=5, accuracy=0.5)
    table.close()
    assert (tmp_path / "eval.csv").read_text().splitlines()[1].startswith("1,5,")


def test_reports_requests_and_readiness_reach_the_runner(tmp_path):
    hub, up, down = _hub(tmp_path)
    cfg = RoleConfig(node="ps", role="ps", rank=-1, run_dir="/nonexistent", t0=time.time(), scenario={},
                     ps_address="127.0.0.1", threads=1, records=up, control=down)
    try:
        _speak_as(hub, "ps", "ps")
        channel.report(cfg, "ps.json", {"stop_reason": "steps", "version": 7})
        _speak_as(hub, "w0", "worker")
        channel.send_json(up, "request", {"id": "r1", "node": "w0", "action": "pause", "fields": {}})
        _speak_as(hub, "broker", "broker")
        channel.send_json(up, "ready", {"node": "broker"})
        assert until(lambda: (tmp_path / "ps.json").exists() and "broker" in hub.ready)
        assert until(lambda: hub.take_requests() == [{"id": "r1", "node": "w0", "action": "pause", "fields": {}}])
        assert hub.take_requests() == []  # taken once
    finally:
        channel.flush()
        hub.close()
    assert json.loads((tmp_path / "ps.json").read_text()) == {"stop_reason": "steps", "version": 7}


def test_a_request_is_repeated_until_answered_and_beats_carry_the_stop(tmp_path):
    """A supervisor that subscribes after the request was first sent still gets it; it answers."""
    hub, up, down = _hub(tmp_path)
    _speak_as(hub, "w1", "worker")
    answers = []

    def late_supervisor():
        time.sleep(0.5)  # the first sends reach nobody
        listener = channel.Listener(down, [channel.topic("node", "w1")])
        try:
            while not answers:
                for _, payload in listener.poll(100):
                    req = json.loads(payload)
                    answers.append(req)
                    channel.send_json(up, "ack", {"node": "w1", "seq": req["seq"], "detail": f"did {req['op']}"})
        finally:
            listener.close()

    t = threading.Thread(target=late_supervisor)
    t.start()
    try:
        assert hub.request("w1", {"op": "kill"}, timeout=10) == "did kill"
        t.join(5)
        assert answers[0]["op"] == "kill"
        beats = channel.Listener(down, [channel.topic("beat"), channel.topic("delay", "w1")])
        heart = channel.Heartbeat(timeout=20)
        hub.set_delay("w1", {"up": 0.05, "up_jitter": 0.0, "down": 0.0, "down_jitter": 0.0})
        hub.set_stop()
        deadline = time.monotonic() + 5
        seen = []
        while not heart.stopped() and time.monotonic() < deadline:
            for topic, payload in beats.poll(100):
                seen.append(topic)
                if topic == channel.topic("beat"):
                    heart.take(payload)
        beats.close()
        assert heart.stopped() and hub.stopping
    finally:
        channel.flush()
        hub.close()


def test_closing_the_hub_ends_a_request_still_waiting_and_refuses_later_ones(tmp_path):
    """A trainer's first start (a 180-s wait for a cold container) as the run ends: the hub's close
    ends the wait at once with a reason, and a request after it says the channel is closed."""
    hub, _, _ = _hub(tmp_path)
    errors: list = []

    def ask():
        try:
            hub.request("w1", {"op": "go"}, timeout=180)
        except RuntimeError as e:
            errors.append((time.monotonic(), str(e)))

    t = threading.Thread(target=ask)
    t.start()
    time.sleep(0.5)
    closed_at = time.monotonic()
    hub.close()
    t.join(10)
    assert not t.is_alive() and errors[0][0] - closed_at < 2.0
    assert errors[0][1] == "w1: no answer to a go request: the run has ended"
    with pytest.raises(RuntimeError, match="the run has ended"):
        hub.request("w1", {"op": "go"}, timeout=5)


def test_a_silent_runner_stops_a_node_only_after_its_first_beat():
    heart = channel.Heartbeat(timeout=0.2)
    time.sleep(0.3)
    assert not heart.stopped()  # no beat yet: the control network may still be being built
    heart.take(b'{"stop": false}')
    assert not heart.stopped()
    time.sleep(0.3)
    assert heart.stopped()


def test_a_transport_takes_up_delays_published_for_its_node(tmp_path):
    from testbed.node.transport import DelaySpec

    hub, up, down = _hub(tmp_path)
    _speak_as(hub, "w1", "worker")
    spec = DelaySpec(up=0.01, control=down, node="w1")
    other = DelaySpec(up=0.01, control=down, node="w10")  # a prefix of no other node's topic
    try:
        spec.refresh()
        other.refresh()
        time.sleep(0.3)  # both subscribed
        hub.set_delay("w1", {"up": 0.25, "up_jitter": 0.01, "down": 0.5, "down_jitter": 0.0})

        def took():
            spec._next_check = other._next_check = 0.0
            spec.refresh()
            other.refresh()
            return spec.up == 0.25

        assert until(took)
        assert (spec.up_jitter, spec.down) == (0.01, 0.5)
        assert other.up == 0.01
    finally:
        hub.close()


def test_replicas_reach_the_coordinator_and_foreign_ones_are_refused(tmp_path):
    import torch

    from testbed.node.roles.replicas import ReplicaBoard, send_replica

    hub, up, down = _hub(tmp_path)
    _speak_as(hub, "ps", "ps")  # the coordinator's board: replicas go to it alone
    board = ReplicaBoard(down, {"w0", "w1"}, {"weight": torch.Size([2, 3])})
    _speak_as(hub, "w0", "worker")
    cfg = RoleConfig(node="w0", role="worker", rank=0, run_dir="/nonexistent", t0=time.time(), scenario={},
                     ps_address="127.0.0.1", threads=1, records=up, control=down)
    try:
        time.sleep(0.3)  # the board is subscribed
        send_replica(cfg, {"weight": torch.ones(2, 3)}, step=4)
        send_replica(cfg, {"weight": torch.ones(3, 3)}, step=5)  # not the model's shape
        send_replica(RoleConfig(**{**cfg.__dict__, "node": "w7"}), {"weight": torch.ones(2, 3)}, step=6)
        send_replica(RoleConfig(**{**cfg.__dict__, "node": "w1"}), {"weight": torch.ones(2, 3)}, step=7)  # w0's key
        _speak_as(hub, "ps", "ps")
        send_replica(cfg, {"weight": torch.ones(2, 3)}, step=8)  # a PS hands in no replica: the hub drops it
        got = board.wait_for({"w0": 4}, timeout=5)
        assert until(lambda: board.refresh() is not None and board.refused == 3)
        assert until(lambda: hub.drops == {"replica not its role's": 1})
        assert list(got) == ["w0"] and got["w0"]["step"] == 4
        assert torch.equal(got["w0"]["params"]["weight"], torch.ones(2, 3))
    finally:
        board.close()
        channel.flush()
        hub.close()


def test_a_supervisor_answers_the_hub_and_stops_by_itself_when_the_runner_goes(tmp_path):
    """A container's first process, run here as a plain process: it answers requests over the
    channel (with its own key, which its sender read and removed: the hub takes no answer of w0
    without it), and ends on its own once the runner's beats stop (a runner killed with -9)."""
    import subprocess
    import sys

    heartbeat_timeout = 4.0  # the supervisor's own (20 s) would make this test wait 20 s for the same path
    hub, up, down = _hub(tmp_path)
    keys = {channel_keys.ENV: hub.keys.of("w0").to_text()}  # (in a container: a file of its own)
    own = tmp_path / "supervisor.key"
    own.write_text(hub.keys.supervisor("w0").to_text())
    supervise = ("import sys; import testbed.node.supervisor as supervisor; "
                 f"supervisor.channel_keys.SUPERVISOR_KEY_FILE = {str(own)!r}; "
                 f"supervisor.HEARTBEAT_TIMEOUT = {heartbeat_timeout}; sys.exit(supervisor.main(sys.argv))")
    proc = subprocess.Popen([sys.executable, "-c", supervise, "--supervise", "w0", up, down],
                            env={**os.environ, **keys})
    try:
        assert hub.request("w0", {"op": "go", "idle": True}, timeout=30) == "idle"
        assert not own.exists() and not hub.drops
        # the answer to 'reboot' after a kill twice never came on a loaded CI machine: the killed stress
        # process had held the stop Event's lock (node.stop_flag, tests/node/test_stop_flag.py)
        assert hub.request("w0", {"op": "stress", "load": 0.1}, timeout=30).startswith("stress 0.1 cores in 1 ")
        assert hub.request("w0", {"op": "kill"}, timeout=30).startswith("killed")
        with pytest.raises(RuntimeError, match="w0: failed: unknown request 'reboot'"):  # a typed error
            hub.request("w0", {"op": "reboot"}, timeout=30)
        with pytest.raises(RuntimeError, match="failed: stress: load is not float"):
            hub.request("w0", {"op": "stress", "load": "all"}, timeout=30)
        hub.close()  # no more beats
        silent = time.monotonic()
        assert proc.wait(timeout=heartbeat_timeout + 15) == 0
        assert heartbeat_timeout - 1 < time.monotonic() - silent < heartbeat_timeout + 5
    finally:
        if proc.poll() is None:
            proc.kill()
        hub.close()
