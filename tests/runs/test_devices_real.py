"""A device profile on the netns runtime, for real: calibrated at bring-up, its quota in the
node's cgroup, its calibration in meta.json, its training steps at the device's speed."""

import json
import re
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers import needs_root, start_up, write_scenario
from testbed.kernel import cgroups

SCENARIO = {
    "name": "device-real", "runtime": "netns", "seed": 1,
    "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 32, "eval_interval": 1000},
    "stop": {"steps": 24, "seconds": 120},
    "algorithm": {"name": "asgd"},
    "profiles": {"pi": {"device": "raspberry-pi-3b"}, "dc": {"cpus": 0.5}},
    "ps": {"profile": "dc"}, "evaluator": {"profile": "dc"},
    "workers": [{"count": 1, "profile": "pi"}],
}


def _quota_in_cgroup(run_id: str, node: str) -> tuple[float, int]:
    """(cores, memory limit) read from the node's cgroup files."""
    rel = f"{cgroups.TOP}/{run_id}/{node}"
    if cgroups.is_v2():
        quota, period = (cgroups.ROOT / rel / "cpu.max").read_text().split()
        return int(quota) / int(period), int((cgroups.ROOT / rel / "memory.max").read_text())
    cpu, mem = cgroups.v1_mount("cpu"), cgroups.v1_mount("memory")
    quota = int((cpu / rel / "cpu.cfs_quota_us").read_text())
    period = int((cpu / rel / "cpu.cfs_period_us").read_text())
    return quota / period, int((mem / rel / "memory.limit_in_bytes").read_text())


@needs_root
@pytest.mark.timeout(240)
@pytest.mark.serial  # it measures the host's speed: beside another lane the step came out at 0.76 of its target
def test_device_node_is_calibrated_and_its_quota_set(tmp_path, clean_host):
    """The quota alone (pace_steps: false): the calibrated quota in the node's cgroup."""
    sc = json.loads(json.dumps(SCENARIO))
    sc["profiles"]["pi"]["pace_steps"] = False
    run_dir = tmp_path / "run"
    proc = start_up(write_scenario(tmp_path, sc), run_dir)
    try:
        meta_path, seen = run_dir / "meta.json", None
        deadline = time.monotonic() + 120
        while seen is None and time.monotonic() < deadline and proc.poll() is None:
            if meta_path.exists():
                try:
                    meta = json.loads(meta_path.read_text())
                    seen = _quota_in_cgroup(meta["run_id"], "w0")
                except (ValueError, OSError):
                    pass
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert seen is not None, "the node's cgroup was never seen while the run ran"
    meta = json.loads(meta_path.read_text())
    dev = meta["nodes"]["w0"]["device"]
    cal = dev["calibration"]
    assert dev["device"] == "raspberry-pi-3b" and dev["gflops_per_core"] == 0.72 and dev["cores"] == 4
    assert cal["model"] == "adacomp_cnn" and cal["repetitions"] == 5 and len(cal["cpu_s"]) == 5
    assert cal["flops_per_step"] > 1e8
    assert dev["target_step_s"] == pytest.approx(cal["flops_per_step"] / (0.72 * 4 * 1e9))
    assert dev["first_quota_cores"] == pytest.approx(cal["cpu_s_median"] / dev["target_step_s"])
    assert seen[0] == pytest.approx(dev["quota_cores"], rel=0.01)  # the quota actually in the cgroup
    assert seen[1] == 2**30  # the Pi 3B's 1 GB as the memory limit
    assert meta["nodes"]["w0"]["cpu_basis"].startswith("device")
    assert meta["nodes"]["ps"]["cpu_basis"].startswith("host-relative")
    assert "w0: device raspberry-pi-3b on host" in out
    steps = pd.read_csv(Path(run_dir) / "steps.csv")
    # the mean: a step's compute time comes in whole 100 ms CFS periods (one or two at this quota)
    compute = steps[steps.node == "w0"].compute_seconds.iloc[4:].mean()
    # unthrottled this host takes a tenth of the target; at the quota about the target (the worker's
    # messages are paid from the same quota; edgebed bench device times the steps alone). The bounds
    # are loose on purpose: a quota's step cost moves between windows (BENCHMARKS.md, "The noise
    # floor"). What is checked here is that the quota throttles at all.
    assert 0.5 * dev["target_step_s"] <= compute <= 1.5 * dev["target_step_s"], (compute, dev)
    assert dev["correction"] == pytest.approx(dev["quota_cores"] / dev["first_quota_cores"])


@needs_root
@pytest.mark.timeout(240)
@pytest.mark.serial  # it measures the host's speed, as the test above
def test_a_paced_device_s_steps_take_its_time(tmp_path, clean_host):
    """Paced, a device profile's default: the quota has headroom (PACE_HEADROOM x what the steps
    need) and the worker holds each step's compute to the device's time, so the mean lands on the
    target from above (a throttled overrun is made up by the next pauses) rather than around it."""
    from testbed.run.devices import PACE_HEADROOM

    run_dir = tmp_path / "run"
    proc = start_up(write_scenario(tmp_path, SCENARIO), run_dir)
    out, _ = proc.communicate(timeout=200)
    assert proc.returncode == 0, out[-3000:]
    dev = json.loads((run_dir / "meta.json").read_text())["nodes"]["w0"]["device"]
    assert dev["paced"] is True and dev["batch_size"] == 32
    assert dev["first_quota_cores"] == pytest.approx(PACE_HEADROOM * dev["needed_cores"], rel=0.01)
    assert dev["quota_cores"] >= dev["first_quota_cores"]  # a paced check only raises it
    assert "steps paced" in out
    steps = pd.read_csv(run_dir / "steps.csv")
    compute = steps[steps.node == "w0"].compute_seconds.iloc[4:]
    # the step's own work is paced; the batch's fetch before it is not (a little over the target)
    assert dev["target_step_s"] <= compute.median() <= 1.3 * dev["target_step_s"], (compute.describe(), dev)


@needs_root
@pytest.mark.timeout(300)
@pytest.mark.serial  # it measures the host's speed, as the tests above
def test_a_device_that_needs_more_than_a_core_trains_on_two_threads(tmp_path, clean_host):
    """A two-core device at 1.16x this host's speed per core (on the run's model): one thread cannot keep up with it, so it is measured again on two and trains on two.
    Its quota alone (pace_steps: false: a paced quota's headroom would take the whole host) and
    the PS and evaluator at 0.2 each fit this machine's 2 cores. 1.16x, not more: two threads
    cost this host about 26% more CPU a step than one (about 1.46 cores then). Two threads on a
    2-CPU machine measure noisily (1.34-2.12 cores in six tries here): one that measures past what
    the host gives is refused before training, with the need its two threads measured, which is
    this test's other correct outcome (one thread needs about 1.16 cores and is never refused); the
    node's own calibration may also find the host faster than this test did, and one thread
    enough, a third (rare) outcome whose record says so."""
    import os

    from testbed.node.calibrate import measure_steps

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine gives this process one CPU: a two-thread device cannot be tried")
    host = measure_steps("adacomp_cnn", "mnist5k", seed=1, batch_size=32, repetitions=5, min_rep_s=0.5)
    host_gflops = host["flops_per_step"] / host["cpu_s_median"] / 1e9  # one thread, no quota
    sc = json.loads(json.dumps(SCENARIO))
    sc["profiles"] = {"pi": {"speed": {"gflops": round(0.58 * host_gflops, 3), "cores": 2}, "pace_steps": False},
                      "dc": {"cpus": 0.2}}
    # a step here takes about 12 ms: 24 steps are 2-3 of the quota's 100-ms periods, and a mean over
    # so few whole and part periods moved 0.97-1.53x the target (CI); 300 steps span about 36
    sc["stop"]["steps"] = 300
    run_dir = tmp_path / "run"
    proc = start_up(write_scenario(tmp_path, sc), run_dir)
    out, _ = proc.communicate(timeout=280)
    refused = re.search(r"DeviceRefused: w0: device speed \S+ is faster than host \S+ can give: it needs "
                        r"([0-9.]+) cores", out)
    if refused:  # measured on two threads past the host's 2 CPUs: more than one thread ever needs here
        assert proc.returncode == 1 and 1.5 < float(refused.group(1)), out[-3000:]
        steps = run_dir / "steps.csv"
        assert not steps.exists() or pd.read_csv(steps).empty  # before any training
        return
    assert proc.returncode == 0, out[-3000:]
    meta = json.loads((run_dir / "meta.json").read_text())
    dev = meta["nodes"]["w0"]["device"]
    if "one_thread" not in dev:  # one thread was enough on the node's own measurement
        assert dev["needed_cores"] <= 1.0 and dev["threads"] == dev["calibration"]["threads"] == 1, dev
        return
    assert dev["one_thread"]["needed_cores"] > 1.0, dev
    assert 1.0 < dev["needed_cores"] <= 2.0, dev  # 1.16 on one thread, more on two
    assert dev["threads"] == 2 and dev["calibration"]["threads"] == 2 and meta["nodes"]["w0"]["threads"] == 2
    assert "2 thread(s)" in out
    steps = pd.read_csv(run_dir / "steps.csv")
    compute = steps[steps.node == "w0"].compute_seconds.iloc[4:].mean()
    # loose, as the quota-alone test above: a quota's step cost moves 5-28% between windows; one
    # thread under this quota could not reach the target (it needs more than a core)
    assert 0.5 * dev["target_step_s"] <= compute <= 1.5 * dev["target_step_s"], (compute, dev)
