"""energy.csv, summary.json's `energy` and energy.png, from a small synthetic run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from testbed.records import energy
from testbed.records.plot_energy import energy_figure
from testbed.records.plotting import plot_run
from testbed.records.reader import load_run

from helpers import WORKER_SPEED, make_run

POWER = {"w0": ("t4", 10.0, 70.0), "w1": ("raspberry-pi-4", 2.0, 5.0)}  # w2: no device


def _with_power(run):
    meta = json.loads((run / "meta.json").read_text())
    for node, (device, idle, active) in POWER.items():
        meta["nodes"][node]["device"] = {"device": device, "power": {"idle_w": idle, "active_w": active,
                                                                     "source": "a data sheet", "estimate": True}}
    (run / "meta.json").write_text(json.dumps(meta))
    return run


def test_a_step_is_active_for_its_compute_and_idle_for_the_rest_of_its_interval():
    steps = pd.DataFrame({"time": [1.0, 3.0, 4.0, 2.0], "node": ["a", "a", "a", "b"], "step": [1, 2, 3, 1],
                          "compute_seconds": [0.5, 0.5, 2.0, 1.0], "model_version": [0, 1, 2, 0]})
    meta = {"nodes": {"a": {"device": {"device": "d", "power": {"idle_w": 1, "active_w": 10}}}}}
    t = energy.energy_table(steps, meta)
    assert t["node"].tolist() == ["a", "a", "a"]  # b has no power: no rows
    # first step: its compute alone; then 2 s apart with 0.5 s active; a step longer than its interval is all active
    assert t["active_seconds"].tolist() == [0.5, 0.5, 1.0]
    assert t["idle_seconds"].tolist() == [0.0, 1.5, 0.0]
    assert t["joules"].tolist() == pytest.approx([5.0, 5.0 + 1.5, 10.0])
    assert t["round"].tolist() == [0, 1, 2]  # without rounds.csv: the model version a step trained from


def test_rounds_csv_assigns_each_step_to_the_round_it_ended_in():
    steps = pd.DataFrame({"time": [1.0, 2.0, 3.0, 9.0], "node": ["a"] * 4, "step": [1, 2, 3, 4],
                          "compute_seconds": [1.0] * 4, "model_version": [0] * 4})
    meta = {"nodes": {"a": {"device": {"device": "d", "power": {"idle_w": 0, "active_w": 2}}}}}
    rounds = pd.DataFrame({"time": [2.5, 5.0], "round": [1, 2]})
    t = energy.energy_table(steps, meta, rounds)
    assert t["round"].tolist()[:3] == [1, 1, 2] and pd.isna(t["round"].iloc[3])


def test_the_run_s_energy_table_and_summary(tmp_path):
    run = _with_power(make_run(tmp_path))
    summary = energy.assess_run(run)
    table = pd.read_csv(run / energy.ENERGY_FILE)
    assert list(table.columns) == energy.ENERGY_COLUMNS
    assert set(table["node"]) == {"w0", "w1"}
    # w0 steps every 0.5 s computing 0.4 s: 0.4 x 70 + 0.1 x 10 = 29 J a step (the first: 28 J)
    w0 = summary["nodes"]["w0"]
    n0 = int(40 * WORKER_SPEED["w0"])
    assert w0["steps"] == n0 and w0["joules"] == pytest.approx(28 + 29 * (n0 - 1))
    assert w0["active_seconds"] == pytest.approx(0.4 * n0) and w0["idle_seconds"] == pytest.approx(0.1 * (n0 - 1))
    # w1 steps every second computing 0.8 s: 0.8 x 5 + 0.2 x 2 = 4.4 J, one step a round (the model version)
    w1 = summary["nodes"]["w1"]
    assert w1["joules_per_step"] == pytest.approx((4.0 + 4.4 * 39) / 40) and w1["rounds"] == 40
    assert w1["joules_per_round"] == pytest.approx(w1["joules_per_step"])
    assert summary["total_joules"] == pytest.approx(w0["joules"] + w1["joules"])
    assert summary["without_power"] == ["w2"] and "no energy rows" in summary["note"]


def test_a_run_without_device_power_has_an_empty_table_and_no_figure(tmp_path):
    run = make_run(tmp_path)
    summary = energy.assess_run(run)
    assert summary["nodes"] == {} and summary["total_joules"] == 0
    assert summary["without_power"] == ["w0", "w1", "w2"]
    assert pd.read_csv(run / energy.ENERGY_FILE).empty
    assert energy_figure(load_run(run)) is None


def test_energy_png_draws_each_powered_node(tmp_path):
    run = _with_power(make_run(tmp_path, events=False))
    fig = energy_figure(load_run(run))
    ax_total, ax_round = fig.axes[:2]
    assert len(ax_total.get_lines()) == 2 and len(ax_round.get_lines()) == 2
    last = max(float(line.get_ydata()[-1]) for line in ax_total.get_lines())
    assert last == pytest.approx(energy.assess_run(run)["nodes"]["w0"]["joules"])  # cumulative ends at the total
    assert [t.get_text() for t in ax_total.get_legend().get_texts()] == ["raspberry-pi-4", "t4"]
    assert (run / "plots" / "energy.png") in plot_run(run)


def test_node_power_reads_only_well_formed_entries():
    meta = {"nodes": {"a": {"device": {"device": "x", "power": {"idle_w": 1, "active_w": 2}}},
                      "b": {"device": {"device": "y", "power": {"idle_w": 3, "active_w": 2}}},  # idle above active
                      "c": {"device": {"device": "z", "power": "hot"}}, "d": {"device": {"device": "w"}}, "e": []}}
    assert energy.node_power(meta) == {"a": ("x", 1.0, 2.0)}
    assert energy.node_power({}) == {} and energy.node_power({"nodes": []}) == {}


def test_energy_and_fidelity_tables_replace_a_link_planted_in_their_place(tmp_path):
    import pandas as pd

    from testbed.records import energy, fidelity

    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    for name in (energy.ENERGY_FILE, fidelity.FIDELITY_FILE):
        (tmp_path / name).symlink_to(target)
    energy.write_table(tmp_path, pd.DataFrame(columns=energy.ENERGY_COLUMNS))
    fidelity.write_table(tmp_path, [])
    assert target.read_text() == "keep\n"
    assert not (tmp_path / energy.ENERGY_FILE).is_symlink() and not (tmp_path / fidelity.FIDELITY_FILE).is_symlink()
    assert (tmp_path / fidelity.FIDELITY_FILE).read_text().startswith("kind,name,start")
