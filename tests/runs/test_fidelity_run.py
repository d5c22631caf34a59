"""The fidelity monitor in a real run: 4 workers promised 0.8 core each (plus a small PS and
evaluator) on a 2-core machine. `edgebed up` warns before the start (meta.json's warnings too),
and the monitor flags the workers' intervals as starved: they wanted CPU and got clearly less than
their quota. Needs root (namespaces, cgroups); skipped on a machine with more than 2 CPUs, where
the same quotas would fit."""

import json
import os

import pytest
from helpers import needs_root, run_up, write_scenario

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]


def test_four_workers_at_0_8_cores_on_two_cores_are_flagged_starved(tmp_path, clean_host):
    cores = len(os.sched_getaffinity(0))
    if cores > 2:
        pytest.skip(f"this machine has {cores} CPUs: 4 x 0.8 cores would not oversubscribe it")
    scenario = write_scenario(tmp_path, {
        "name": "oversubscribed", "seed": 1, "runtime": "netns",
        "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05,
                     "eval_interval": 1000},
        "stop": {"seconds": 12},
        "algorithm": {"name": "asgd"},  # no barrier: each worker computes all the time
        # each device busy beyond its quota (stress in its own cgroup): it always wants its 0.8 core
        "profiles": {"small": {"cpus": 0.1},
                     "device": {"cpus": 0.8, "uplink": "20mbit", "stress": {"cpu": 1.0}}},
        "ps": {"profile": "small"}, "evaluator": {"profile": "small"},
        "workers": [{"count": 4, "profile": "device"}]})
    run_dir = tmp_path / "run"
    r = run_up(scenario, run_dir, timeout=300)
    warning = next(line for line in r.stdout.splitlines() if "promised" in line)
    assert warning.startswith("warning: host ") and "3.4 cores" in warning and f"has {cores}" in warning
    meta = json.loads((run_dir / "meta.json").read_text())
    assert any("3.4 cores" in w for w in meta["warnings"])
    fid = json.loads((run_dir / "summary.json").read_text())["fidelity"]
    assert fid["faithful"] is False
    for w in ("w0", "w1", "w2", "w3"):
        node = fid["nodes"][w]
        assert node["promised"] == pytest.approx(0.8)
        assert node["starved_seconds"] >= 3, (w, node)  # of ~12 s, most after the start
        for _, _, got, promised, wait in node["intervals"]:
            assert got < 0.9 * promised and wait >= 0.1
        assert node["starved_seconds"] >= 0.5 * node["judged"]
    assert "NOT faithful" in r.stdout and "starved" in r.stdout
    # the shaped uplinks were sampled (shaping.csv) and judged
    assert fid["links"]["w0/up"]["promised"] == 20e6 and fid["links"]["w0/up"]["judged"] >= 5
    from testbed.records.plotting import plot_run

    assert (run_dir / "plots" / "fidelity.png") in plot_run(run_dir)
