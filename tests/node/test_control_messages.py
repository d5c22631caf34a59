"""The control channel's typed messages (testbed/node/control.py): every request the runner can
send reads back as itself, anything else is refused with a reason, the supervisor has one
handler per request type, and a failure is a typed reply whose wire form the hub still reads."""

from __future__ import annotations

import time

import pytest

from testbed.node import control
from testbed.node.supervisor import RoleSupervisor
from testbed.node.untrusted import Refused

EXAMPLES = [
    control.Go(cfg={"node": "w0"}, stress=[0.5, 0.5], gen=1, cpuset="0-1"), control.Go(idle=True),
    control.Start(cfg={"node": "w0"}, gen=2), control.Kill(), control.Pause(), control.Resume(), control.Stress(0.25),
    control.Exec("m:f", {"n": 1}, "/slot/exit"), control.Counters(), control.Clock(), control.Kernel(),
    control.Shape("10.0.0.2", {"rate_bps": 1e6}, {}, None), control.Reshape("up", {}, {"rate_bps": 2e6}),
    control.Cut(["10.0.0.3"], True), control.Route("10.1.0.1", [{"peer": "b"}], {"10.2.0.0/24": "10.9.0.2"}),
    control.ReshapeWan("b", {}, {}), control.WanCounters(),
    control.Replay({"up": {"rates": [1000000], "resolution": 0.1, "loop": True, "offset": 0.0}}, 12.5),
]


def test_every_request_type_has_an_example_and_a_handler():
    assert {type(r) for r in EXAMPLES} == set(control.REQUESTS.values())
    assert set(RoleSupervisor.HANDLERS) == set(control.REQUESTS.values())  # one table, nothing left out


@pytest.mark.parametrize("req", EXAMPLES, ids=lambda r: r.op)
def test_a_request_reads_back_as_itself(req):
    wire = req.to_wire()
    assert wire["op"] == req.op
    assert control.parse_request(dict(wire)) == req


@pytest.mark.parametrize("data,reason", [
    ({"op": "reboot"}, "unknown request 'reboot'"),
    ({}, "unknown request None"),
    ({"op": "stress"}, "stress: load missing"),
    ({"op": "stress", "load": "all"}, "stress: load is not float"),
    ({"op": "stress", "load": True}, "stress: load is not float"),  # a bool is no number
    ({"op": "kill", "pid": 1}, "kill: unknown field 'pid'"),
    ({"op": "cut", "addresses": ["a", 3], "cut": True}, "cut: addresses is not list"),
    ({"op": "cut", "addresses": [], "cut": 1}, "cut: cut is not bool"),
    ({"op": "go", "gen": 1.5}, "go: gen is not"),
    ({"op": "exec", "target": "m:f", "kwargs": [], "done": "x"}, "exec: kwargs is not dict"),
])
def test_a_malformed_request_is_refused_with_its_reason(data, reason):
    with pytest.raises(Refused) as ei:
        control.parse_request(data)
    assert ei.value.reason.startswith(reason)


def test_an_integer_is_a_float_field_and_none_an_optional_one():
    assert control.parse_request({"op": "stress", "load": 2}) == control.Stress(2)
    assert control.parse_request({"op": "go", "cfg": None, "gen": None}) == control.Go()


def test_a_reply_on_the_wire():
    ok, bad = control.Reply(True, "idle"), control.Reply.failed("KeyError: 'x'")
    assert ok.to_wire() == {"ok": True, "detail": "idle"}
    assert bad.to_wire() == {"ok": False, "detail": "failed: KeyError: 'x'", "error": "KeyError: 'x'"}
    assert control.Reply.from_wire(bad.to_wire()) == bad and control.Reply.from_wire(ok.to_wire()) == ok
    assert control.Reply.from_wire({"detail": "failed: old node"}) == control.Reply.failed("old node")


def _bare_supervisor() -> RoleSupervisor:
    sup = RoleSupervisor.__new__(RoleSupervisor)  # no channel: only the handling of requests
    sup.link = sup.router = sup.role = None
    sup.stress, sup._reap = [], []
    return sup


def test_the_supervisor_answers_each_request_with_a_typed_reply():
    sup = _bare_supervisor()
    clock = sup._handle({"op": "clock"})
    assert clock.ok and abs(float(clock.detail) - time.time()) < 5
    assert sup._handle({"op": "reboot"}) == control.Reply.failed("unknown request 'reboot'")
    assert sup._handle({"op": "counters"}) == control.Reply.failed(
        "RunFailed: counters before the node's link was shaped")
    assert sup._handle({"op": "wan_counters"}).error == "RunFailed: wan_counters before the node was made a router"
    assert sup._handle({"op": "go", "idle": True}) == control.Reply(True, "idle")
    assert sup._handle({"op": "pause"}) == control.Reply(True, "paused 0 process group(s)")
    assert sup._handle({"op": "start", "gen": 2}) == control.Reply.failed("ValueError: start without a cfg")


def test_a_role_config_crosses_as_json_and_as_a_pickle_with_its_parts_typed():
    """RoleConfig reaches a container as JSON (dataclasses.asdict, docker and swarm) and a netns
    node as a pickle: both ways its delay, peers and stream come back as the same dataclasses."""
    import json
    import pickle
    from dataclasses import asdict

    from testbed.node.roles.common import PeerLink, RateTrace, RoleConfig, StreamConfig
    from testbed.node.transport import DelaySpec

    stream = {"bootstrap": "10.0.0.9:9092", "kind": "tansu", "topics": {"w0": "t0"}, "rates": {"w0": 50.0},
              "schedules": {"w0": {"times": [0.0, 5.0], "rates": [50.0, 20.0]}}}
    cfg = RoleConfig(node="w0", role="worker", rank=0, run_dir="/r", t0=1.0, scenario={}, ps_address="10.0.0.2",
                     threads=1, peers={"w1": {"address": "10.0.0.4", "rate_bps": 2e7, "same_site": False}},
                     stream=stream)
    assert cfg.peers["w1"] == PeerLink("10.0.0.4", 2e7, False)
    assert cfg.stream.schedules["w0"] == RateTrace([0.0, 5.0], [50.0, 20.0])
    assert isinstance(cfg.stream, StreamConfig) and cfg.stream.topics == {"w0": "t0"}
    again = RoleConfig(**json.loads(json.dumps(asdict(cfg))))
    assert again == cfg and isinstance(again.delay, DelaySpec)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert RoleConfig(**{**asdict(cfg), "stream": {}, "peers": {}}).stream is None  # not streaming
