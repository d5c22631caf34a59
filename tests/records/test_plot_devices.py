"""devices.png: each worker's step rate and link rate by catalog device, on a synthetic run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from testbed.records.plot_devices import devices_figure, node_devices, step_rates
from testbed.records.reader import load_run

from helpers import WORKER_SPEED, make_run

DEVICES = {"w0": "raspberry-pi-4", "w1": "raspberry-pi-4", "w2": "raspberry-pi-3b"}


def _with_devices(run):
    meta = json.loads((run / "meta.json").read_text())
    for node, device in DEVICES.items():
        meta["nodes"][node]["device"] = {"device": device, "quota_cores": 0.2}
    (run / "meta.json").write_text(json.dumps(meta))
    return run


def test_step_rates_count_each_nodes_steps_per_window():
    steps = pd.DataFrame({"node": ["a"] * 10 + ["b"] * 2, "time": [0.5 * i for i in range(10)] + [1.0, 6.0]})
    r = step_rates(steps, window_s=2.5)
    a = r[r.node == "a"].set_index("time").rate.to_dict()
    assert a == {2.5: pytest.approx(5 / 2.5), 5.0: pytest.approx(5 / 2.5)}
    assert r[r.node == "b"].set_index("time").rate.to_dict() == {2.5: 0.4, 7.5: 0.4}


def test_node_devices_reads_only_well_formed_entries():
    meta = {"nodes": {"w0": {"device": {"device": "pixel-4"}}, "w1": {"device": "not a dict"},
                      "w2": {"device": {"device": 5}}, "ps": {"profile": {}}, "bad": []}}
    assert node_devices(meta) == {"w0": "pixel-4"}
    assert node_devices({}) == {} and node_devices({"nodes": []}) == {}


def test_the_figure_colours_workers_by_device_and_is_skipped_without_devices(tmp_path):
    assert devices_figure(load_run(make_run(tmp_path, "plain"))) is None
    rec = load_run(_with_devices(make_run(tmp_path, "fleet", events=False)))  # no event lines
    fig = devices_figure(rec)
    assert fig is not None
    ax_steps, ax_up, ax_down = fig.axes[:3]
    assert len(ax_steps.get_lines()) == len(WORKER_SPEED)  # a line per worker
    legend = [t.get_text() for t in ax_steps.get_legend().get_texts()]
    assert legend == ["raspberry-pi-3b (1)", "raspberry-pi-4 (2)"]
    colours = {tuple(line.get_color()) for line in ax_up.get_lines()}
    assert len(colours) == 2 and len(ax_up.get_lines()) == 3  # two devices, three workers' uplinks
    # w0 steps twice a second: its 5 s windows read 2 steps/s
    w0 = step_rates(rec.steps[rec.steps.node == "w0"])
    assert w0.rate.iloc[1:-1].tolist() == pytest.approx([2.0] * (len(w0) - 2))
