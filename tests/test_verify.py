"""--verify-links planning: which paths are measured, against what, and which can share a measurement."""

import pytest

from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.run.verify import _batches, _expected_rtt, planned_flows


def _spec(extra: dict | None = None, ps: dict | None = None):
    sc = parse_scenario({"name": "v", "profiles": {"a": {"uplink": "20mbit", "downlink": "50mbit", "latency": "20ms"},
                                                   "b": {"bandwidth": "100mbit"}, "srv": ps or {}},
                         "ps": {"profile": "srv"},
                         "workers": [{"count": 2, "profile": "a"}, {"count": 1, "profile": "b"}], **(extra or {})})
    return build_cluster(sc, "t")


def _flows(spec, direction="up"):
    return planned_flows(spec, direction, lambda node, key: 0)


def test_expected_rtt_adds_both_access_links_each_way():
    spec = _spec(ps={"latency": "5ms"})
    w0, w2 = spec.node("w0"), spec.node("w2")
    assert _expected_rtt(spec, w0, spec.ps) == pytest.approx(0.02 + 0.02 + 0.005 + 0.005)
    assert _expected_rtt(spec, w2, spec.ps) == pytest.approx(0.01)  # only the PS's own latency


def test_flows_share_a_measurement_only_when_the_ps_side_can_carry_them_all():
    spec = _spec()
    flows = _flows(spec)
    assert [f[1] for f in flows] == [20e6, 20e6, 100e6]
    assert _batches(spec, flows, None, together=True) == [flows]  # unshaped PS: all at once
    assert _batches(spec, flows, 1e9, together=True) == [flows]  # 140 Mbit/s fit in 90% of 1 Gbit/s
    assert _batches(spec, flows, 150e6, together=True) == [[f] for f in flows]  # 140 > 135: one at a time
    assert _batches(spec, flows, None, together=False) == [[f] for f in flows]  # containers: one at a time
    assert _batches(spec, [], None, together=True) == []


def test_flows_across_sites_are_measured_one_at_a_time():
    spec = _spec({"sites": {"x": {}, "y": {}}, "wan": {"default": {"bandwidth": "30mbit"}},
                  "ps": {"profile": "srv", "site": "x"},
                  "workers": [{"count": 2, "profile": "a", "site": "y"}, {"count": 1, "profile": "b", "site": "x"}]})
    flows = _flows(spec)
    assert [f[1] for f in flows] == [20e6, 20e6, 100e6]  # the 30 Mbit/s WAN is not the bottleneck up
    assert [f[1] for f in _flows(spec, "down")] == [30e6, 30e6, 100e6]  # down it is (50 Mbit/s access)
    assert _batches(spec, flows, None, together=True) == [[f] for f in flows]  # two share the WAN
