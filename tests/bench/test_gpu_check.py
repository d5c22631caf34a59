"""The GPU check's dry run: on a machine without a GPU, benchmarks/gpu_check.sh runs its CPU
parts, says which GPU steps it skipped and why, and writes one JSON file. CI runs this."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check's full run is a benchmark, not a test")
def test_the_dry_run_runs_the_cpu_parts_and_names_each_skipped_gpu_step(tmp_path):
    out = tmp_path / "gpu_check.json"
    p = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["probe"]["cuda"] is False and report["probe"]["gpus"] == []
    for part in ("shares_pace", "shares_mps", "mps_threads_small", "mps_threads_large", "ddp", "smoke", "netns_shares"):
        assert report[part] == {"status": "skipped", "reason": "torch sees no CUDA device"}, part
    for batch in (32, 128):
        cpu = report["step_time"][f"cpu_b{batch}"]
        assert cpu["status"] == "ran" and cpu["device"] == "cpu" and cpu["steps"] == 40 and 0 < cpu["median_step_s"] < 5
    assert report["step_time"]["gpu"]["status"] == "skipped"
    assert "smoke: skipped" in p.stdout and f"written: {out}" in p.stdout
