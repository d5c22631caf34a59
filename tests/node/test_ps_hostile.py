"""The parameter server refuses a malformed push from one of its own workers and goes on."""
import threading
import time

import pytest
import torch
import zmq

from testbed.node.roles.common import RoleConfig
from testbed.node.roles.ps import ParameterServer
from testbed.node.wire import Message, decode, encode
from testbed.plan import parse_scenario
from testbed.records import metrics

pytestmark = pytest.mark.usefixtures("ps_port_free")


def _reply(sock, kinds=("model",), timeout=5.0) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.poll(100):
            msg = decode(sock.recv_multipart())
            if msg.kind in kinds:
                return msg
    raise AssertionError(f"no {kinds} within {timeout} s")


def test_a_bad_push_is_refused_answered_and_recorded(tmp_path):
    sc = parse_scenario({"runtime": "netns", "workload": {"model": "mlp", "dataset": "synthetic_cifar:100"},
                         "algorithm": {"name": "asgd"}, "workers": [{"count": 1}], "stop": {"steps": 10}})
    metrics.init_tables(tmp_path)
    cfg = RoleConfig(node="ps", role="ps", rank=-1, run_dir=str(tmp_path), t0=time.time(),
                     scenario=sc.model_dump(mode="json"), ps_address="127.0.0.1", threads=1, workers=["w0"])
    ps = ParameterServer(cfg, threading.Event())
    ctx = zmq.Context()
    w0 = ctx.socket(zmq.DEALER)
    w0.setsockopt(zmq.IDENTITY, b"w0")
    w0.connect("tcp://127.0.0.1:5555")
    try:
        w0.send_multipart(encode(Message("hello")))
        deadline = time.monotonic() + 5
        while not ps.members.joined and time.monotonic() < deadline:
            ps.serve(ps.ep.recv(0.1))
        model = _reply(w0)
        wrong = {name: torch.zeros(3) for name in model.tensors}  # the wrong shapes
        for bad in (Message("push", wrong, {"base_version": 0}), Message("push", model.tensors, {}),
                    Message("vote", meta={})):
            w0.send_multipart(encode(bad))
        good = Message("push", {n: torch.zeros_like(t) for n, t in model.tensors.items()}, {"base_version": 0})
        w0.send_multipart(encode(good))
        deadline = time.monotonic() + 5
        while ps.server.version < 1 and time.monotonic() < deadline:
            ps.serve(ps.ep.recv(0.1))
        assert ps.server.version == 1  # the good push applied after three bad messages
        assert ps.ep.dropped["refused"] == 3
        assert [m.kind for m in (_reply(w0), _reply(w0), _reply(w0))] == ["model"] * 3  # two refused pushes, one good
        events = (tmp_path / "events.csv").read_text().splitlines()
        assert sum("message_refused" in e for e in events) == 3 and all("w0" in e for e in events[1:])
        for _ in range(20):  # a worker that keeps sending garbage is lost, as a silent one would be
            w0.send_multipart(encode(Message("vote", meta={})))
        deadline = time.monotonic() + 5
        while "w0" not in ps.members.left and time.monotonic() < deadline:
            ps.serve(ps.ep.recv(0.1))
        assert "w0" in ps.members.left
        lost = [e for e in (tmp_path / "events.csv").read_text().splitlines() if ",lost," in e]
        assert len(lost) == 1 and "21 malformed messages" in lost[0]
    finally:
        w0.close(linger=0)
        ctx.term()
        ps.ep.close()
        ps.zctx.term()


def test_the_coordinator_reports_each_inbox_drops_and_ignores_a_bad_count(tmp_path):
    from testbed.node.roles.coordinator import Coordinator

    sc = parse_scenario({"runtime": "netns", "workload": {"model": "mlp", "dataset": "synthetic_cifar:100"},
                         "algorithm": {"name": "gaia"}, "workers": [{"count": 2}], "stop": {"steps": 10}})
    cfg = RoleConfig(node="ps", role="ps", rank=-1, run_dir=str(tmp_path), t0=time.time(),
                     scenario=sc.model_dump(mode="json"), ps_address="127.0.0.1", threads=1, workers=["w0", "w1"])
    co = Coordinator(cfg, threading.Event())
    try:
        co.ep.dropped["unknown sender"] = 2
        co.handle("w1", Message("progress", meta={"step": 5, "dropped": {"malformed": 7}}))
        co.handle("w0", Message("progress", meta={"step": 5, "dropped": {"malformed": "many"}}))  # not a count
        co.handle("w0", Message("progress", meta={"step": 6, "dropped": {f"r{i}": 1 for i in range(100)}}))
        co.handle("w1", Message("bye", meta={"step": 9, "dropped": {"malformed": 9, "unknown sender": 1}}))
        assert co.report()["messages_dropped"] == {"unknown sender": 2, "w1 inbox: malformed": 9,
                                                   "w1 inbox: unknown sender": 1}
    finally:
        co.ep.close()
        co.zctx.term()
