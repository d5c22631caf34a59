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


class _Reading:
    def __init__(self, wire_bps):
        self.wire_bps = wire_bps


def test_a_reading_over_3_percent_off_is_taken_again_over_a_longer_window_the_first_in_the_note(tmp_path, monkeypatch):
    from testbed.run import verify

    spec = _spec(ps={"bandwidth": "1gbit"})  # 3 workers, no latency on the PS; w0/w1 have 20 ms
    w1_up = iter([19.0e6, 19.9e6])  # 95% (within the 10% tolerance, but more than 3% off), then 99.5%
    w2_down = iter([80e6, 81e6])  # too slow twice: stays off
    windows = []

    def fake_measure(rt, scratch, flows, *, window, warmup):
        windows.append((tuple(f.label for f in flows), window))
        out = []
        for f in flows:
            bps = {"w1-up": lambda: next(w1_up), "w2-down": lambda: next(w2_down)}.get(f.label)
            configured = {"w0-up": 20e6, "w0-down": 50e6, "w1-down": 50e6}.get(f.label, 100e6)
            out.append(_Reading(bps() if bps else configured))
        return out

    monkeypatch.setattr(verify, "measure_flows", fake_measure)
    monkeypatch.setattr(verify, "_expected_rtt", lambda spec, n, ps: 0.0)  # no round trips to fake
    rt = type("Rt", (), {"link_counter": lambda self, n, k: 0})()
    rows = verify.verify_links(rt, spec, {}, tmp_path, tolerance=0.10, together=False, say=lambda s: None)
    by = {(r["node"], r["direction"]): r for r in rows}
    assert by["w1", "up"]["ok"] and by["w1", "up"]["measured_bps"] == 19.9e6
    assert by["w1", "up"]["note"] == "measured again; first read 95.0%"
    assert not by["w2", "down"]["ok"] and by["w2", "down"]["ratio"] == pytest.approx(0.81)
    assert by["w0", "up"]["ok"] and by["w0", "up"]["note"] == ""
    # only the two off readings were taken again, alone and over twice the window
    assert [w for w in windows if w[1] != 1.0] == [(("w1-up",), 2.0), (("w2-down",), 2.0)]


def test_a_round_trip_row_keeps_the_median_and_the_least_the_first_set_up_trip_left_out(tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    from testbed.run import verify

    spec = _spec(ps={"bandwidth": "1gbit"})  # w0/w1: 20 ms each way, so 40 ms configured; w2 none
    trips = {"w0": [0.5, 0.047, 0.041, 0.060, 0.044], "w1": []}  # w0's first includes the connection's set-up

    def start(node, fn, args):
        if "result_path" in args:
            (tmp_path / f"{node}-rtt.json").write_text(json.dumps({"rtts": trips[node]}))
        return SimpleNamespace(join=lambda timeout: None)

    monkeypatch.setattr(verify, "measure_flows", lambda rt, scratch, flows, **kw: [_Reading(9e9) for _ in flows])
    rt = SimpleNamespace(link_counter=lambda n, k: 0, start=start)
    delay = SimpleNamespace(up=0.0, up_jitter=0.0, down=0.0, down_jitter=0.0, paths={})
    rows = verify.verify_links(rt, spec, {n: delay for n in ("ps", "w0", "w1", "w2")}, tmp_path, say=lambda s: None)
    rtt = {r["node"]: r for r in rows if r["direction"] == "rtt"}
    assert set(rtt) == {"w0", "w1"}
    assert rtt["w0"]["measured_rtt_s"] == pytest.approx(0.0455) and rtt["w0"]["min_rtt_s"] == 0.041
    assert not rtt["w0"]["ok"]  # the median is 5.5 ms over 40 ms: over both the 5 ms and the 10% slack
    assert rtt["w1"]["min_rtt_s"] is None and rtt["w1"]["note"] == "no round trip completed"
    assert "(least 41.0 ms)" in verify.describe(rtt["w0"])
    verify.write(rows, tmp_path)
    assert "min_rtt_s" in (tmp_path / "link_check.csv").read_text().splitlines()[0].split(",")
