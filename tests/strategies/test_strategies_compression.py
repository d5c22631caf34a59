"""Compression composed with a synchronisation model (strategies/compressors.py): Comp-ASGD is
ASGD + top_c, AdaComp's per-layer top-c runs under SSP and BSP by configuration, error feedback
keeps its residual in the compressor, and Strategy is an ABC."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from testbed.strategies import ServerState, Strategy, StrategyError, WorkerContext, make_strategy, sparse
from testbed.strategies.compressors import PerTensorTopC, TopC

G = {"a": torch.tensor([0.1, -5.0, 0.2, 0.0]), "b": torch.tensor([3.0, -0.3, 4.0])}


def ctx():
    return WorkerContext(worker="w0", rank=0, step=1, base_version=0, lr=0.1)


def server(lr=1.0, workers=("w0", "w1")):
    return ServerState(params={"a": torch.ones(4), "b": torch.ones(3)}, lr=lr, n_workers=len(workers),
                       workers=list(workers))


def test_asgd_with_top_c_is_comp_asgd_on_a_fixed_tensor():
    old = make_strategy("comp_asgd", {"c": 0.3})
    new = make_strategy("asgd", {"compressor": {"name": "top_c", "c": 0.3}})
    p_old, p_new = old.worker_payload(G, ctx()), new.worker_payload(G, ctx())
    assert p_old.keys() == p_new.keys() == {"a@i", "a@v", "b@i", "b@v"}
    assert all(torch.equal(p_old[k], p_new[k]) for k in p_old)
    s_old, s_new = server(), server()
    s_old.version = s_new.version = 4
    assert old.server_on_push(s_old, "w0", p_old, 2) == new.server_on_push(s_new, "w0", p_new, 2) == ["w0"]
    # Comp-ASGD's update by hand: the 3 largest |g| of the whole model (-5, 4, 3) at lr / staleness 2
    assert s_new.params["a"].tolist() == [1.0, 3.5, 1.0, 1.0]
    assert s_new.params["b"].tolist() == [-0.5, 1.0, -1.0]
    assert all(torch.equal(s_old.params[n], s_new.params[n]) for n in s_old.params)
    assert s_old.log == s_new.log == [("w0", 2, 0.5)]
    assert isinstance(old.compressor, TopC) and old.last_compressed is None  # steps.csv as before


def test_ssp_with_the_adacomp_compressor_sends_top_c_per_layer():
    s = make_strategy("ssp", {"staleness": 3, "compressor": {"name": "adacomp", "c": 0.5}})
    assert isinstance(s.compressor, PerTensorTopC)
    payload = s.worker_payload(G, ctx())
    entries, dense = sparse.decode(payload)
    assert dense == {}
    # per tensor ceil(0.5 * numel): a keeps 2 of 4 (-5, 0.2), b keeps 2 of 3 (3, 4): every layer sends
    assert entries["a"][0].tolist() == [1, 2] and entries["a"][1].tolist() == pytest.approx([-5.0, 0.2])
    assert entries["b"][0].tolist() == [0, 2] and entries["b"][1].tolist() == [3.0, 4.0]
    srv = server(lr=0.5)
    s.server_on_push(srv, "w0", payload, 0)
    assert srv.params["a"].tolist() == pytest.approx([1.0, 3.5, 0.9, 1.0])
    assert srv.params["b"].tolist() == pytest.approx([-0.5, 1.0, -1.0])


def test_the_compressor_by_name_alone_and_a_wrong_name():
    assert isinstance(make_strategy("ssp", {"compressor": "adacomp"}).compressor, PerTensorTopC)
    assert make_strategy("ssp").compressor is None and make_strategy("asgd").compressor is None
    with pytest.raises(ValidationError, match="compressor.name"):
        make_strategy("asgd", {"compressor": {"name": "zip"}})


def test_bsp_with_top_c_counts_a_tensor_left_out_as_zero():
    s = make_strategy("bsp", {"compressor": {"name": "top_c", "c": 0.15}})  # ceil(0.15 * 7) = 2
    srv = server()
    assert s.server_on_push(srv, "w0", s.worker_payload(G, ctx()), 0) == []  # a: -5 only; b: 4 only
    g1 = {"a": torch.tensor([0.0, 0.0, 0.0, 0.0]), "b": torch.tensor([2.0, 0.0, -6.0])}
    assert s.server_on_push(srv, "w1", s.worker_payload(g1, ctx()), 0) == ["w0", "w1"]
    assert srv.params["a"].tolist() == [1.0, 3.5, 1.0, 1.0]  # mean of (-5) and (nothing): -2.5
    assert srv.params["b"].tolist() == [0.0, 1.0, 2.0]  # mean of (0, 0, 4) and (2, 0, -6)


def test_error_feedback_keeps_what_was_not_sent_for_the_next_push():
    s = make_strategy("asgd", {"compressor": {"name": "top_c", "c": 0.2, "error_feedback": True}})  # 2 of 7
    first = sparse.decode(s.worker_payload(G, ctx()))[0]
    assert {n: i.tolist() for n, (i, _) in first.items()} == {"a": [1], "b": [2]}
    assert s.compressor.residual["b"].tolist() == pytest.approx([3.0, -0.3, 0.0])
    zero = {"a": torch.zeros(4), "b": torch.zeros(3)}
    second = sparse.decode(s.worker_payload(zero, ctx()))[0]  # only the residual is left to send: 3, -0.3
    assert {n: v.tolist() for n, (_, v) in second.items()} == {"b": pytest.approx([3.0, -0.3])}
    assert s.compressor.residual["a"].tolist() == pytest.approx([0.1, 0.0, 0.2, 0.0])
    plain = make_strategy("asgd", {"compressor": {"name": "top_c", "c": 0.2}})
    plain.worker_payload(G, ctx())
    assert plain.compressor.residual == {}


def test_strategy_is_abstract_and_a_decentralized_one_takes_no_push():
    with pytest.raises(TypeError, match="server_on_push"):
        Strategy()

    class NoPush(Strategy):
        name = "nopush"

    with pytest.raises(TypeError, match="abstract"):
        NoPush()
    with pytest.raises(StrategyError, match="decentralized"):
        make_strategy("gaia").server_on_push(server(), "w0", G, 0)


def test_a_compressor_in_a_scenario_is_checked_with_its_field_path():
    from testbed.plan import parse_scenario
    from testbed.scenario.schema import ScenarioError

    base = {"profiles": {"edge": {"cpus": 0.5}}, "workers": [{"count": 2, "profile": "edge"}]}
    sc = parse_scenario({**base, "algorithm": {"name": "ssp", "params": {"compressor": "adacomp"}}})
    assert isinstance(make_strategy(sc.algorithm.name, sc.algorithm.params).compressor, PerTensorTopC)
    with pytest.raises(ScenarioError, match=r"algorithm.params.compressor.name: 'zip' is not one of"):
        parse_scenario({**base, "algorithm": {"name": "ssp", "params": {"compressor": {"name": "zip"}}}})
    with pytest.raises(ScenarioError, match=r"algorithm.params.compressor.c: Input should be less than or equal to 1"):
        parse_scenario({**base, "algorithm": {"name": "asgd", "params": {"compressor": {"name": "top_c", "c": 2}}}})


def test_a_push_header_is_typed_and_a_malformed_one_refused():
    from testbed.strategies import PushMeta

    meta = PushMeta(base_version=3, step=4, batch_size=32, loss=0.5)
    assert PushMeta.from_wire(meta.to_wire()) == meta
    assert PushMeta.from_wire({"base_version": 1, "loss": None}) == PushMeta(base_version=1)  # a NaN loss is null
    for bad in ({}, {"base_version": "1"}, {"base_version": True}, {"base_version": 1, "loss": "low"}):
        with pytest.raises((KeyError, ValueError)):
            PushMeta.from_wire(bad)
