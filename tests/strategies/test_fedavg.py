"""FedAvg with client selection (testbed/strategies/fedavg.py): K of the online clients, over-selection,
the first K reports, a deadline, and the round records the PS writes to rounds.csv."""

from __future__ import annotations

import pytest
import torch

from testbed.node.roles.ps import round_row
from testbed.plan import parse_scenario
from testbed.records.columns import ROUND_COLUMNS
from testbed.scenario.schema import ScenarioError
from testbed.strategies import ServerState, WorkerContext, make_strategy
from testbed.strategies.fedavg import FedAvg, select

WORKERS = ["w0", "w1", "w2", "w3", "w4"]


def _zeros() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(2, 2), "b": torch.zeros(2)}


def _ps(**params):
    srv = ServerState(params=_zeros(), lr=1.0, n_workers=len(WORKERS), workers=list(WORKERS))
    return srv, make_strategy("fedavg", params, seed=3)


def _selection(srv, ps) -> tuple[list[str], list[str]]:
    """(selected, not selected) of the round now open, as the models the PS sends say."""
    flags = {w: ps.server_reply_meta(srv, w)["selected"] for w in WORKERS}
    return sorted(w for w in WORKERS if flags[w]), sorted(w for w in WORKERS if not flags[w])


def _grad(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2, 2), value), "b": torch.full((2,), value)}


def test_select_draws_ceil_over_selection_k_of_the_online_from_seed_and_round():
    online = [f"w{i}" for i in range(10)]
    assert len(select(0, online, 4, 1.3)) == 6  # ceil(5.2)
    assert len(select(0, online, 4, 1.0)) == 4 and len(select(0, online, 4, 1.25)) == 5
    assert select(5, online, 4, 1.3, seed=1) == select(5, list(reversed(online)), 4, 1.3, seed=1)
    assert select(0, online[:3], 4, 1.3) == frozenset(online[:3])  # fewer online than wanted: all of them
    assert select(0, online, 4, 1.0) <= frozenset(online)
    assert len({select(r, online, 4, 1.0) for r in range(20)}) > 1
    assert [select(r, online, 4, 1.0, seed=1) for r in range(10)] != [select(r, online, 4, 1.0, seed=2)
                                                                       for r in range(10)]


def test_the_first_k_reports_close_the_round_and_the_over_selected_late_one_is_dropped():
    srv, ps = _ps(period=1, clients=2, over_selection=1.5)
    chosen, idle = _selection(srv, ps)
    assert len(chosen) == 3 and len(idle) == 2  # ceil(1.5 x 2) of 5
    for w in idle:  # the unselected check in and idle
        assert ps.server_on_push(srv, w, {}, base_version=0) == []
    assert ps.server_on_push(srv, chosen[0], _grad(1.0), base_version=0) == []
    assert ps.round_open()
    answered = ps.server_on_push(srv, chosen[1], _grad(3.0), base_version=0)
    assert answered == sorted(chosen[:2] + idle) and srv.version == 1
    assert torch.equal(srv.params["b"], torch.full((2,), -2.0))  # the mean of the first two, lr 1
    assert sorted(w for w, _, _ in srv.log) == sorted(chosen[:2])
    row = srv.rounds.pop()
    assert row["round"] == 0 and row["reason"] == "reports" and row["online"] == WORKERS
    assert row["selected"] == chosen and row["finished"] == sorted(chosen[:2]) and row["dropped"] == [chosen[2]]
    # the third selected reports after the round closed: answered with the model, its update dropped
    before = srv.params["b"].clone()
    assert ps.server_on_push(srv, chosen[2], _grad(100.0), base_version=0) == [chosen[2]]
    assert srv.version == 1 and torch.equal(srv.params["b"], before) and not srv.rounds


def test_workers_learn_the_draw_from_the_model_and_only_the_selected_train():
    srv, ps = _ps(period=3, clients=2)
    chosen, idle = _selection(srv, ps)
    gen = torch.Generator().manual_seed(0)
    for w in WORKERS:
        worker = make_strategy("fedavg", {"period": 3, "clients": 2}, seed=3)
        worker.worker_on_model({"version": 0, **ps.server_reply_meta(srv, w)})
        ctx = WorkerContext(worker=w, rank=WORKERS.index(w), step=1, base_version=0, lr=0.1, n_workers=5)
        g = {"w": torch.randn(2, 2, generator=gen), "b": torch.randn(2, generator=gen)}
        if w in idle:
            assert worker.worker_payload(g, ctx) == {}  # sits out at once
            continue
        total = {k: v.clone() for k, v in g.items()}
        assert worker.worker_payload(g, ctx) is None  # a local step
        assert worker.worker_payload(g, ctx) is None
        out = worker.worker_payload(g, ctx)
        torch.testing.assert_close(out["b"], 3 * total["b"])  # the sum of its 3 steps
    # a worker never told it is selected (an older PS, a lost meta) does not train
    worker = make_strategy("fedavg", {"clients": 2})
    assert worker.worker_payload(_grad(1.0), WorkerContext("w0", 0, 1, 0, 0.1, n_workers=5)) == {}


def test_a_push_that_contradicts_the_draw_is_refused():
    srv, ps = _ps(period=1, clients=2)
    chosen, idle = _selection(srv, ps)
    with pytest.raises(RuntimeError, match="not selected"):
        ps.server_on_push(srv, idle[0], _grad(1.0), base_version=0)
    with pytest.raises(RuntimeError, match="sat out"):
        ps.server_on_push(srv, chosen[0], {}, base_version=0)


def test_the_deadline_closes_the_round_with_the_reports_it_has():
    srv, ps = _ps(period=1, clients=3, deadline_s=10.0)
    chosen, idle = _selection(srv, ps)
    opened = ps._open.opened
    assert ps.server_on_push(srv, chosen[0], _grad(2.0), base_version=0) == []
    assert ps.server_on_push(srv, idle[0], {}, base_version=0) == []
    assert ps.server_on_tick(srv, opened + 9.0) == [] and srv.version == 0
    assert ps.server_on_tick(srv, opened + 10.5) == sorted([chosen[0], idle[0]])
    assert srv.version == 1 and torch.equal(srv.params["b"], torch.full((2,), -2.0))
    row = srv.rounds.pop()
    assert row["reason"] == "deadline" and row["finished"] == [chosen[0]] and row["dropped"] == chosen[1:]
    assert ps.report() == {"rounds_closed": {"deadline": 1}}


def test_a_round_with_too_few_reports_at_its_deadline_is_abandoned():
    srv, ps = _ps(period=1, clients=3, deadline_s=5.0, min_reports=2)
    chosen, _ = _selection(srv, ps)
    opened = ps._open.opened
    assert ps.server_on_push(srv, chosen[0], _grad(2.0), base_version=0) == []
    assert ps.server_on_tick(srv, opened + 6.0) == [chosen[0]]  # answered, its update not applied
    assert srv.version == 1 and torch.equal(srv.params["b"], torch.zeros(2)) and not srv.log
    row = srv.rounds.pop()
    assert row["reason"] == "abandoned at deadline" and row["finished"] == [] and row["dropped"] == chosen
    # the next round opened when the last closed, and its own deadline counts from then
    assert ps._open.number == 1 and ps.server_on_tick(srv, ps._open.opened + 1.0) == []


def test_no_deadline_means_the_round_waits_and_ticks_do_nothing():
    srv, ps = _ps(period=1, clients=2)
    assert ps.server_on_tick(srv, 1e12) == []  # no round opened yet either
    chosen, _ = _selection(srv, ps)
    ps.server_on_push(srv, chosen[0], _grad(1.0), base_version=0)
    assert ps.server_on_tick(srv, 1e12) == [] and srv.version == 0


def test_a_selected_client_that_leaves_does_not_hold_the_round_and_is_not_drawn_again_until_back():
    srv, ps = _ps(period=1, clients=2)
    chosen, idle = _selection(srv, ps)
    assert ps.server_on_push(srv, chosen[0], _grad(1.0), base_version=0) == []
    assert ps.server_on_leave(srv, chosen[1]) == [chosen[0]]  # one alive selected left: its report is enough
    assert srv.version == 1 and srv.rounds.pop()["dropped"] == [chosen[1]]
    drawn = []
    for r in range(1, 31):  # gone (not online, never drawn); back during round 10, online from round 11
        if r == 10:
            ps.server_on_join(srv, chosen[1])
        sel, _ = _selection(srv, ps)
        assert (chosen[1] in ps._open.online) == (r >= 11)
        drawn.append(chosen[1] in sel)
        for w in sel:
            ps.server_on_push(srv, w, _grad(1.0), base_version=srv.version)
    assert not any(drawn[:10]) and any(drawn[10:]) and srv.version == 31


def test_every_selected_client_gone_closes_the_round_with_no_update():
    srv, ps = _ps(period=1, clients=2)
    chosen, idle = _selection(srv, ps)
    assert ps.server_on_push(srv, idle[0], {}, base_version=0) == []
    assert ps.server_on_leave(srv, chosen[0]) == []
    assert ps.server_on_leave(srv, chosen[1]) == [idle[0]]
    assert srv.version == 1 and torch.equal(srv.params["b"], torch.zeros(2))
    assert srv.rounds.pop()["reason"] == "no selected client left"


def test_a_round_records_when_each_report_came_after_it_opened(monkeypatch):
    import types

    import testbed.strategies.fedavg as fedavg

    now = [100.0]
    monkeypatch.setattr(fedavg, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    srv, ps = _ps(period=1, clients=2)
    chosen, _ = _selection(srv, ps)  # the round opens at 100
    now[0] = 101.5
    ps.server_on_push(srv, chosen[1], _grad(1.0), base_version=0)
    now[0] = 103.0
    ps.server_on_push(srv, chosen[0], _grad(1.0), base_version=0)
    row = srv.rounds.pop()
    assert row["open_seconds"] == 3.0 and row["finished"] == chosen
    assert dict(zip(row["finished"], row["report_seconds"])) == {chosen[1]: 1.5, chosen[0]: 3.0}


def test_a_round_row_for_rounds_csv():
    row = round_row({"round": 4, "reason": "reports", "open_seconds": 1.5, "online": ["w0", "w1", "w2"],
                     "selected": ["w0", "w2"], "finished": ["w2"], "dropped": ["w0"], "report_seconds": [1.2345]})
    assert row == {"round": 4, "reason": "reports", "open_seconds": 1.5, "n_online": 3, "n_selected": 2,
                   "n_finished": 1, "n_dropped": 1, "online": "w0 w1 w2", "selected": "w0 w2", "finished": "w2",
                   "dropped": "w0", "report_seconds": "1.234"}
    assert list(row) == ROUND_COLUMNS[1:]  # every column but the time, which the PS adds


@pytest.mark.parametrize("params, field", [({"over_selection": 0.9}, "over_selection"), ({"clients": 0}, "clients"),
                                           ({"deadline_s": 0}, "deadline_s"), ({"fraction": 0.5}, "fraction")])
def test_bad_parameters_are_one_line_naming_the_field(params, field):
    with pytest.raises(ScenarioError, match=field):
        parse_scenario({"algorithm": {"name": "fedavg", "params": params}})


class Alphabetical(FedAvg):
    """A plugin's selection: the first K online by name, plus a worker that is not online."""

    def choose(self, round_, online):
        return frozenset(sorted(online)[:self.params.clients]) | {"nobody"}


def test_a_subclass_chooses_the_clients_and_cannot_pick_one_offline():
    srv = ServerState(params=_zeros(), lr=1.0, n_workers=len(WORKERS), workers=list(WORKERS))
    ps = Alphabetical({"period": 1, "clients": 2})
    assert _selection(srv, ps)[0] == ["w0", "w1"] and ps._open.selected == {"w0", "w1"}
    ps.server_on_leave(srv, "w0")
    ps.server_on_push(srv, "w1", _grad(1.0), base_version=0)
    assert srv.version == 1 and _selection(srv, ps)[0] == ["w1", "w2"]


def test_per_round_trainers_open_round_0_on_a_tick_and_ask_for_the_selected_only():
    srv, ps = _ps(period=1, clients=2, deadline_s=5.0, trainers="per_round")
    assert ps.per_round and srv.starts == []
    srv.offline = {"w0", "w1"}  # these devices are offline: never drawn while so
    assert ps.server_on_tick(srv, 0.0) == []  # no trainer runs yet to say hello: the tick opens round 0
    assert len(srv.starts) == 2 and not set(srv.starts) & srv.offline
    chosen = sorted(srv.starts)
    del srv.starts[:]
    assert ps.server_on_push(srv, chosen[0], _grad(1.0), base_version=0) == []
    answered = ps.server_on_push(srv, chosen[1], _grad(1.0), base_version=0)
    assert answered == chosen and srv.version == 1
    assert sorted(srv.starts) == sorted(ps._current(srv).selected)  # the next round asks for its own


def test_a_per_round_trainer_parks_on_a_model_whose_round_did_not_select_it():
    worker = make_strategy("fedavg", {"deadline_s": 5.0, "trainers": "per_round"}, seed=3)
    worker.worker_on_model({"version": 4, "selected": True})
    assert not worker.worker_parks(4)
    worker.worker_on_model({"version": 5, "selected": False})
    assert worker.worker_parks(5)
    always = make_strategy("fedavg", {}, seed=3)
    always.worker_on_model({"version": 5, "selected": False})
    assert not always.worker_parks(5)  # always-on trainers check in and idle instead


def test_per_round_trainers_without_a_deadline_are_one_line_naming_both_fields():
    with pytest.raises(ScenarioError) as e:
        parse_scenario({"algorithm": {"name": "fedavg", "params": {"trainers": "per_round"}}})
    assert len(e.value.lines) == 1 and "trainers: per_round needs deadline_s" in e.value.lines[0]
