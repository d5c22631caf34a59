"""`edgebed bench trace`'s windows: wire rates from counter reads taken at jittered times."""

import pytest

from testbed.bench.trace import wire_rates


def test_two_reads_a_moment_apart_make_no_spike():
    """5 Mbit/s with frames leaving in bursts; the read for 0.3 s comes 1 ms early and the next
    0.5 ms after it, around a burst of 6 kB. Rates over each pair of reads (the old way) show a
    spike of 6.5x (247 Mbit/s on a 5 Mbit/s trace was measured so); the windows' edges do not."""
    reads = [(0.0, 0), (0.1, 62500), (0.2, 125000), (0.299, 186875), (0.3005, 193000), (0.4, 250000)]
    windows = wire_rates(reads, 0.0, 0.1, 4)
    assert windows == pytest.approx([5e6] * 4, rel=0.06)
    assert sum(windows) * 0.1 / 8 == pytest.approx(250000)  # every byte in exactly one window
    per_pair = [(b1 - b0) * 8 / (t1 - t0) for (t0, b0), (t1, b1) in zip(reads, reads[1:])]
    assert max(per_pair) > 6 * 5e6


def test_window_edges_between_reads_and_past_the_last_one():
    reads = [(0.0, 0), (0.1, 12500), (0.2, 25000)]
    assert wire_rates(reads, 0.0, 0.1, 2) == pytest.approx([1e6, 1e6])
    assert wire_rates(reads, 0.05, 0.1, 1) == pytest.approx([1e6])  # both edges between reads
    assert wire_rates(reads, 0.15, 0.1, 1) == pytest.approx([1e6])  # its end past the last read


def test_an_events_trace_replays_as_the_profiles():
    """`--via event` hands the replay the schedule a run's link event would: the same rates per
    100 ms as the profile's trace, section by section."""
    from types import SimpleNamespace

    from testbed.bench.trace import TRACES, section_replay
    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster

    label, ref = TRACES[0]
    sc = parse_scenario({"name": "t", "profiles": {"p": {"uplink": {"trace": ref, "trace_resolution": "100ms"}}},
                         "workers": [{"count": 1, "profile": "p"}]})
    spec = build_cluster(sc, "abc")
    rt = SimpleNamespace(set_rates=lambda node, rates: None)
    for offset in (0.0, 32.0):
        by = {via: section_replay(rt, spec, via, ref, offset).nodes[0] for via in ("profile", "event")}
        assert by["event"].node == by["profile"].node == "w0"
        profile, event = by["profile"].schedules["up"], by["event"].schedules["up"]
        assert event.resolution == profile.resolution == 0.1
        assert [event.rate_at(0.1 * k) for k in range(300)] == [profile.rate_at(0.1 * k) for k in range(300)]


def test_a_dilated_sections_rates_are_the_worlds():
    from testbed.bench.trace import world_rates

    r = world_rates({"trace_mean_bps": 1e6, "wire_mean_bps": 0.9e6, "peak_bps": 2e6, "goodput_bps": None,
                     "mae_fraction": 0.04, "pearson": 0.99}, 4)
    assert r == {"trace_mean_bps": 4e6, "wire_mean_bps": 3.6e6, "peak_bps": 8e6, "goodput_bps": None,
                 "mae_fraction": 0.04, "pearson": 0.99}
