"""Parked per-round trainers (fedavg's `parked`): a trainer a round left out waits, the PS hands
it a later round that draws its device instead of asking the runner for a new one, and at most
`parked` wait, the longest parked told to end first."""
import json
import threading
import time

import pandas as pd
import pytest
import torch
import zmq

from testbed.node.roles.common import RoleConfig
from testbed.node.roles.parking import ParkedTrainers
from testbed.node.roles.ps import ParameterServer
from testbed.node.wire import Message, decode, encode
from testbed.plan import ScenarioError, parse_scenario
from testbed.records import metrics
from testbed.strategies import make_strategy

from helpers import _docker_or_skip, needs_root, run_up, write_scenario


def test_the_longest_parked_ends_first_past_the_capacity():
    parked = ParkedTrainers(2)
    assert parked.park("a") == [] and parked.park("b") == []
    assert parked.park("c") == ["a"]  # a parked longest: it ends, c waits
    assert parked.take("b") and not parked.take("b") and not parked.take("a")
    assert parked.park("d") == [] and list(parked.waiting) == ["c", "d"]
    assert parked.park("c") == [] and list(parked.waiting) == ["d", "c"]  # parked again: the newest
    assert parked.report() == {"parked": 5, "handed a round": 0, "ended to make room": 1, "gone when handed": 0,
                               "capacity": 2, "waiting at the end": 2}


def test_with_no_room_a_trainer_left_out_ends():
    parked = ParkedTrainers(0)
    assert parked.park("a") == ["a"] and not parked.waiting and not parked.take("a")


def test_parked_needs_per_round_trainers_and_counts_in_what_memory_holds():
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"algorithm": {"name": "fedavg", "params": {"parked": 5}}})
    assert len(e.value.lines) == 1 and "parked: only with trainers: per_round" in e.value.lines[0]
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"algorithm": {"name": "fedavg", "params": {"trainers": "per_round", "deadline_s": 5,
                                                                  "parked": -1}}})
    assert len(e.value.lines) == 1 and "parked" in e.value.lines[0]
    s = make_strategy("fedavg", {"clients": 10, "trainers": "per_round", "deadline_s": 5, "parked": 30})
    assert s.parked == 30 and s.trainers_at_once(1000) == 20 and s.trainers_alive(1000) == 50
    assert s.trainers_alive(40) == 40  # never more than the devices
    assert make_strategy("fedavg", {"clients": 10, "trainers": "per_round", "deadline_s": 5}).trainers_alive(1000) == 20


def _next(sock, timeout=5.0) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.poll(100):
            return decode(sock.recv_multipart())
    raise AssertionError(f"nothing within {timeout} s")


def test_the_ps_hands_a_parked_trainer_its_round_and_asks_the_runner_for_the_others(tmp_path, monkeypatch,
                                                                                   ps_port_free):
    """Three devices, one client a round, one parked at most; rounds draw w0, w1, w0, w2: w0's
    trainer waits through round 1 and is handed round 2 (no request to the runner), then w1,
    parked since round 1, is told to end as w0 parks again after round 2."""
    sc = parse_scenario({"runtime": "netns", "workload": {"model": "mlp", "dataset": "synthetic_cifar:100"},
                         "algorithm": {"name": "fedavg", "params": {"period": 1, "clients": 1, "deadline_s": 30,
                                                                    "trainers": "per_round", "parked": 1}},
                         "workers": [{"count": 3}], "stop": {"steps": 10}})
    metrics.init_tables(tmp_path)
    cfg = RoleConfig(node="ps", role="ps", rank=-1, run_dir=str(tmp_path), t0=time.time(),
                     scenario=sc.model_dump(mode="json"), ps_address="127.0.0.1", threads=1,
                     workers=["w0", "w1", "w2"])
    asked: list[str] = []  # the devices the PS asks the runner to start a trainer for

    def requests(address, kind, data):
        if data.get("action") == "train":
            asked.append(data["node"])

    monkeypatch.setattr("testbed.node.roles.ps.channel.send_json", requests)
    ps = ParameterServer(cfg, threading.Event())
    draws = ["w0", "w1", "w0", "w2", "w1"]
    ps.strategy.choose = lambda round_, online: frozenset([draws[round_]])
    ctx = zmq.Context()
    socks = {}
    for w in ("w0", "w1", "w2"):
        socks[w] = ctx.socket(zmq.DEALER)
        socks[w].setsockopt(zmq.IDENTITY, w.encode())
        socks[w].connect("tcp://127.0.0.1:5555")

    def serve_until(done, timeout=5.0):
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            ps.serve(ps.ep.recv(0.05))
        assert done()

    def push(w):
        zeros = {n: torch.zeros_like(t) for n, t in ps.server.params.items()}
        version = ps.server.version
        socks[w].send_multipart(encode(Message("push", zeros, {"base_version": version, "step": 1,
                                                               "batch_size": 32, "loss": 1.0})))
        serve_until(lambda: ps.server.version == version + 1)

    try:
        ps.tend()  # round 0 opens on a tick: the runner is asked for w0's trainer
        assert asked == ["w0"]
        socks["w0"].send_multipart(encode(Message("hello")))
        serve_until(lambda: socks["w0"].poll(0))
        m = _next(socks["w0"])
        assert m.kind == "model" and m.meta["selected"] is True and "park" not in m.meta
        push("w0")  # round 1 draws w1: the runner is asked for it, w0 parks
        assert asked == ["w0", "w1"]
        m = _next(socks["w0"])
        assert m.meta["version"] == 1 and m.meta["selected"] is False and m.meta["park"] is True
        socks["w1"].send_multipart(encode(Message("hello")))
        serve_until(lambda: socks["w1"].poll(0))
        assert _next(socks["w1"]).meta["selected"] is True
        push("w1")  # round 2 draws w0: handed to its parked trainer, no request
        assert asked == ["w0", "w1"]
        m = _next(socks["w0"])
        assert m.kind == "model" and m.meta["version"] == 2 and m.meta["selected"] is True
        m = _next(socks["w1"])
        assert m.meta["selected"] is False and m.meta["park"] is True
        push("w0")  # round 3 draws w2 (asked for); w0 parks again and w1, parked longer, must end
        assert asked == ["w0", "w1", "w2"]
        assert _next(socks["w1"]).kind == "stop"
        m = _next(socks["w0"])
        assert m.meta["version"] == 3 and m.meta["park"] is True
        assert ps.report()["parked_trainers"] == {"parked": 3, "handed a round": 1, "ended to make room": 1,
                                                  "gone when handed": 0, "capacity": 1, "waiting at the end": 1}
        socks["w0"].close(linger=0)  # w0's trainer dies (its device went offline: killed)
        time.sleep(0.3)
        ps.serve(ps.ep.recv(0.05))
        socks["w2"].send_multipart(encode(Message("hello")))
        serve_until(lambda: socks["w2"].poll(0))
        _next(socks["w2"])
        draws[4] = "w0"
        push("w2")  # round 4 draws w0, whose parked trainer is gone: the runner is asked for a new one
        assert asked == ["w0", "w1", "w2", "w0"]
        assert ps.parked is not None and ps.parked.counts["gone when handed"] == 1
    finally:
        for s in socks.values():
            s.close(linger=0)
        ctx.term()
        ps.ep.close()
        ps.zctx.term()


@needs_root
@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_a_fleet_with_parked_trainers_starts_each_device_once_and_trains(tmp_path, clean_host, runtime):
    """6 devices, 2 a round, every trainer may park: after a device's first round its trainer is
    handed each later round that draws it (the runner starts at most one trainer a device), only a
    round's clients train on its model, and the model learns. Docker: the trainer is a role its
    container's supervisor keeps while it waits."""
    if runtime == "docker":
        _docker_or_skip()
    data = {"name": "parked", "seed": 1, "runtime": runtime,
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_seconds": 2},
            "stop": {"seconds": 20 if runtime == "netns" else 30},
            "algorithm": {"name": "fedavg", "params": {"period": 4, "clients": 2, "deadline_s": 4,
                                                       "trainers": "per_round", "parked": 6}},
            "profiles": {"edge": {"cpus": 0.3, "bandwidth": "100mbit"}}, "workers": [{"count": 6, "profile": "edge"}]}
    run_dir = tmp_path / "run"
    run_up(write_scenario(tmp_path, data), run_dir, "-q", timeout=200)
    summary = json.loads((run_dir / "summary.json").read_text())
    # docker: a device's first trainer imports torch in its container (seconds at 0.3 of a core,
    # against the 4-s deadline: those rounds close empty, test_dynamics_run); netns ones fork warm
    assert summary["status"] == "completed" and summary["final_accuracy"] > (0.6 if runtime == "netns" else 0.2), \
        summary
    rounds = pd.read_csv(run_dir / "rounds.csv", keep_default_na=False)
    selected = {int(r): set(s.split()) for r, s in zip(rounds["round"], rounds.selected)}
    drawn = sum(len(s) for s in selected.values())
    trainers, parked = summary["trainers"], summary["trainers"]["parked"]
    # one start a device, and the last rounds' asks that reach the runner after the stop ended
    # their trainers (each a start that trains nothing)
    assert len(rounds) >= 8 and trainers["started"] <= 6 + 2 * 2 and trainers["failed"] == 0, (len(rounds), trainers)
    # a draw is a parked trainer handed its round, one still running (drawn twice in a row), or a
    # device's first start; the last round may be cut
    handed = parked["handed a round"]
    assert handed + trainers["running already"] + trainers["started"] >= drawn - 2 and handed >= drawn / 3, \
        (drawn, trainers)
    assert parked["ended to make room"] == 0 and parked["gone when handed"] == 0, parked
    assert parked["capacity"] == 6
    steps = pd.read_csv(run_dir / "steps.csv")
    firsts = steps[steps.step == 1].node  # a trainer's steps count from 1: one trainer a device trained
    assert firsts.is_unique and len(firsts) <= 6, firsts.tolist()
    for version, nodes in steps.groupby("model_version").node:  # a parked trainer trains only when drawn
        if int(version) in selected:
            assert set(nodes) <= selected[int(version)], (version, set(nodes), selected[int(version)])
