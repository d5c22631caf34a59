"""This machine's GPUs, read without initialising CUDA (a process that has touched CUDA cannot
fork usable children, and the runner forks every netns node): NVML where `nvidia-ml-py` is
installed, else `nvidia-smi`, else none.

Indices are the driver's (PCI bus order, as nvidia-smi prints them); nodes get
CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA counts them the same way.
"""

from __future__ import annotations

import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class HostGpu:
    index: int
    name: str
    memory_bytes: int


def host_gpus() -> list[HostGpu]:
    """Every GPU the driver shows; [] without a driver."""
    found = _from_nvml()
    return found if found is not None else (_from_nvidia_smi() or [])


@contextmanager
def _nvml():
    """NVML, initialised for the block (None where it is not installed or finds no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # ImportError, or NVMLError: no driver
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _from_nvml() -> Optional[list[HostGpu]]:
    with _nvml() as nvml:
        if nvml is None:
            return None
        try:
            out = []
            for i in range(nvml.nvmlDeviceGetCount()):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(h)
                out.append(HostGpu(i, name.decode() if isinstance(name, bytes) else str(name),
                                   int(nvml.nvmlDeviceGetMemoryInfo(h).total)))
            return out
        except nvml.NVMLError:
            return None


@dataclass(frozen=True)
class GpuProcessUse:
    memory_bytes: int
    sm_percent: Optional[int]  # the most recent utilisation sample NVML has for the process


def gpu_process_use() -> dict[int, GpuProcessUse]:
    """Per process id, what it holds of the GPUs now (summed over them): {} without NVML."""
    with _nvml() as nvml:
        if nvml is None:
            return {}
        try:
            use: dict[int, list] = {}
            for i in range(nvml.nvmlDeviceGetCount()):
                _add_device_use(nvml, nvml.nvmlDeviceGetHandleByIndex(i), use)
            return {pid: GpuProcessUse(m, u) for pid, (m, u) in use.items()}
        except nvml.NVMLError:
            return {}


def _add_device_use(pynvml, handle, use: dict[int, list]) -> None:
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        entry = use.setdefault(int(p.pid), [0, None])
        entry[0] += int(p.usedGpuMemory or 0)
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, 0)  # 0: every sample the driver keeps
    except pynvml.NVMLError:  # no samples yet, or not on this GPU
        return
    for s in samples:
        entry = use.setdefault(int(s.pid), [0, None])
        entry[1] = max(entry[1] or 0, int(s.smUtil))


def _from_nvidia_smi() -> Optional[list[HostGpu]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        text = subprocess.run([exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(text)


def parse_nvidia_smi(text: str) -> list[HostGpu]:
    """Rows of `index, name, memory.total (MiB)`; rows of another shape are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
            out.append(HostGpu(int(parts[0]), parts[1], int(parts[2]) << 20))
    return out
