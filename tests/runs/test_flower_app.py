"""An unmodified Flower app (examples/flower-app) on emulated edge devices: the SuperLink on the
ps node, a SuperNode on each of 2 workers, `flwr run` from the evaluator node, Flower from
`make flower-venv` (which `make test` runs first). The app's rounds finish, each round's model
crosses every worker's shaped link both ways, the ServerApp's and ClientApps' reports land in
the records, and nothing of Flower's is left running."""

import json
import subprocess
import time

import pandas as pd
import pytest
import yaml

from helpers import REPO, needs_root, run_up

FLOWER = REPO / ".venv-flower" / "bin" / "flower-superlink"
ROUNDS = 3


def _flower_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-fa", "flower-super|flwr-"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


@needs_root
@pytest.mark.root
@pytest.mark.slow
def test_a_flower_app_finishes_its_rounds_over_the_shaped_links(tmp_path, clean_host):
    if not FLOWER.exists():
        pytest.skip("Flower is not installed: `make flower-venv` (PyPI's flwr==1.42.0) did not succeed")
    from testbed.bench.flower_app import round_costs
    from testbed.records.reader import load_run

    data = yaml.safe_load((REPO / "scenarios" / "byo" / "flower.yaml").read_text())
    data["workload"]["command"]["evaluator"] = data["workload"]["command"]["evaluator"].replace(
        "num-server-rounds=5", f"num-server-rounds={ROUNDS}")
    path, run_dir = tmp_path / "flower.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(data))
    run_up(path, run_dir, "-q", timeout=400)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reason"] == "commands", summary
    rec = load_run(run_dir)
    assert rec.evals.step.tolist() == list(range(ROUNDS + 1))  # the initial model, then every round
    assert rec.evals.accuracy.iloc[0] < 0.3 and summary["final_accuracy"] > 0.85, rec.evals
    # each SuperNode reported its training loss for every round (its own process each round)
    assert sorted(rec.steps.groupby("node").step.apply(sorted).to_dict().items()) == \
        [("w0", list(range(1, ROUNDS + 1))), ("w1", list(range(1, ROUNDS + 1)))]
    report = pd.read_csv(run_dir / "report.csv")
    costs = round_costs(report, rec.traffic, 20e6)
    model_bytes = 0.56e6  # the ArrayRecord Flower reports for the app's CNN
    for way in ("down", "up"):  # the model each way, each round, through the worker's own link
        assert model_bytes <= costs[f"{way}_bytes_per_round"] <= 1.5 * model_bytes, costs
    assert f"[ROUND {ROUNDS}/{ROUNDS}]" in (run_dir / "logs" / "eval.log").read_text()
    assert "Uvicorn running on http://0.0.0.0:8000" in (run_dir / "logs" / "ps.log").read_text()
    for _ in range(20):  # the SuperExecs detach into sessions of their own: the cgroups take them
        if not _flower_processes():
            break
        time.sleep(0.5)
    assert not _flower_processes()
    assert not list(__import__("pathlib").Path("/tmp").glob("edgebed-home-*"))
