"""A switch past one bridge, for real (netns): with EDGEBED_TEST_BRIDGE_PORTS the trees of bridges
that 1,023+ nodes need are made for a handful, so a short training run crosses leaves on the data
switch (PS and workers on different leaves), on the control switch (the runner at the root) and,
with sites, beside a router on the root. `benchmarks/fleet_bringup.py` does it at 1,100 workers."""

import json
import os

import pytest
import yaml
from helpers import REPO, needs_root, run_up, write_scenario

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]


def _env(ports: int) -> dict:
    return {**os.environ, "EDGEBED_TEST_BRIDGE_PORTS": str(ports)}


def test_a_run_across_leaf_bridges_trains_and_leaves_nothing(tmp_path, clean_host):
    data = {"name": "tree", "seed": 1, "runtime": "netns",
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_interval": 10},
            "stop": {"steps": 40, "seconds": 60}, "algorithm": {"name": "bsp"},
            "profiles": {"edge": {"cpus": 0.2, "bandwidth": "50mbit"}}, "workers": [{"count": 6, "profile": "edge"}]}
    run_dir = tmp_path / "run"
    run_up(write_scenario(tmp_path, data), run_dir, "-q", timeout=200, env=_env(5))  # leaves of 3: 8 nodes, 3 leaves
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] >= 40, summary  # BSP: every worker, every step
    assert summary["final_accuracy"] > 0.5, summary


def test_sites_with_routers_across_leaf_bridges(tmp_path, clean_host):
    data = yaml.safe_load((REPO / "scenarios/topologies/dlion-p-network.yaml").read_text())
    data.update(runtime="netns", stop={"steps": 30, "seconds": 60})
    data["workers"] = [{"count": 4, "site": "a", "profile": "worker"}, {"count": 3, "site": "b", "profile": "worker"}]
    run_dir = tmp_path / "run"
    run_up(write_scenario(tmp_path, data), run_dir, "-q", timeout=200, env=_env(4))  # site a: 6 nodes + router
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] >= 30, summary
