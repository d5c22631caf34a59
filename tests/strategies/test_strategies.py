"""Tests for testbed.strategies: BSP barrier and averaging, local SGD's client fraction (FedAvg's C),
ASGD staleness-scaled updates."""

from __future__ import annotations

import pytest
import torch

from testbed.plan import parse_scenario
from testbed.scenario.schema import ScenarioError
from testbed.strategies import ServerState, StrategyError, WorkerContext, get_strategy_class, make_strategy, strategies
from testbed.strategies.asgd import ASGD, staleness_lr
from testbed.strategies.bsp import BSP, average
from testbed.strategies.local_sgd import participants


def _params() -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64),
            "b": torch.tensor([0.5, -0.5], dtype=torch.float64)}


def _grad(scale: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([[1.0, -1.0], [2.0, 0.0]], dtype=torch.float64) * scale,
            "b": torch.tensor([4.0, 8.0], dtype=torch.float64) * scale}


def _clone(ts):
    return {k: v.clone() for k, v in ts.items()}


# --------------------------------------------------------------------------- registry


def test_registry():
    assert {"bsp", "asgd", "ssp", "local_sgd", "comp_asgd", "adacomp"} <= set(strategies())
    assert get_strategy_class("bsp") is BSP and get_strategy_class("asgd") is ASGD
    assert BSP.synchronous and not ASGD.synchronous
    assert isinstance(make_strategy("asgd"), ASGD)


def test_unknown_strategy_lists_known_names():
    with pytest.raises(StrategyError) as ei:
        get_strategy_class("nope")
    msg = str(ei.value)
    assert "unknown algorithm 'nope'" in msg and "known: adacomp, adsp, ako, asgd, bsp" in msg
    with pytest.raises(StrategyError):
        make_strategy("nope")


def test_params_are_validated():
    with pytest.raises(ValueError):
        make_strategy("bsp", {"foo": 1})


def test_default_worker_payload_is_the_gradients():
    g = _grad(1.0)
    ctx = WorkerContext(worker="w0", rank=0, step=3, base_version=2, lr=0.1)
    assert make_strategy("bsp").worker_payload(g, ctx) is g
    assert make_strategy("asgd").worker_payload(g, ctx) is g


def test_server_state_apply():
    s = ServerState(params=_params(), lr=0.1, n_workers=1)
    s.apply({"w": torch.ones(2, 2, dtype=torch.float32)}, 0.5)  # only the tensors present
    assert torch.equal(s.params["w"], torch.tensor([[0.5, 1.5], [2.5, 3.5]], dtype=torch.float64))
    assert s.params["w"].dtype == torch.float64
    assert torch.equal(s.params["b"], _params()["b"])
    assert s.version == 1


def test_average():
    out = average([_grad(1.0), _grad(2.0), _grad(6.0)])
    torch.testing.assert_close(out["w"], (_grad(3.0)["w"]).float())
    assert out["b"].dtype == torch.float32


# --------------------------------------------------------------------------- BSP


def test_bsp_barrier_and_mean():
    lr = 0.25
    s = ServerState(params=_params(), lr=lr, n_workers=3)
    bsp = BSP()
    old = _clone(s.params)
    grads = {"w0": _grad(1.0), "w1": _grad(2.0), "w2": _grad(-6.0)}

    assert bsp.server_on_push(s, "w1", grads["w1"], base_version=0) == []
    assert bsp.server_on_push(s, "w0", grads["w0"], base_version=0) == []
    # nothing applied before the last push
    assert s.version == 0 and s.log == []
    for k in old:
        assert torch.equal(s.params[k], old[k])

    answered = bsp.server_on_push(s, "w2", grads["w2"], base_version=0)
    assert answered == ["w0", "w1", "w2"]
    assert s.version == 1
    mean = {k: (grads["w0"][k] + grads["w1"][k] + grads["w2"][k]) / 3 for k in old}  # = _grad(-1)
    for k in old:
        torch.testing.assert_close(s.params[k], old[k] - lr * mean[k])
    assert torch.equal(s.params["b"], torch.tensor([1.5, 1.5], dtype=torch.float64))  # 0.5 + 0.25*4, -0.5 + 0.25*8
    assert sorted(s.log) == [("w0", 0, lr), ("w1", 0, lr), ("w2", 0, lr)]

    # the barrier resets: the next step needs all three again
    assert bsp.server_on_push(s, "w0", grads["w0"], base_version=1) == []
    assert bsp.server_on_push(s, "w2", grads["w0"], base_version=1) == []
    assert s.version == 1
    assert bsp.server_on_push(s, "w1", grads["w0"], base_version=1) == ["w0", "w1", "w2"]
    assert s.version == 2
    for k in old:
        torch.testing.assert_close(s.params[k], old[k] - lr * mean[k] - lr * grads["w0"][k])


def test_bsp_double_push_raises():
    s = ServerState(params=_params(), lr=0.1, n_workers=3)
    bsp = BSP()
    bsp.server_on_push(s, "w0", _grad(1.0), base_version=0)
    with pytest.raises(RuntimeError, match="w0 pushed twice"):
        bsp.server_on_push(s, "w0", _grad(1.0), base_version=0)
    assert s.version == 0


def test_bsp_leave_completes_barrier():
    lr = 0.5
    s = ServerState(params=_params(), lr=lr, n_workers=3)
    bsp = BSP()
    old = _clone(s.params)
    assert bsp.server_on_push(s, "w0", _grad(1.0), base_version=0) == []
    assert bsp.server_on_push(s, "w2", _grad(3.0), base_version=0) == []
    answered = bsp.server_on_leave(s, "w1")
    assert answered == ["w0", "w2"]
    assert s.version == 1
    for k in old:  # mean of the two that pushed
        torch.testing.assert_close(s.params[k], old[k] - lr * _grad(2.0)[k])
    # later steps need only the two remaining workers
    assert bsp.server_on_push(s, "w2", _grad(1.0), base_version=1) == []
    assert bsp.server_on_push(s, "w0", _grad(1.0), base_version=1) == ["w0", "w2"]
    assert s.version == 2


def test_bsp_leave_drops_pending_push_of_leaver():
    s = ServerState(params=_params(), lr=1.0, n_workers=3)
    bsp = BSP()
    old = _clone(s.params)
    bsp.server_on_push(s, "w0", _grad(1.0), base_version=0)
    bsp.server_on_push(s, "w1", _grad(100.0), base_version=0)
    assert bsp.server_on_leave(s, "w1") == []  # w1's push is dropped; w2 still missing
    assert s.version == 0
    assert bsp.server_on_push(s, "w2", _grad(3.0), base_version=0) == ["w0", "w2"]
    for k in old:
        torch.testing.assert_close(s.params[k], old[k] - _grad(2.0)[k])


def test_bsp_leave_with_nothing_pending_answers_nobody():
    s = ServerState(params=_params(), lr=1.0, n_workers=2)
    bsp = BSP()
    assert bsp.server_on_leave(s, "w0") == []
    assert s.version == 0


# --------------------------------------------------------------------------- local SGD: FedAvg's client fraction C

WORKERS = ["w0", "w1", "w2", "w3"]


def _zeros() -> dict[str, torch.Tensor]:
    return {"w": torch.zeros(2, 2), "b": torch.zeros(2)}


def _fedavg_round(strategies: dict, round_: int, period: int, gen: torch.Generator):
    """Each worker's strategy through one round that starts from model version `round_`:
    (what each pushes, the sum of the gradients it computed, how many steps it took)."""
    pushes, sums, steps = {}, {}, {}
    for rank, (w, strat) in enumerate(strategies.items()):
        total, out, h = _zeros(), None, 0
        while out is None:
            h += 1
            g = {k: torch.randn(v.shape, generator=gen) for k, v in total.items()}
            total = {k: total[k] + g[k] for k in total}
            out = strat.worker_payload(g, WorkerContext(worker=w, rank=rank, step=round_ * period + h,
                                                        base_version=round_, lr=0.1, n_workers=len(strategies)))
        pushes[w], sums[w], steps[w] = out, total, h
    return pushes, sums, steps


def test_local_sgd_participants_are_a_deterministic_fraction():
    assert all(len(participants(r, 4, 0.5)) == 2 for r in range(20))
    assert len(participants(0, 3, 0.1)) == 1 and participants(0, 3, 1.0) == {0, 1, 2}
    assert participants(7, 10, 0.3) == participants(7, 10, 0.3)  # the PS and the workers draw alike
    assert len({participants(r, 4, 0.5) for r in range(20)}) > 1
    # the run's seed changes the sequence of sets (each seed of a reproduction draws its own)
    assert [participants(r, 8, 0.5, seed=1) for r in range(10)] != [participants(r, 8, 0.5, seed=2) for r in range(10)]


def test_local_sgd_fraction_half_averages_only_the_selected_workers():
    """N = 4, C = 0.5: in every round 2 workers train H steps and push their sums, the other 2 sit
    out at once; the PS applies the mean of the 2 sums and answers all 4; the pair changes."""
    H, lr = 3, 0.1
    srv = ServerState(params=_zeros(), lr=lr, n_workers=4, workers=list(WORKERS))
    ps = make_strategy("local_sgd", {"period": H, "fraction": 0.5})
    workers = {w: make_strategy("local_sgd", {"period": H, "fraction": 0.5}) for w in WORKERS}
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for r in range(8):
        pushes, sums, steps = _fedavg_round(workers, r, H, gen)
        chosen = {w for w, p in pushes.items() if p}
        assert chosen == {WORKERS[i] for i in participants(r, 4, 0.5)} and len(chosen) == 2
        assert {w: steps[w] for w in WORKERS} == {w: H if w in chosen else 1 for w in WORKERS}
        old = _clone(srv.params)
        order = sorted(WORKERS, key=lambda w: w in chosen)  # the idle ones check in first
        answers = [ps.server_on_push(srv, w, pushes[w], base_version=r) for w in order]
        assert answers == [[], [], [], WORKERS]  # only the last selected push closes it; all go on
        assert srv.version == r + 1 and sorted(w for w, _, _ in srv.log) == sorted(chosen)
        srv.log.clear()
        for k in old:
            torch.testing.assert_close(srv.params[k], old[k] - lr * sum(sums[w][k] for w in chosen) / 2)
        seen.add(frozenset(chosen))
    assert len(seen) > 1


def _half_round():
    """A PS of 4 workers under local SGD with C = 0.5, one step a round: round 0's chosen and idle."""
    srv = ServerState(params=_zeros(), lr=1.0, n_workers=4, workers=list(WORKERS))
    ps = make_strategy("local_sgd", {"period": 1, "fraction": 0.5})
    chosen = sorted(WORKERS[i] for i in participants(0, 4, 0.5))
    return srv, ps, {"w": torch.ones(2, 2), "b": torch.ones(2)}, chosen, sorted(set(WORKERS) - set(chosen))


def test_local_sgd_fraction_waits_only_for_the_selected_workers():
    srv, ps, g, chosen, idle = _half_round()
    assert ps.server_on_push(srv, chosen[0], g, base_version=0) == [] and ps.round_open()
    assert ps.server_on_push(srv, chosen[1], g, base_version=0) == chosen  # no wait for the idle ones
    assert srv.version == 1 and not ps.round_open()
    # a check-in for round 0 that arrives after it closed is answered at once, and counts for nothing
    assert ps.server_on_push(srv, idle[0], {}, base_version=0) == [idle[0]] and srv.version == 1
    # a push that contradicts the draw for round 1 is refused: the PS and workers must agree
    outside = next(WORKERS[i] for i in range(4) if i not in participants(1, 4, 0.5))
    with pytest.raises(RuntimeError, match="not selected"):
        ps.server_on_push(srv, outside, g, base_version=1)


def test_local_sgd_fraction_leaving_workers_do_not_hold_the_round():
    srv, ps, g, chosen, idle = _half_round()
    assert ps.server_on_push(srv, idle[0], {}, base_version=0) == []
    assert ps.server_on_push(srv, chosen[0], g, base_version=0) == []
    assert ps.server_on_leave(srv, chosen[1]) == sorted([idle[0], chosen[0]])
    assert srv.version == 1 and torch.equal(srv.params["b"], -torch.ones(2))  # chosen[0]'s push alone
    # round 1: once every selected worker is gone, the round closes with no update
    left = {chosen[1]}
    gone = {WORKERS[i] for i in participants(1, 4, 0.5)}
    waiting = sorted(set(WORKERS) - gone - left)
    assert [ps.server_on_push(srv, w, {}, base_version=1) for w in waiting] == [[]] * len(waiting)
    answers = [ps.server_on_leave(srv, w) for w in sorted(gone - left)]
    assert answers[-1] == waiting and srv.version == 2 and torch.equal(srv.params["b"], -torch.ones(2))


def test_local_sgd_fraction_one_averages_every_worker():
    H, lr = 2, 0.1
    for params in ({"period": H}, {"period": H, "fraction": 1.0}):
        srv = ServerState(params=_zeros(), lr=lr, n_workers=4, workers=list(WORKERS))
        ps = make_strategy("local_sgd", params)
        workers = {w: make_strategy("local_sgd", params) for w in WORKERS}
        pushes, sums, steps = _fedavg_round(workers, 0, H, torch.Generator().manual_seed(1))
        assert all(pushes[w] and steps[w] == H for w in WORKERS)
        answers = [ps.server_on_push(srv, w, pushes[w], base_version=0) for w in WORKERS]
        assert answers == [[], [], [], WORKERS]
        for k in srv.params:
            torch.testing.assert_close(srv.params[k], -lr * sum(sums[w][k] for w in WORKERS) / 4)


@pytest.mark.parametrize("fraction", [0, 1.5])
def test_local_sgd_fraction_out_of_range_is_rejected(fraction):
    with pytest.raises(ValueError, match="fraction"):
        make_strategy("local_sgd", {"fraction": fraction})
    with pytest.raises(ScenarioError) as ei:
        parse_scenario({"algorithm": {"name": "local_sgd", "params": {"fraction": fraction}}})
    assert any(line.startswith("algorithm.params.fraction:") for line in ei.value.lines), ei.value.lines


# --------------------------------------------------------------------------- ASGD


def test_staleness_lr():
    assert staleness_lr(0.1, 0) == 0.1
    assert staleness_lr(0.1, 1) == 0.1
    assert staleness_lr(0.3, 3) == pytest.approx(0.1)
    assert staleness_lr(1.0, 4) == 0.25
    assert staleness_lr(0.1, -2) == 0.1  # a base newer than the PS (cannot happen) is not amplified


def test_asgd_applies_each_push_with_staleness_scaled_lr():
    lr = 0.6
    s = ServerState(params=_params(), lr=lr, n_workers=2)
    asgd = ASGD()
    expected = _clone(s.params)

    # fresh push: staleness 0 -> full lr, only the pusher is answered
    g = _grad(1.0)
    assert asgd.server_on_push(s, "w0", g, base_version=0) == ["w0"]
    assert s.version == 1
    for k in expected:
        expected[k] = expected[k] - lr * g[k]
        torch.testing.assert_close(s.params[k], expected[k], rtol=0, atol=1e-15)
    assert torch.equal(s.params["b"], torch.tensor([0.5 - 2.4, -0.5 - 4.8], dtype=torch.float64))

    # two more fresh pushes from w1 (version 1 -> 3)
    for base in (1, 2):
        assert asgd.server_on_push(s, "w1", _grad(0.5), base_version=base) == ["w1"]
        for k in expected:
            expected[k] = expected[k] - lr * _grad(0.5)[k]
    assert s.version == 3

    # w0 computed on version 0, the PS is at 3: staleness 3 -> lr / 3
    g = _grad(3.0)
    assert asgd.server_on_push(s, "w0", g, base_version=0) == ["w0"]
    assert s.version == 4
    for k in expected:
        expected[k] = expected[k] - (lr / 3) * g[k]  # = expected - 0.2 * 3 * grad(1)
        torch.testing.assert_close(s.params[k], expected[k], rtol=0, atol=1e-12)

    assert [(w, st) for w, st, _ in s.log] == [("w0", 0), ("w1", 0), ("w1", 0), ("w0", 3)]
    assert [r for _, _, r in s.log] == [lr, lr, lr, pytest.approx(0.2)]


def test_asgd_staleness_one_uses_full_lr():
    s = ServerState(params=_params(), lr=0.5, n_workers=2)
    asgd = ASGD()
    asgd.server_on_push(s, "w0", _grad(1.0), base_version=0)
    before = _clone(s.params)
    asgd.server_on_push(s, "w1", _grad(1.0), base_version=0)  # staleness 1
    assert s.log[-1] == ("w1", 1, 0.5)
    for k in before:
        torch.testing.assert_close(s.params[k], before[k] - 0.5 * _grad(1.0)[k])


def test_asgd_leave_answers_nobody():
    s = ServerState(params=_params(), lr=0.5, n_workers=2)
    assert ASGD().server_on_leave(s, "w0") == []
    assert s.version == 0
