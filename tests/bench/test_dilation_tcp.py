"""benchmarks/dilation_tcp.py: its predictions and judgement (no root), and its two namespaces
shaped at r/k and removed again, also when what runs inside fails (root)."""

import importlib.util
import os
import sys

import pytest

from helpers import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("dilation_tcp", REPO / "benchmarks" / "dilation_tcp.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dilation_tcp"] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


def test_analytic_time_is_wire_bytes_over_the_rate_plus_round_trips():
    b = _bench()
    wire = 1514 / 1448
    assert b.analytic("bulk", 10_000_000, 50e6, 0.01, False) == pytest.approx(10e6 * 8 * wire / 50e6)
    # where the kernel delays: the handshake and the answer to the last byte, a round trip each
    assert b.analytic("bulk", 10_000_000, 50e6, 0.01, True) == pytest.approx(10e6 * 8 * wire / 50e6 + 0.04)
    assert b.analytic("rr", 0, 50e6, 0.01, False) == pytest.approx(20 * 20_200 * 8 * wire / 50e6)
    # the transport delays each message on every kernel
    assert b.analytic("msg", 0, 50e6, 0.01, False) == pytest.approx(5 * (1_000_200 * 8 * wire / 50e6 + 0.02))


def test_virtual_time_is_judged_against_k1_mean_and_median():
    b = _bench()
    rows = [{"workload": "bulk", "bytes": 1_000_000, "k": 1, "wall_s": [0.2, 0.2, 1.2]},
            {"workload": "bulk", "bytes": 1_000_000, "k": 4, "wall_s": [0.8, 0.8, 1.8]}]
    for r in rows:
        r["virtual_s"] = [w / r["k"] for w in r["wall_s"]]
    k1, k4 = b.judged(rows, 50e6, 0.01, False)
    assert k1["error_vs_k1"] == 0 and k1["median_error_vs_k1"] == 0
    # the same 1 s stall costs a quarter of it in virtual time at k = 4: the mean moves, the median not
    assert k4["virtual_mean_s"] == pytest.approx((0.2 + 0.2 + 0.45) / 3)
    assert k4["error_vs_k1"] == pytest.approx(0.85 / 1.6 - 1)
    assert k4["median_error_vs_k1"] == pytest.approx(0.0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, tc)")
def test_the_path_is_shaped_per_k_and_removed_on_error():
    b = _bench()
    made = None
    with pytest.raises(RuntimeError, match="inside"):
        with b.Path2(40e6, 0.01) as path:
            made = path.ns
            assert all(os.path.exists(f"/run/netns/{ns}") for ns in made)
            for k in (1, 4):
                plan = path.shape(k)
                assert plan.rate_bps == pytest.approx(40e6 / k)
                # no netem: the delay is the transport's, d*k; with netem, the kernel's
                assert (plan.transport_delay_s or plan.netem["delay"] / 1e6) == pytest.approx(0.01 * k)
            raise RuntimeError("inside")
    assert made and not any(os.path.exists(f"/run/netns/{ns}") for ns in made)
