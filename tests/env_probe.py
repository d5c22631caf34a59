"""A node job for tests/runtimes/test_gpus.py, in a module without torch: a job's module is imported in the
node before it drops its capabilities, which needs the process to have one thread (torch's import
can start one)."""
import json
import os
from pathlib import Path


def write_environment(path):
    Path(path).write_text(json.dumps({k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                                                                       "EDGEBED_GPU_SHARE", "EDGEBED_GPU_MEMORY")}))
