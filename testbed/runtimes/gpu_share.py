"""Which GPUs a node on this machine sees and how much of them it may use (runtime netns; docker
and swarm hand the devices over through the engine and take the caps' environment from here).

Mechanisms, recorded per node in meta.json:
- visibility: CUDA_VISIBLE_DEVICES (with CUDA_DEVICE_ORDER=PCI_BUS_ID, so indices are the
  driver's); a node whose profile has no GPU gets an empty list and sees none;
- gpu_memory: the node's PyTorch allocator refuses past it (set_per_process_memory_fraction;
  node.gpu), and where an MPS daemon runs the driver also pins the client's memory
  (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), which holds for any code in the node;
- gpu_share: edgebed's roles pace their steps to 1/share of their busy time; a command workload's
  program, which nothing paces, gets MPS's active-thread percentage where an MPS daemon runs.
  Pacing is the roles' way because paced steps follow the share, while MPS's percentage leaves a
  small model's step time unchanged, slows a compute-bound one by less than the share says, and
  with pacing on top overshoots at small shares (BENCHMARKS.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from testbed.kernel.gpus import HostGpu
from testbed.kernel.parent_death import die_with_parent
from testbed.scenario.schema import Profile

MPS_CONTROL = "nvidia-cuda-mps-control"


@dataclass
class GpuGrant:
    """What one node gets: its devices, the environment that says so, and meta.json's entry."""
    devices: list[int]
    env: dict[str, str] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


def grant(prof: Profile, host: list[HostGpu], mps_pipe: Optional[str] = None) -> GpuGrant:
    """The GPUs of a profile on this machine: a list names the driver's indices, a count takes the
    first N (as `docker run --gpus N`); none hides them all."""
    if not prof.has_gpus():
        return GpuGrant([], {"CUDA_VISIBLE_DEVICES": ""}, {})
    devices = list(prof.gpus) if isinstance(prof.gpus, list) else [g.index for g in host[:int(prof.gpus)]]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    meta: dict = {"gpus": devices, "gpu_names": [g.name for g in host if g.index in devices]}
    env.update(cap_env(prof, mps_pipe, meta, len(devices)))
    return GpuGrant(devices, env, meta)


def cap_env(prof: Profile, mps_pipe: Optional[str], meta: dict, n_devices: int = 1) -> dict[str, str]:
    """The caps' environment (and meta.json's note of each mechanism); MPS pins each of the node's
    `n_devices` (numbered as the node sees them)."""
    from testbed.node.gpu import GPU_MEMORY_ENV, GPU_SHARE_BY_ENV, GPU_SHARE_ENV, MPS_THREADS_ENV

    env: dict[str, str] = {}
    if mps_pipe is not None and (prof.gpu_memory is not None or prof.gpu_share is not None):
        env.update(CUDA_MPS_PIPE_DIRECTORY=mps_pipe, CUDA_MPS_LOG_DIRECTORY=str(Path(mps_pipe).parent / "log"))
    if prof.gpu_memory is not None:
        env[GPU_MEMORY_ENV] = str(prof.gpu_memory)
        meta["gpu_memory_bytes"] = prof.gpu_memory
        meta["gpu_memory_by"] = "torch allocator cap"
        if mps_pipe is not None:
            mib = max(1, prof.gpu_memory >> 20)
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={mib}M" for i in range(max(1, n_devices)))
            meta["gpu_memory_by"] = "MPS pinned device memory limit + torch allocator cap"
    if prof.gpu_share is not None:  # paced steps hold the share; MPS's thread cap does not (BENCHMARKS.md)
        env.update({GPU_SHARE_ENV: f"{prof.gpu_share:g}", GPU_SHARE_BY_ENV: "pace"})
        meta.update(gpu_share=prof.gpu_share, gpu_share_by="paced steps")
        if mps_pipe is not None:  # for a command workload's program, which nothing paces
            env[MPS_THREADS_ENV] = f"{max(1, round(prof.gpu_share * 100))}"
            meta["gpu_share_by"] = "paced steps (roles); MPS active-thread percentage (command workloads)"
    return env


def wants_mps(profiles: list[Profile]) -> bool:
    return any(p.has_gpus() and (p.gpu_share is not None or p.gpu_memory is not None) for p in profiles)


class MpsDaemon:
    """A CUDA MPS control daemon for one run, in the foreground as the runner's child (it dies with
    the runner), its pipe and log folders in the run's own state folder."""

    def __init__(self, folder: Path):
        self.pipe, self.log = folder / "pipe", folder / "log"
        self.proc: Optional[subprocess.Popen] = None
        self.problem = ""

    def env(self) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe), "CUDA_MPS_LOG_DIRECTORY": str(self.log)}

    def start(self, devices: list[int], timeout: float = 10.0) -> bool:
        """True when the daemon answers; else `problem` says why (the caps fall back)."""
        exe = shutil.which(MPS_CONTROL)
        if exe is None:
            self.problem = f"{MPS_CONTROL} is not installed"
            return False
        for d in (self.pipe, self.log):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        env = {**self.env(), "CUDA_VISIBLE_DEVICES": ",".join(map(str, devices)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        self.proc = subprocess.Popen([exe, "-f"], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.problem = f"{MPS_CONTROL} exited with {self.proc.returncode} (see {self.log})"
                return False
            if self._ask("get_server_list") is not None:
                return True
            time.sleep(0.2)
        self.problem = f"{MPS_CONTROL} did not answer in {timeout:g} s"
        self.stop()
        return False

    def _ask(self, command: str) -> Optional[str]:
        try:
            out = subprocess.run([MPS_CONTROL], input=command + "\n", env=self.env(), capture_output=True, text=True,
                                 timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._ask("quit")
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None


def _die_with_parent() -> None:
    die_with_parent(signal.SIGTERM)
