"""Tests for testbed.strategies: BSP barrier and averaging, ASGD staleness-scaled updates."""

from __future__ import annotations

import pytest
import torch

from testbed.strategies import (
    STRATEGIES,
    ServerState,
    StrategyError,
    WorkerContext,
    get_strategy_class,
    make_strategy,
)
from testbed.strategies.asgd import ASGD, staleness_lr
from testbed.strategies.bsp import BSP, average


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
    assert {"bsp", "asgd", "ssp", "local_sgd", "comp_asgd", "adacomp"} <= set(STRATEGIES)
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
