"""fleet.png's numbers: devices online from the availability events, and each round's
time split into training, transfer and waiting for stragglers."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from testbed.records.columns import EVAL_COLUMNS, EVENT_COLUMNS, ROUND_COLUMNS, STEP_COLUMNS
from testbed.records.plot_fleet import online_over_time, round_split
from testbed.records.plotting import plot_run


def _events(rows):
    return pd.DataFrame(rows, columns=EVENT_COLUMNS)


def test_online_over_time_counts_partitions_down_and_heals_up_and_nothing_else():
    events = _events([
        (1.0, 0, "w1", "partition", "availability: offline; peers=[...]", ),
        (1.0, 0, "w1", "pause", "availability: offline;  -> frozen"),
        (2.0, 0, "w2", "partition", "availability: offline; peers=[...]"),
        (3.0, 10, "w3", "partition", "a timeline's partition"),  # not availability: no change
        (4.0, 0, "w1", "heal", "availability: online again; peers=[]"),
        (4.0, 0, "w1", "resume", "availability: online again"),
    ])
    series = online_over_time(events, workers=5)
    assert series["time"].tolist() == [0.0, 1.0, 2.0, 4.0]
    assert series["online"].tolist() == [5, 4, 3, 4]


def test_a_round_splits_into_the_mean_client_training_transfer_and_waiting():
    rounds = pd.DataFrame([{"round": 3, "open_seconds": 10.0, "finished": "a b", "report_seconds": "4.000 6.000"},
                           {"round": 4, "open_seconds": 5.0, "finished": "", "report_seconds": ""},
                           {"round": 5, "open_seconds": 5.0, "finished": "a", "report_seconds": ""}])
    steps = pd.DataFrame({"node": ["a", "a", "b", "b", "a"], "model_version": [3, 3, 3, 2, 4],
                          "compute_seconds": [1.0, 1.0, 3.0, 9.0, 7.0]})
    split = round_split(rounds, steps)
    # a: trained 2 of its 4 s, b: 3 of its 6 s (its step on round 2's model is another round's)
    assert split.iloc[0].tolist() == pytest.approx([3, 2.5, 2.5, 5.0])  # waiting: 10 - mean(4, 6)
    assert split["round"].tolist() == [3, 4, 5]
    assert split.iloc[1:][["training", "transfer", "waiting"]].isna().all().all()


def test_training_never_counts_more_than_the_time_to_the_report():
    rounds = pd.DataFrame([{"round": 0, "open_seconds": 2.0, "finished": "a", "report_seconds": "1.000"}])
    steps = pd.DataFrame({"node": ["a"], "model_version": [0], "compute_seconds": [1.5]})
    assert round_split(rounds, steps).iloc[0].tolist() == pytest.approx([0, 1.0, 0.0, 1.0])


def test_a_fleet_run_gets_fleet_png(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    nodes = {"ps": {"role": "ps"}, "eval": {"role": "evaluator"}, **{f"w{i}": {"role": "worker"} for i in range(4)}}
    (run / "meta.json").write_text(json.dumps({"run_id": "abcdef", "nodes": nodes}))
    pd.DataFrame([(1.0 + i, "w0", i + 1, 2.0, 32, 0.1, 0, 0, 0.2, 0.1, i, "") for i in range(10)],
                 columns=STEP_COLUMNS).to_csv(run / "steps.csv", index=False)
    pd.DataFrame([(2.0 * i, i, 0, 0.1 * i, 1.0, 100, 2.0 * i, "eval") for i in range(10)],
                 columns=EVAL_COLUMNS).to_csv(run / "eval.csv", index=False)
    pd.DataFrame([(2.0, 0, "w3", "partition", "availability: offline; peers=[]")],
                 columns=EVENT_COLUMNS).to_csv(run / "events.csv", index=False)
    pd.DataFrame([(1.5 + i, i, "reports", 1.0, 4, 2, 2, 0, "w0 w1 w2 w3", "w0 w1", "w0 w1", "", "0.500 0.800")
                  for i in range(10)], columns=ROUND_COLUMNS).to_csv(run / "rounds.csv", index=False)
    written = plot_run(run)
    fleet = run / "plots" / "fleet.png"
    assert fleet in written and fleet.stat().st_size > 10_000
    assert np.isfinite(round_split(pd.read_csv(run / "rounds.csv", dtype={"report_seconds": str}),
                                   pd.read_csv(run / "steps.csv"))["waiting"]).all()
