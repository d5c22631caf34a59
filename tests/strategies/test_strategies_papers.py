"""The papers' arithmetic on small known tensors: SSP blocking, local SGD = model averaging,
Comp-ASGD's whole-model top-c, AdaComp's per-parameter staleness and learning rates (Eq. 3-5)."""

from __future__ import annotations

import pytest
import torch

from testbed.strategies import ServerState, WorkerContext, make_strategy, sparse
from testbed.strategies.base import PushMeta


def ctx(step=1, base=0, worker="w0"):
    return WorkerContext(worker=worker, rank=0, step=step, base_version=base, lr=0.1)


def server(params, lr=1.0, workers=("w0", "w1", "w2")):
    return ServerState(params={k: v.clone() for k, v in params.items()}, lr=lr, n_workers=len(workers),
                       workers=list(workers))


# --------------------------------------------------------------------------- sparse wire


def test_sparse_payload_bytes_scale_with_the_kept_fraction():
    from testbed.node import wire

    g = {"w": torch.randn(100, 100)}
    dense = wire.message_bytes(wire.encode(wire.Message("push", g)))
    kept = sparse.encode({"w": sparse.top_k_flat(g["w"], 100)})
    small = wire.message_bytes(wire.encode(wire.Message("push", kept)))
    assert dense > 40_000 and 800 <= small < 1_200  # 100 x (4 B index + 4 B value) + header
    back = sparse.densify(kept, {"w": g["w"].shape})["w"]
    assert (back != 0).sum() == 100
    assert torch.equal(back[back != 0], g["w"][back != 0])
    assert back.abs().min() == 0 and back.abs().max() == g["w"].abs().max()


# --------------------------------------------------------------------------- SSP


def test_ssp_blocks_a_worker_more_than_s_clocks_ahead():
    s = make_strategy("ssp", {"staleness": 1})
    srv = server({"x": torch.zeros(1)})
    g = {"x": torch.ones(1)}
    assert s.server_on_push(srv, "w0", g, 0) == ["w0"]  # clock 1, slowest 0: within 1
    assert s.server_on_push(srv, "w0", g, 1) == []  # clock 2 vs 0: blocked
    assert srv.version == 2 and float(srv.params["x"]) == -2.0  # its update is applied all the same
    assert s.server_on_push(srv, "w1", g, 0) == ["w1"]  # w1 at 1; slowest (w2) still 0
    assert s.server_on_push(srv, "w2", g, 0) == ["w0", "w2"]  # slowest now 1: w0 (2) is released
    assert s.server_on_leave(srv, "w2") == []


def test_ssp_leaving_worker_releases_the_others():
    s = make_strategy("ssp", {"staleness": 0})
    srv = server({"x": torch.zeros(1)}, workers=("w0", "w1"))
    assert s.server_on_push(srv, "w0", {"x": torch.ones(1)}, 0) == []
    assert s.server_on_leave(srv, "w1") == ["w0"]


# --------------------------------------------------------------------------- local SGD


def test_local_sgd_is_the_average_of_the_local_models():
    """2 workers, H = 3, lr 0.1, plain SGD: the PS's model after the sync is the mean of theirs."""
    torch.manual_seed(0)
    w0 = torch.randn(4)
    lr, H = 0.1, 3
    grads = {w: [torch.randn(4) for _ in range(H)] for w in ("w0", "w1")}
    local = {w: w0 - lr * sum(grads[w]) for w in grads}  # what each worker's copy becomes
    strategies = {w: make_strategy("local_sgd", {"period": H}) for w in grads}
    srv = server({"p": w0}, lr=lr, workers=("w0", "w1"))
    answered = []
    for w in grads:
        for h in range(H):
            out = strategies[w].worker_payload({"p": grads[w][h]}, ctx(step=h + 1, worker=w))
            assert (out is None) == (h < H - 1)  # local steps, then one push
        answered.append(out)
    s = make_strategy("local_sgd", {"period": H})
    assert s.server_on_push(srv, "w0", answered[0], 0) == []
    assert s.server_on_push(srv, "w1", answered[1], 0) == ["w0", "w1"]
    assert torch.allclose(srv.params["p"], (local["w0"] + local["w1"]) / 2, atol=1e-6)
    # the next period starts from an empty sum
    assert strategies["w0"].worker_payload({"p": torch.ones(4)}, ctx(step=4)) is None


# --------------------------------------------------------------------------- Comp-ASGD


def test_comp_asgd_keeps_the_largest_entries_of_the_whole_model():
    s = make_strategy("comp_asgd", {"c": 0.3})
    g = {"a": torch.tensor([0.1, -5.0, 0.2, 0.0]), "b": torch.tensor([3.0, -0.3, 4.0])}
    payload = s.worker_payload(g, ctx())
    entries, _ = sparse.decode(payload)
    # ceil(0.3 * 7) = 3 largest over both tensors: -5 (a[1]), 4 (b[2]), 3 (b[0]); none else from a
    assert entries["a"][0].tolist() == [1] and entries["a"][1].tolist() == [-5.0]
    assert entries["b"][0].tolist() == [0, 2] and entries["b"][1].tolist() == [3.0, 4.0]
    srv = server({"a": torch.zeros(4), "b": torch.zeros(3)}, lr=1.0)
    srv.version = 4
    assert s.server_on_push(srv, "w0", payload, 2) == ["w0"]  # staleness 2: lr / 2
    assert srv.params["a"].tolist() == [0.0, 2.5, 0.0, 0.0]
    assert srv.params["b"].tolist() == [-1.5, 0.0, -2.0]
    assert srv.log[-1] == ("w0", 2, 0.5)


# --------------------------------------------------------------------------- AdaComp


def test_adacomp_selects_per_tensor():
    s = make_strategy("adacomp", {"c": 0.5})
    g = {"a": torch.tensor([0.1, -5.0, 0.2, 0.0]), "b": torch.tensor([0.3, -0.2])}
    entries, _ = sparse.decode(s.worker_payload(g, ctx()))
    # ceil(0.5 * 4) = 2 of a, ceil(0.5 * 2) = 1 of b: every tensor keeps some, unlike Comp-ASGD
    assert entries["a"][0].tolist() == [1, 2] and entries["b"][0].tolist() == [0]


def test_adacomp_per_parameter_staleness_and_learning_rate():
    """A hand-built sequence: w1 and w2 push while w0 computes on the model it pulled at 0."""
    s = make_strategy("adacomp", {"c": 1.0})
    srv = server({"x": torch.zeros(4)}, lr=1.0)

    def push(worker, idx, val, base):
        payload = sparse.encode({"x": (torch.tensor(idx, dtype=torch.int32), torch.tensor(val))})
        return s.server_on_push(srv, worker, payload, base)

    assert push("w1", [0, 1], [1.0, 1.0], 0) == ["w1"]  # u = 0 touches 0, 1; nothing since its pull
    assert srv.params["x"].tolist() == [-1.0, -1.0, 0.0, 0.0]
    push("w2", [1, 2], [1.0, 1.0], 0)  # u = 1: sigma = (1 for k=1, 0 for k=2) -> lr (1, 1)
    assert srv.params["x"].tolist() == [-1.0, -2.0, -1.0, 0.0]
    # w0 pulled at 0 and pushes at i = 2: sigma_0 = 1 (u=0), sigma_1 = 2 (u=0, 1), sigma_2 = 1, sigma_3 = 0
    push("w0", [0, 1, 2, 3], [4.0, 4.0, 4.0, 4.0], 0)
    assert srv.params["x"].tolist() == [-1.0 - 4.0, -2.0 - 2.0, -1.0 - 4.0, -4.0]
    assert srv.version == 3
    assert srv.log[-1][:2] == ("w0", 2) and srv.log[-1][2] == pytest.approx((4 + 2 + 4 + 4) / 4 / 4)
    # a worker that pulled at 2 sees only u = 2 (w0's update touched all four)
    assert s.staleness("x", torch.arange(4), 4, 2).tolist() == [1, 1, 1, 1]
    assert s.staleness("x", torch.arange(4), 4, 3).tolist() == [0, 0, 0, 0]


def test_adacomp_history_keeps_the_last_d_updates():
    s = make_strategy("adacomp", {"c": 1.0, "history": 2})
    srv = server({"x": torch.zeros(1)})
    for w in ("w0", "w1", "w2"):
        s.server_on_push(srv, w, sparse.encode({"x": (torch.tensor([0], dtype=torch.int32), torch.ones(1))}), 0)
    assert len(s.trace) == 2
    assert s.staleness("x", torch.tensor([0]), 1, 0).tolist() == [2]  # u = 0 is forgotten: a lower bound


def test_adacomp_counts_from_pull_copies_as_the_walk_does():
    """Random async pushes (stale, out of order, beyond `history`, from workers whose pull copy is
    not their base): the PS's counting from pull copies moves the model exactly as Eq. 3's walk."""
    import random

    def run(walk_only: bool):
        rng, gen = random.Random(5), torch.Generator().manual_seed(5)
        s = make_strategy("adacomp", {"c": 0.3, "history": 6})
        walked, walk = [], s.staleness
        s.staleness = lambda *a: walked.append(1) or walk(*a)
        srv = server({"a": torch.zeros(50), "b": torch.zeros(7)}, lr=0.5)
        base = {f"w{k}": 0 for k in range(8)}
        for _ in range(60):
            w = rng.choice(sorted(base))
            grads = {n: torch.randn(t.shape, generator=gen) for n, t in srv.params.items()}
            answer = s.server_on_push(srv, w, s.worker_payload(grads, ctx()), base[w])
            for x in answer:
                if rng.random() < 0.8:  # some answers are lost: the next push's base is older
                    s.server_reply_meta(srv, x)
                    base[x] = srv.version
            if walk_only:
                s.pulled.clear()
        return srv.params, [entry[1:] for entry in srv.log], len(walked)

    fast, fast_log, fast_walks = run(False)
    walk, walk_log, walks = run(True)
    assert fast_log == walk_log and max(stale for stale, _ in fast_log) > 6  # some beyond history
    assert all(torch.equal(fast[n], walk[n]) for n in fast)
    assert walks == 120 and 0 < fast_walks < walks  # the copies served the pushes they could


# --------------------------------------------------------------------------- ScaDLES


def test_scadles_weights_by_streamed_samples_and_scales_the_lr():
    """Eq. 4a-4c: devices that trained on 10 and 30 samples; B = 20 * 2 = 40."""
    s = make_strategy("scadles", {"base_batch": 20})
    srv = server({"x": torch.zeros(2)}, lr=0.1, workers=("w0", "w1"))
    srv.push_meta = PushMeta(batch_size=10)
    assert s.server_on_push(srv, "w0", {"x": torch.tensor([1.0, 0.0])}, 0) == []
    srv.push_meta = PushMeta(batch_size=30)
    assert s.server_on_push(srv, "w1", {"x": torch.tensor([0.0, 1.0])}, 0) == ["w0", "w1"]
    # g~ = 0.25 (1, 0) + 0.75 (0, 1); eta_scaled = 0.1 * 40 / 40 = 0.1
    assert srv.params["x"].tolist() == pytest.approx([-0.025, -0.075])
    srv.push_meta = PushMeta(batch_size=60)
    s.server_on_push(srv, "w0", {"x": torch.tensor([1.0, 0.0])}, 1)
    s.server_on_push(srv, "w1", {"x": torch.tensor([1.0, 0.0])}, 1)
    # 120 samples this step: eta_scaled = 0.1 * 120 / 40 = 0.3
    assert srv.params["x"].tolist() == pytest.approx([-0.325, -0.075])
    assert srv.log[-1][2] == pytest.approx(0.3)


def test_scadles_unweighted_is_the_plain_mean():
    s = make_strategy("scadles", {"weighted": False, "lr_scaling": False})
    srv = server({"x": torch.zeros(1)}, lr=1.0, workers=("w0", "w1"))
    srv.push_meta = PushMeta(batch_size=10)
    s.server_on_push(srv, "w0", {"x": torch.tensor([1.0])}, 0)
    srv.push_meta = PushMeta(batch_size=90)
    s.server_on_push(srv, "w1", {"x": torch.tensor([3.0])}, 0)
    assert srv.params["x"].tolist() == [-2.0]


@pytest.mark.parametrize("delta,compressed", [(0.19, False), (0.2, True), (0.21, True)])
def test_scadles_compresses_at_deltas_boundary(delta, compressed):
    """g = (4, 2), cr 0.5 keeps 4: | |g|^2 - |Topk(g)|^2 | / |g|^2 = |20 - 16| / 20 = 0.2."""
    s = make_strategy("scadles", {"cr": 0.5, "delta": delta})
    payload = s.worker_payload({"a": torch.tensor([4.0, 2.0])}, ctx())
    assert s.last_compressed is compressed
    assert ("a@i" in payload) is compressed and ("a" in payload) is not compressed


# --------------------------------------------------------------------------- SelSync


def test_relative_grad_change_follows_eq_2_with_ewma():
    from testbed.strategies.selsync import RelativeGradChange

    r = RelativeGradChange(smoothing=0.5, window=25)
    assert r.update(4.0) == float("inf")  # the first step has nothing to compare with
    # window (4, 8), weights 0.5 and 1: E = (8 + 2) / 1.5 = 6.667 -> |6.667 - 4| / 4
    assert r.update(8.0) == pytest.approx((20 / 3 - 4) / 4)
    # window (4, 8, 6): E = (6 + 4 + 1) / 1.75 = 6.2857
    assert r.update(6.0) == pytest.approx(abs(11 / 1.75 - 20 / 3) / (20 / 3))
    w = RelativeGradChange(smoothing=0.5, window=2)
    for v in (100.0, 4.0, 4.0):
        last = w.update(v)
    assert w.ewma == pytest.approx(4.0)  # 100 left the window
    assert last == pytest.approx(abs(4.0 - 36.0) / 36.0)


def test_selsync_votes_from_a_gradient_sequence():
    """delta 0.3: |g|^2 goes 1, 1, 4 (smoothing 1 = no smoothing): votes sync, local, sync."""
    s = make_strategy("selsync", {"delta": 0.3, "smoothing": 1.0})
    votes = [s.worker_vote({"g": torch.tensor([x])}, ctx(step=i + 1)) for i, x in enumerate((1.0, 1.0, 2.0))]
    assert votes == [True, False, True] and s.last_change == pytest.approx(3.0)


def test_selsync_any_flag_synchronizes_everyone_and_pa_averages_models():
    s = make_strategy("selsync", {"delta": 0.3})
    srv = server({"x": torch.tensor([0.0, 0.0])}, lr=0.1, workers=("w0", "w1"))
    assert s.server_on_vote(srv, "w0", False) is None
    assert s.server_on_vote(srv, "w1", True) == (["w0", "w1"], True)
    assert s.server_on_vote(srv, "w0", False) is None
    assert s.server_on_vote(srv, "w1", False) == (["w0", "w1"], False)  # nobody flagged: local step
    # PA: each pushes its model after its local step; the PS takes their mean
    c0 = ctx(step=3, worker="w0")
    c0.model_params, c0.sync = {"x": torch.tensor([1.0, 2.0])}, True
    p0 = s.worker_payload({"x": torch.tensor([10.0, 0.0])}, c0)  # 1 - 0.1 * 10 = 0
    assert p0["x"].tolist() == pytest.approx([0.0, 2.0])
    c0.sync = False
    assert s.worker_payload({"x": torch.ones(2)}, c0) is None
    s.server_on_push(srv, "w0", p0, 0)
    assert s.server_on_push(srv, "w1", {"x": torch.tensor([4.0, 4.0])}, 0) == ["w0", "w1"]
    assert srv.params["x"].tolist() == pytest.approx([2.0, 3.0]) and srv.version == 1


def test_selsync_vote_completes_when_a_worker_leaves():
    s = make_strategy("selsync", {})
    srv = server({"x": torch.zeros(1)}, workers=("w0", "w1"))
    assert s.server_on_vote(srv, "w0", True) is None
    s.server_on_leave(srv, "w1")
    assert s.server_on_vote(srv, None, False) == (["w0"], True)


def test_scadles_accepts_a_push_that_leaves_tensors_out():
    s = make_strategy("scadles", {"lr_scaling": False, "weighted": False})
    srv = server({"a": torch.zeros(2), "b": torch.zeros(2)}, lr=1.0, workers=("w0", "w1"))
    srv.push_meta = PushMeta(batch_size=1)
    s.server_on_push(srv, "w0", sparse.encode({"a": (torch.tensor([1], dtype=torch.int32), torch.tensor([2.0]))}), 0)
    s.server_on_push(srv, "w1", {"a": torch.tensor([0.0, 2.0]), "b": torch.tensor([4.0, 0.0])}, 0)
    assert srv.params["a"].tolist() == [0.0, -2.0] and srv.params["b"].tolist() == [-2.0, 0.0]


# --------------------------------------------------------------------------- ADSP


def test_adsp_commit_targets_for_workers_of_speed_1_1_3():
    """Gamma 12 s, k 2 commits per period; w0, w1 take 1 s a mini-batch, w2 3 s. Over 48 s every
    worker commits about 8 times; the fast ones accumulate ~6 mini-batches per commit, the slow ~2."""
    import heapq

    from testbed.strategies.adsp import ADSP

    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    params = {"check_period": 12.0, "commits_per_period": 2}
    ps = ADSP(params, clock=clock)
    srv = server({"x": torch.zeros(1)}, lr=0.1)
    step_time = {"w0": 1.0, "w1": 1.0, "w2": 3.0}
    workers = {w: ADSP(params, clock=clock) for w in step_time}
    for w, s in workers.items():
        s.worker_on_model(ps.server_reply_meta(srv, w))  # the hello's model
    events = [(step_time[w], w) for w in workers]
    heapq.heapify(events)
    steps = {w: 0 for w in workers}
    per_commit = {w: [] for w in workers}
    while events[0][0] <= 48.0:
        t, w = heapq.heappop(events)
        now[0] = t
        steps[w] += 1
        out = workers[w].worker_payload({"x": torch.ones(1)}, ctx(step=steps[w], worker=w))
        if out is not None:
            per_commit[w].append(float(out["x"]) / 0.1)  # U = eta' * (mini-batches since the last commit)
            ps.server_on_push(srv, w, out, 0)
            workers[w].worker_on_model(ps.server_reply_meta(srv, w))
        heapq.heappush(events, (t + step_time[w], w))
    counts = ps.commits
    assert all(7 <= counts[w] <= 9 for w in workers), counts  # equal commit rates whatever the speed
    assert sum(per_commit["w0"]) / len(per_commit["w0"]) == pytest.approx(6, abs=1)
    assert sum(per_commit["w2"]) / len(per_commit["w2"]) == pytest.approx(2, abs=0.6)
    # the PS applies eta = 1/M to every commit
    assert srv.log[-1][2] == pytest.approx(1 / 3)


def test_adsp_laggard_gets_a_higher_commit_rate():
    from testbed.strategies.adsp import ADSP

    now = [0.0]
    ps = ADSP({"check_period": 10.0, "commits_per_period": 2}, clock=lambda: now[0])
    srv = server({"x": torch.zeros(1)})
    ps.checkpoint()
    for w, n in (("w0", 2), ("w1", 2), ("w2", 1)):
        for _ in range(n):
            ps.server_on_push(srv, w, {"x": torch.zeros(1)}, 0)
    now[0] = 10.5  # second period: C_target = 4
    assert [ps.commit_rate(w) for w in ("w0", "w1", "w2")] == [2, 2, 3]
    meta = ps.server_reply_meta(srv, "w2")
    assert meta["commit_rate"] == 3 and meta["commit_interval"] == pytest.approx(9.5 / 3)


def test_adsp_reward_from_the_fitted_loss_curve():
    from testbed.strategies.adsp import fit_loss_curve, fitted_loss, reward

    a1sq, a2, a3 = 0.5, 1.0, 0.2
    samples = [(t, 1 / (a1sq * t + a2) + a3) for t in (0, 5, 10, 20, 30, 45, 60)]
    fit = fit_loss_curve(samples)
    assert fit == pytest.approx((a1sq, a2, a3), rel=0.02, abs=0.01)
    assert fitted_loss(fit, 60) == pytest.approx(samples[-1][1], rel=0.01)
    # r = a1^2 / (1/(l* - a3) - a2): reaching l* = 0.25 takes (1/0.05 - 1) / 0.5 = 38 s
    assert reward((a1sq, a2, a3), 0.25) == pytest.approx(1 / 38)
    assert reward((a1sq, a2, a3), 0.15) == 0.0  # below the asymptote: never
    assert fit_loss_curve(samples[:2]) is None  # Alg. 1 needs at least 3 samples


def test_adsp_online_search_goes_up_while_the_reward_improves():
    """Candidates k = 1, 2, 3, 4 (commits per period) tried a minute each; the loss falls fastest
    at k = 3, so the search keeps 3 for the rest of the 20-minute epoch, then starts again."""
    from testbed.strategies.adsp import ADSP

    now = [0.0]
    ps = ADSP({"check_period": 60.0, "trial_seconds": 60.0, "epoch_seconds": 1200.0}, clock=lambda: now[0])
    srv = server({"x": torch.zeros(1)})
    speed = {1: 0.02, 2: 0.05, 3: 0.08, 4: 0.03}  # a1^2 of the loss curve under each k
    seen = []
    level = 2.3
    for second in range(0, 420):
        now[0] = float(second)
        k = ps.k
        seen.append(k)
        t = second - (ps.search.trial_start or 0.0)
        srv.push_meta = PushMeta(loss=1 / (speed.get(k, 0.01) * t + 1 / (level - 0.1)) + 0.1)
        ps.server_on_push(srv, "w0", {"x": torch.zeros(1)}, 0)
        if ps.search.trial_start == now[0]:  # a new trial starts where the last ended
            level = srv.push_meta.loss
    assert seen[30] == 1 and seen[90] == 2 and seen[150] == 3 and seen[210] == 4
    assert ps.k == 3 and seen[-1] == 3
    assert [e["decision"] for e in ps.search.log] == ["try next", "try next", "try next", "keep 3"]
    assert ps.report()["candidate"] == 3
    # C_target grew by the k in force at each checkpoint: 1 (period 0) + 2 + 3 + 4 + 3 + 3 + 3
    assert ps.c_target() == 1 + 2 + 3 + 4 + 3 + 3 + 3
    now[0] = 1200.0
    ps.checkpoint()
    assert ps.k == 1 and ps.search.settled_until is None  # a new scheduler epoch searches again


def test_adsp_literal_reading_collapses_to_one_commit_per_period():
    from testbed.strategies.adsp import ADSP

    now = [0.0]
    ps = ADSP({"check_period": 10.0, "search": "literal", "trial_seconds": 10.0}, clock=lambda: now[0])
    srv = server({"x": torch.zeros(1)})
    assert ps.c_target() == 1  # max c_i + 1 with no commits yet
    for w in ("w0", "w1"):
        for _ in range(5):
            ps.server_on_push(srv, w, {"x": torch.zeros(1)}, 0)
    now[0] = 10.5  # the next trial: C_target + 1 = 2, but every worker already has 5 commits
    assert ps.c_target() == 2
    assert ps.commit_rate("w0") == 1 and ps.commit_rate("w1") == 1
