"""The decentralized strategies' arithmetic on small known tensors: DLion (Eq. 5 batching,
adaptive tuning, per-link selection under a byte budget, weight exchange to the worst worker),
Gaia (significance filter, mirror clock) and Ako (rotating partitions of accumulated
gradients), plus the per-link path rates the runner gives them."""

import pytest
import torch

from testbed.strategies import make_strategy, sparse
from testbed.strategies.ako import partition_bounds
from testbed.strategies.peer import PeerContext, PeerInfo, apply_payload


def _ctx(peers, step=1, **kw):
    base = dict(worker="w0", step=step, lr=0.1, n_workers=1 + len(peers),
                peers={p.name: p for p in peers}, model_params={"w": torch.ones(10)})
    base.update(kw)
    return PeerContext(**base)


def _entries(payload, shapes):
    """{name: dense tensor} of what a payload carries."""
    return sparse.densify(payload, shapes, fill_missing=True)


# -- DLion -----------------------------------------------------------------------------------

def test_dlion_batches_follow_capacity_and_respect_total():
    s = make_strategy("dlion", {"total_batch": 120, "tuning": []})
    peers = [PeerInfo("w1"), PeerInfo("w2"), PeerInfo("w3")]
    ctx = _ctx(peers)
    assert s.batch_size(ctx) == 30  # capacities unknown: T_bs / k
    ctx.capacities = {"w0": 300.0, "w1": 100.0, "w2": 100.0, "w3": 100.0}  # 3:1:1:1
    assert s.batch_size(ctx) == 60
    sizes = []
    for me in ("w0", "w1", "w2", "w3"):
        others = [PeerInfo(w) for w in ("w0", "w1", "w2", "w3") if w != me]
        sizes.append(s.batch_size(_ctx(others, worker=me, capacities=ctx.capacities)))
    assert sizes == [60, 20, 20, 20] and sum(sizes) <= 120
    # T_j = m_j / C_j is the same unit time for every worker: 120 / 600 s
    assert s.unit_time(ctx) == pytest.approx(0.2)
    assert [m / c for m, c in zip(sizes, (300, 100, 100, 100))] == [pytest.approx(0.2)] * 4
    assert make_strategy("dlion", {"total_batch": 120, "tuning": [], "capacity_aware": False}).batch_size(ctx) == 30


def test_dlion_tuning_schedule():
    s = make_strategy("dlion", {"total_batch": 100, "warmup_epochs": 1.0, "speedup_epoch": 2.0,
                                "decay_epoch": 3.0, "decay_factor": 0.1, "initial_batch_fraction": 0.5})
    ctx = _ctx([PeerInfo("w1"), PeerInfo("w2"), PeerInfo("w3")])
    lrs, totals = [], []
    for epoch in (0.0, 0.5, 1.0, 2.5, 3.5):
        ctx.epoch = epoch
        lrs.append(s.learning_rate(ctx))
        totals.append(s.total_batch(ctx))
    # WarmUpLR: eta -> eta * k over the first epoch; DecayLR: x0.1 from epoch 3
    assert lrs == pytest.approx([0.1, 0.25, 0.4, 0.4, 0.04])
    # SpeedUpBS: half of T_bs until epoch 2, then T_bs (never more)
    assert totals == [50, 50, 50, 100, 100]
    inc = make_strategy("dlion", {"total_batch": 100, "tuning": ["increase_bs"], "speedup_epoch": 2.0})
    ctx.epoch = 1.0
    assert inc.total_batch(ctx) == 75 and inc.learning_rate(ctx) == pytest.approx(0.1)


def test_dlion_per_link_selection_under_a_byte_budget():
    # unit time 1 s (all capacities known); budget = link_share * rate / 8 * T_unit bytes, 8 bytes an entry
    s = make_strategy("dlion", {"total_batch": 10, "tuning": [], "link_share": 1.0, "min_fraction": 0.01})
    lan, wan, free = PeerInfo("w1", rate_bps=8 * 8 * 40), PeerInfo("w2", rate_bps=8 * 8 * 10, same_site=False), \
        PeerInfo("w3")
    ctx = _ctx([lan, wan, free], capacities={"w0": 2.5, "w1": 2.5, "w2": 2.5, "w3": 2.5})
    assert s.unit_time(ctx) == pytest.approx(1.0)
    g = torch.arange(1.0, 201.0) * torch.tensor([1.0, -1.0]).repeat(100)  # |g| = 1..200
    out = s.outgoing({"w": g}, ctx)
    got = {p: _entries(out[p], {"w": torch.Size([200])})["w"] for p in out}
    assert int((got["w1"] != 0).sum()) == 40 and int((got["w2"] != 0).sum()) == 10
    assert set(got["w2"].abs()[got["w2"] != 0].tolist()) == set(range(191, 201))  # the 10 largest
    assert torch.equal(got["w3"], g)  # unshaped: everything, dense
    # the contribution threshold is higher on the slower link
    assert s.link_log["w1"] == (40, 161.0) and s.link_log["w2"] == (10, 191.0)
    assert s.link_log["w3"][0] == 200
    # bytes scale with what the link carries: indices + values
    assert sum(t.numel() * t.element_size() for t in out["w2"].values()) == 10 * 8
    # what the WAN link did not carry stays in its residual: next step it carries entries 181..190
    out2 = s.outgoing({"w": torch.zeros(200)}, ctx)
    nxt = _entries(out2["w2"], {"w": torch.Size([200])})["w"]
    assert set(nxt.abs()[nxt != 0].tolist()) == set(range(181, 191))
    assert not out2["w3"]["w"].any()  # the unshaped link owes nothing


def test_dlion_sends_dense_without_a_top_k_when_its_budget_is_half_the_entries(monkeypatch):
    # budget 120 of 200 entries: as indices + values they would cost 960 bytes, dense 800
    s = make_strategy("dlion", {"total_batch": 10, "tuning": [], "link_share": 1.0})
    ctx = _ctx([PeerInfo("w1", rate_bps=8 * 8 * 120)], capacities={"w0": 5.0, "w1": 5.0})
    assert s.link_entries(ctx.peers["w1"], 200, ctx) == 120

    def no_top_k(*a, **k):
        raise AssertionError("top-k computed for a link that goes dense")

    monkeypatch.setattr("testbed.strategies.dlion.top_k_whole", no_top_k)
    g = torch.arange(1.0, 201.0)
    out = s.outgoing({"w": g}, ctx)
    assert torch.equal(_entries(out["w1"], {"w": torch.Size([200])})["w"], g)  # everything, dense
    assert s.link_log["w1"] == (200, 0.0)
    assert not s.residuals.acc["w1"]["w"].any()  # nothing owed


def test_dlion_min_fraction_floor():
    s = make_strategy("dlion", {"tuning": [], "min_fraction": 0.05})
    ctx = _ctx([PeerInfo("w1", rate_bps=1.0)], compute_seconds=0.01)
    assert s.link_entries(ctx.peers["w1"], 1000, ctx) == 50


def test_dlion_weight_exchange_best_to_worst_early_only():
    s = make_strategy("dlion", {"we_period": 5, "we_until_epoch": 2.0})
    peers = [PeerInfo("w1"), PeerInfo("w2")]
    losses = {"w0": 0.5, "w1": 2.0, "w2": 1.0}
    assert s.weights_to(_ctx(peers, step=5, losses=losses)) == ["w1"]  # w0 is best, w1 worst
    assert s.weights_to(_ctx(peers, step=6, losses=losses)) == []  # not a WE step
    assert s.weights_to(_ctx(peers, step=5, losses={**losses, "w0": 1.5})) == []  # w2 is best: it sends
    assert s.weights_to(_ctx(peers, step=5, losses={"w0": 0.5, "w1": 2.0})) == []  # w2's loss unknown
    assert s.weights_to(_ctx(peers, step=5, losses=losses, epoch=2.0)) == []  # late: no WE
    params = {"w": torch.zeros(3)}
    s.merge_weights(params, {"w": torch.tensor([2.0, 4.0, 6.0])}, _ctx(peers))
    assert params["w"].tolist() == [1.0, 2.0, 3.0]  # averaged into the replica
    make_strategy("dlion", {"we_merge": "replace"}).merge_weights(params, {"w": torch.ones(3)}, _ctx(peers))
    assert params["w"].tolist() == [1.0, 1.0, 1.0]


# -- Gaia ------------------------------------------------------------------------------------

def test_gaia_full_on_lan_significant_across_wan():
    s = make_strategy("gaia", {"threshold": 0.01, "mirror_clock": 3})
    lan, wan = PeerInfo("w1"), PeerInfo("w2", same_site=False)
    w = torch.tensor([1.0, 1.0, 10.0, 0.0])
    ctx = _ctx([lan, wan], lr=0.3, model_params={"w": w})  # update scale lr / k = 0.1
    g = torch.tensor([0.2, 0.05, 0.5, 0.0])  # changes 0.02, 0.005, 0.05, 0 vs 1% of |w|: 0.01, 0.01, 0.1
    out = s.outgoing({"w": g}, ctx)
    assert torch.equal(out["w1"]["w"], g)  # LAN: the full gradient
    sent = _entries(out["w2"], {"w": torch.Size([4])})["w"]
    assert sent.tolist() == pytest.approx([0.2, 0.0, 0.0, 0.0])  # only entry 0 is significant
    # entry 1 accumulates until significant: 0.05 + 0.03 -> change 0.008, then 0.11 -> 0.011
    out = s.outgoing({"w": torch.tensor([0.0, 0.03, 0.0, 0.0])}, ctx)
    assert not out["w2"]  # nothing significant yet: an empty message (a clock tick)
    out = s.outgoing({"w": torch.tensor([0.0, 0.03, 0.0, 0.0])}, ctx)
    assert _entries(out["w2"], {"w": torch.Size([4])})["w"].tolist() == pytest.approx([0.0, 0.11, 0.0, 0.0])
    assert s.wait_bound(lan) == 0 and s.wait_bound(wan) == 3


# -- Ako -------------------------------------------------------------------------------------

def test_ako_partitions_rotate_and_carry_accumulated_gradients():
    s = make_strategy("ako", {"partitions": 3})
    peers = [PeerInfo("w1"), PeerInfo("w2")]
    shapes = {"a": torch.Size([4]), "b": torch.Size([5])}
    sent = {"a": torch.zeros(4), "b": torch.zeros(5)}
    for step in (1, 2, 3):
        out = s.outgoing({"a": torch.ones(4), "b": torch.ones(5)}, _ctx(peers, step=step))
        assert out["w1"] is out["w2"]  # the same partition to every peer
        lo, hi = partition_bounds(9, 3, step - 1)
        assert s.link_log["w1"] == (hi - lo, None)
        for n, t in _entries(out["w1"], shapes).items():
            sent[n] += t
        # a contiguous slice travels at 4 bytes an entry (+ one int64 start per tensor touched)
        vals = sum(t.numel() for k, t in out["w1"].items() if k.endswith("@v"))
        assert vals == hi - lo
    # after P steps every entry travelled once, carrying what accumulated until it was sent
    assert sent["a"].tolist() == [1.0, 1.0, 1.0, 2.0] and sent["b"].tolist() == [2.0, 2.0, 3.0, 3.0, 3.0]


def test_ako_partition_count_from_the_slowest_link():
    s = make_strategy("ako", {})
    ctx = _ctx([PeerInfo("w1", rate_bps=8e6), PeerInfo("w2", rate_bps=80e6)], compute_seconds=0.1)
    # 1e6 entries * 4 bytes over 1 MB/s * 0.1 s = 40 partitions; unshaped: 1
    assert s.choose_partitions(1_000_000, ctx) == 40
    # two peers behind the same slowest rate (a site's WAN) share it
    two = _ctx([PeerInfo("w1", rate_bps=8e6), PeerInfo("w2", rate_bps=8e6)], compute_seconds=0.1)
    assert s.choose_partitions(1_000_000, two) == 80
    assert s.choose_partitions(1_000_000, _ctx([PeerInfo("w1")], compute_seconds=0.1)) == 1


def test_apply_payload_dense_sparse_and_slices():
    params = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    payload = {**sparse.encode({"a": (torch.tensor([1, 5], dtype=torch.int32), torch.tensor([1.0, 2.0]))}),
               **sparse.encode_slices({"b": (1, torch.tensor([3.0, 4.0]))})}
    apply_payload(params, payload, 0.5)
    assert params["a"].view(-1).tolist() == [0, -0.5, 0, 0, 0, -1.0]
    assert params["b"].tolist() == [0, -1.5, -2.0, 0]
    apply_payload(params, {"b": torch.ones(4)}, 1.0)
    assert params["b"].tolist() == [-1, -2.5, -3.0, -1]


# -- per-link rates ----------------------------------------------------------------------------

def test_peer_table_knows_lan_and_wan_rates():
    from testbed.plan import load_scenario
    from testbed.plan.cluster import build_cluster, peer_table

    from helpers import REPO

    sc = load_scenario(REPO / "scenarios" / "topologies" / "dlion-p-network.yaml")
    spec = build_cluster(sc, "t")
    w0 = spec.node("w0")
    table = peer_table(spec, w0)
    assert table["w1"]["rate_bps"] == 1e9 and table["w1"]["same_site"]
    assert table["w3"]["rate_bps"] == 1e8 and not table["w3"]["same_site"]
    assert table["w3"]["address"] == spec.node("w3").address
    assert peer_table(spec, spec.ps) == {}
