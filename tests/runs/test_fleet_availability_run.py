"""scenarios/fleet/availability.yaml at 200 devices, as CI runs it: devices that come
and go (a seeded on/off model), FedAvg selecting 26 of those online each round, and per-round
trainers, to the target accuracy in a few minutes on this 2-core machine."""

import json

import pandas as pd
import yaml
from helpers import REPO, run_up, write_scenario


def test_two_hundred_devices_that_come_and_go_reach_the_target_with_per_round_trainers(tmp_path, clean_host):
    data = yaml.safe_load((REPO / "scenarios/fleet/availability.yaml").read_text())
    data["workers"][0]["count"] = 200
    data["stop"] = {"seconds": 240, "target_accuracy": 0.8}  # measured: 0.85 at 120 and 150 s, 3 min in all
    run_dir = tmp_path / "run"
    run_up(write_scenario(tmp_path, data), run_dir, "-q", timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reason"] == "target_accuracy", summary
    rounds = pd.read_csv(run_dir / "rounds.csv", keep_default_na=False)
    online = rounds.online.map(lambda s: set(s.split()))
    selected = rounds.selected.map(lambda s: set(s.split()))
    assert all(sel <= on for sel, on in zip(selected, online))
    assert ((rounds.n_selected == rounds.n_online.clip(upper=26)) | (rounds.n_online < 26)).all()
    assert rounds.n_online.min() < 200 and rounds.n_online.max() < 200  # some are always away
    trainers = summary["trainers"]
    assert trainers["started"] >= rounds.n_selected.sum() * 0.5 and trainers["failed"] == 0, trainers
    steps = pd.read_csv(run_dir / "steps.csv")
    assert steps.node.nunique() < 200 and steps.node.nunique() >= 26  # only the drawn ever trained
    events = pd.read_csv(run_dir / "events.csv")
    assert (events.detail.str.startswith("availability: offline")).sum() > 20
