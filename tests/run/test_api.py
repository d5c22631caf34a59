"""The Python API (`import edgebed`, testbed.run.api): scenarios built and varied in Python and
validated like files, a run's records as DataFrames, a sweep; and examples/sweep.ipynb executed
(nbclient) so that it cannot rot."""

import os

import pytest

import edgebed
from edgebed import ScenarioError

from helpers import REPO, needs_root


def test_a_scenario_from_a_file_or_a_dict_with_changes_is_validated():
    base = edgebed.scenario(REPO / "scenarios" / "smoke.yaml", {"stop.seconds": 12, "algorithm": {"name": "bsp"}})
    assert base.stop.seconds == 12 and base.algorithm.name == "bsp" and base.stop.target_accuracy == 0.92  # merged
    other = edgebed.vary(base, {"workload": {"lr": 0.2}, "workers": [{"count": 3}]})
    assert other.workload.lr == 0.2 and other.n_workers == 3 and base.workload.lr != 0.2  # base unchanged
    from_dict = edgebed.scenario({"workers": [{"count": 2}]},
                                 {"algorithm.name": "ssp", "algorithm.params.staleness": 2})
    assert from_dict.algorithm.params == {"staleness": 2}


def test_a_bad_change_is_one_line_naming_the_field():
    base = edgebed.scenario({"workers": [{"count": 2}]})
    with pytest.raises(ScenarioError) as e:
        edgebed.vary(base, {"workload.lr": -1})
    assert e.value.lines == ["workload.lr: Input should be greater than 0"]
    with pytest.raises(ScenarioError) as e:
        edgebed.vary(base, {"algorithm.name": "nope"})
    assert len(e.value.lines) == 1 and e.value.lines[0].startswith("algorithm.name: unknown algorithm 'nope'")
    with pytest.raises(ValueError, match="workload.lr.x: 'lr' is not a mapping"):
        edgebed.vary(base, {"workload.lr.x": 1})


@needs_root
def test_run_in_python_gives_the_records_as_dataframes(tmp_path, clean_host):
    sc = edgebed.scenario({"name": "api", "runtime": "netns", "workload": {"dataset": "mnist5k", "model": "mlp",
                                                                            "eval_interval": 10},
                           "stop": {"seconds": 8}, "workers": [{"count": 2, "profile": {"cpus": 0.3}}]})
    result = edgebed.run(sc, tmp_path / "run")
    assert result.summary["status"] == "completed" and result.run_dir == (tmp_path / "run").resolve()
    assert len(result.steps) >= result.summary["steps"] > 0 and set(result.steps.node) == {"w0", "w1"}
    assert len(result.evals) > 0 and result.evals.accuracy.between(0, 1).all()
    assert result.meta["run_id"] and result.table("buffer.csv").empty
    isolated = edgebed.run(edgebed.vary(sc, {"stop.seconds": 5}), tmp_path / "again", isolated=True)
    assert isolated.summary["status"] == "completed" and len(isolated.steps) > 0  # `edgebed up` in a child


@needs_root
def test_the_sweep_notebook_runs(tmp_path, clean_host):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(REPO / "examples" / "sweep.ipynb", as_version=4)
    os.environ["EDGEBED_NOTEBOOK_OUT"] = str(tmp_path)  # the kernel inherits it
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(REPO / "examples")}}).execute()
    finally:
        del os.environ["EDGEBED_NOTEBOOK_OUT"]
    table = nb.cells[2].outputs[0]["data"]["text/plain"]
    assert "completed" in table and (tmp_path / "sweep.png").stat().st_size > 10_000
    assert len(list(tmp_path.glob("0*-lr-*"))) == 2  # a run folder per value
