"""A node's GPU, as its runtime gave it: which device (CUDA_VISIBLE_DEVICES, set before CUDA
starts), how much of its memory (`gpu_memory`: the allocator's cap, and MPS's pinned limit where
MPS runs) and how much of its compute (`gpu_share`: each step is followed by a pause that makes it take
1/share of its busy time).

The runtime says so in the environment: the variables below are read once, in the node."""

from __future__ import annotations

import os
import time
from typing import Optional

import torch

from testbed.errors import RunFailed

GPU_MEMORY_ENV = "EDGEBED_GPU_MEMORY"  # bytes
GPU_SHARE_ENV = "EDGEBED_GPU_SHARE"  # fraction in (0, 1]
GPU_SHARE_BY_ENV = "EDGEBED_GPU_SHARE_BY"  # "pace" (steps are paced here) or "mps" (the driver's cap alone)
# What a command workload's program gets as CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (program_env): not the
# roles, whose paced steps already hold the share (the two together overshoot: BENCHMARKS.md).
MPS_THREADS_ENV = "EDGEBED_GPU_MPS_THREADS"


def program_env(env: dict[str, str]) -> dict[str, str]:
    """A command workload's environment: MPS's thread percentage for its share, where one was given."""
    out = dict(env)
    threads = out.pop(MPS_THREADS_ENV, None)
    if threads is not None:
        out["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = threads
    return out


class GpuMemoryCapExceeded(RunFailed):
    """A node went past its profile's gpu_memory."""


def _env_float(name: str) -> Optional[float]:
    raw = os.environ.get(name, "")
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def memory_cap() -> Optional[int]:
    cap = _env_float(GPU_MEMORY_ENV)
    return None if cap is None else int(cap)


def pick_device(node: str = "", say=print) -> torch.device:
    """CUDA when the node sees a GPU, with its memory cap applied (and its log says which); else CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    cap = memory_cap()
    if cap is not None:  # the caching allocator refuses past it (OutOfMemoryError)
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / props.total_memory), dev)
    host_index = os.environ.get("CUDA_VISIBLE_DEVICES", "all")
    limits = [f"memory cap {cap / 2**30:.2f} GiB" if cap else "", share_text()]
    say(f"{node + ': ' if node else ''}training on {props.name} "
        f"(host GPU {host_index}{''.join(', ' + x for x in limits if x)})", flush=True)
    return dev


def share_text() -> str:
    share = _env_float(GPU_SHARE_ENV)
    return "" if share is None else f"share {share:g} by {os.environ.get(GPU_SHARE_BY_ENV, 'pace')}"


class StepPacer:
    """Holds a step to 1/share of its busy time where no driver mechanism caps the share."""

    def __init__(self, device: torch.device):
        share = _env_float(GPU_SHARE_ENV)
        paced = device.type == "cuda" and os.environ.get(GPU_SHARE_BY_ENV, "pace") == "pace"
        self.share = share if paced and share is not None and share < 1 else None
        self.paused_seconds = 0.0

    def after(self, busy_seconds: float) -> None:
        if self.share is None or busy_seconds <= 0:
            return
        pause = busy_seconds * (1 / self.share - 1)
        self.paused_seconds += pause
        time.sleep(pause)


def is_out_of_memory(err: BaseException) -> bool:
    """The allocator's refusal, or the driver's (MPS's pinned limit: `CUDA error: out of memory`)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or "CUDA error: out of memory" in str(err)


def cap_error(node: str, err: BaseException) -> GpuMemoryCapExceeded:
    """The error a node fails with past its gpu_memory (the allocator's own message kept, first line)."""
    cap = memory_cap()
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    what = f"its gpu_memory cap of {cap / 2**30:.2f} GiB" if cap else "the GPU's memory"
    return GpuMemoryCapExceeded(f"{node}: went past {what}: {first}")
