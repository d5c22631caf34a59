"""benchmarks/topk_norm_share.py (ScaDLES Table V): the share of the squared norm that the
top CR of an update's entries hold, over the whole model as AdaptiveTopC chooses them, and the
compress-or-not rule it implies."""

import importlib.util

import pytest
import torch

from testbed.strategies.compressors import AdaptiveTopC

from helpers import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("topk_norm_share", REPO / "benchmarks" / "topk_norm_share.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _grads() -> dict[str, torch.Tensor]:
    # 200 entries in two tensors: the two largest (10 and -9) both in "a"; 1% of 200 = 2 entries
    a = torch.ones(100)
    a[17], a[60] = 10.0, -9.0
    return {"a": a.reshape(10, 10), "b": torch.full((100,), 0.5)}


def test_share_is_exact_and_whole_model():
    bench = _bench()
    total = 100 + 81 + 98 * 1 + 100 * 0.25
    # whole model: 10 and -9 (a per-tensor top 1% would take 10 from "a" and one 0.5 from "b")
    assert bench.norm_share(_grads(), 0.01) == pytest.approx((100 + 81) / total, rel=1e-6)
    # 10% = 20 entries: 10, -9 and eighteen 1s
    assert bench.norm_share(_grads(), 0.1) == pytest.approx((100 + 81 + 18) / total, rel=1e-6)
    assert bench.norm_share(_grads(), 1.0) == pytest.approx(1.0)


@pytest.mark.parametrize("delta", [0.1, 0.3, 0.4, 0.5, 0.6, 0.7])
def test_rule_matches_adaptive_top_c(delta):
    """The benchmark's compress-or-not is the strategy's (share 181/304 = 0.595: loss 0.405)."""
    bench = _bench()
    g = _grads()
    comp = AdaptiveTopC(0.01, delta)
    comp.compress(g)
    assert bench.would_compress(bench.norm_share(g, 0.01), delta) == comp.last_compressed
    assert comp.last_compressed == (delta >= 0.5)
