"""GPUs on every runtime: which devices a node sees, its memory and compute caps, and
the checks before bring-up. These run on the CPU: the GPU itself is benchmarks/gpu_check.sh's."""
import json
import time

import pytest
import torch

from testbed.kernel.gpus import HostGpu, parse_nvidia_smi
from testbed.plan import parse_scenario
from testbed.runtimes import preflight as pf
from testbed.runtimes.gpu_share import grant
from testbed.scenario.schema import Profile, ScenarioError

from env_probe import write_environment
from helpers import needs_root, netns_cluster

TWO_H100 = [HostGpu(0, "NVIDIA H100", 80 << 30), HostGpu(1, "NVIDIA H100", 80 << 30)]


def only_line(data: dict) -> str:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(data)
    assert len(e.value.lines) == 1, e.value.lines
    return e.value.lines[0]


@pytest.mark.parametrize("profile, line", [
    ({"gpus": 1, "gpu_share": 1.5}, "profiles.g.gpu_share: Input should be less than or equal to 1"),
    ({"gpus": 1, "gpu_share": 0}, "profiles.g.gpu_share: Input should be greater than 0"),
    ({"gpu_memory": "2g"}, "profiles.g: gpu_memory: caps a GPU, and this profile has none (gpus:)"),
    ({"gpus": 0, "gpu_share": 0.5}, "profiles.g: gpu_share: caps a GPU, and this profile has none (gpus:)"),
    ({"gpus": 1, "gpu_memory": "lots"}, "profiles.g.gpu_memory: 'lots' is not a size"),
])
def test_bad_gpu_fields_are_one_line_naming_the_field(profile, line):
    assert only_line({"profiles": {"g": profile}, "workers": [{"profile": "g"}]}).startswith(line)


def test_preflight_checks_gpus_against_what_this_machine_has():
    sc = parse_scenario({"runtime": "netns", "profiles": {"g": {"gpus": [1], "gpu_memory": "90g"}},
                         "workers": [{"profile": "g"}, {"profile": {"gpus": 3}}]})
    assert pf.host_gpu_problems(sc, []) == ["profiles.g.gpus: GPU 1 asked for, and this machine has none",
                                            "workers[1].profile.gpus: 3 GPUs asked for, and this machine has none"]
    assert pf.host_gpu_problems(sc, TWO_H100) == [
        "profiles.g.gpu_memory: 90 GiB is more than the GPU holds (80.0 GiB)",
        "workers[1].profile.gpus: 3 GPUs asked for, and this machine has 0-1"]
    fits = parse_scenario({"runtime": "netns", "profiles": {"g": {"gpus": [1], "gpu_memory": "8g", "gpu_share": 0.25}},
                           "workers": [{"count": 8, "profile": "g"}]})
    assert pf.host_gpu_problems(fits, TWO_H100) == []


def test_preflight_asks_the_host_for_netns_gpus(monkeypatch):
    monkeypatch.setattr(pf, "host_gpus", lambda: [TWO_H100[0]])
    with pytest.raises(ScenarioError) as e:
        pf.preflight(parse_scenario({"runtime": "netns", "profiles": {"g": {"gpus": [1]}},
                                     "workers": [{"profile": "g"}]}))
    assert e.value.lines == ["profiles.g.gpus: GPU 1 asked for, and this machine has 0"]


def test_a_node_sees_only_its_gpus_and_a_node_without_sees_none():
    assert grant(Profile(gpus=[1]), TWO_H100).env == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert grant(Profile(gpus=2), TWO_H100).env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert grant(Profile(gpus=1), TWO_H100).meta == {"gpus": [0], "gpu_names": ["NVIDIA H100"]}
    assert grant(Profile(cpus=0.5), TWO_H100).env == {"CUDA_VISIBLE_DEVICES": ""}


def test_shares_are_paced_steps_and_mps_threads_for_command_workloads():
    prof = Profile(gpus=[0], gpu_share=0.25, gpu_memory=2 << 30)
    paced = grant(prof, TWO_H100)
    assert paced.env["EDGEBED_GPU_SHARE"] == "0.25" and paced.env["EDGEBED_GPU_SHARE_BY"] == "pace"
    assert paced.env["EDGEBED_GPU_MEMORY"] == str(2 << 30) and "CUDA_MPS_PIPE_DIRECTORY" not in paced.env
    assert paced.meta["gpu_share_by"] == "paced steps" and paced.meta["gpu_memory_by"] == "torch allocator cap"
    mps = grant(prof, TWO_H100, "/run/x/pipe")
    assert mps.env["EDGEBED_GPU_MPS_THREADS"] == "25" and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in mps.env
    assert mps.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    two = grant(Profile(gpus=[0, 1], gpu_memory=2 << 30), TWO_H100, "/run/x/pipe")
    assert two.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M,1=2048M"  # each device the node sees
    assert mps.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/x/pipe" and mps.env["EDGEBED_GPU_SHARE_BY"] == "pace"
    assert mps.meta["gpu_share_by"] == "paced steps (roles); MPS active-thread percentage (command workloads)"


def test_nvidia_smi_rows_are_parsed_and_odd_ones_skipped():
    text = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100, 81559\n[N/A], x, y\n"
    assert parse_nvidia_smi(text) == [HostGpu(0, "NVIDIA H100 80GB HBM3", 81559 << 20),
                                      HostGpu(1, "NVIDIA H100", 81559 << 20)]


def test_a_paced_step_takes_one_over_its_share(monkeypatch):
    from testbed.node.gpu import StepPacer

    monkeypatch.setenv("EDGEBED_GPU_SHARE", "0.25")
    monkeypatch.setenv("EDGEBED_GPU_SHARE_BY", "pace")
    pacer = StepPacer(torch.device("cuda", 0))
    t = time.perf_counter()
    pacer.after(0.02)
    assert time.perf_counter() - t >= 0.06 and pacer.paused_seconds == pytest.approx(0.06)
    assert StepPacer(torch.device("cpu")).share is None  # a share caps a GPU only
    monkeypatch.setenv("EDGEBED_GPU_SHARE_BY", "mps")  # the driver caps it: no pause
    assert StepPacer(torch.device("cuda", 0)).share is None


def test_past_its_memory_cap_a_node_fails_naming_the_cap(monkeypatch):
    from testbed.node.gpu import GpuMemoryCapExceeded, cap_error, is_out_of_memory

    # the allocator's refusal, and the driver's under MPS's pinned limit (seen on an H100: AcceleratorError)
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory\nSearch for `cudaErrorMemoryAllocation'"))
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))

    monkeypatch.setenv("EDGEBED_GPU_MEMORY", str(1 << 30))
    err = cap_error("w3", torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore"))
    assert isinstance(err, GpuMemoryCapExceeded)
    assert str(err) == "w3: went past its gpu_memory cap of 1.00 GiB: CUDA out of memory. Tried to allocate 2.00 GiB"


@needs_root
@pytest.mark.root
def test_netns_nodes_get_their_gpus_and_meta_records_them(tmp_path, clean_host, monkeypatch, job_out):
    import testbed.runtimes.netns.runtime as netns_runtime

    monkeypatch.setattr(netns_runtime, "host_gpus", lambda: TWO_H100)
    with netns_cluster(tmp_path, {"name": "g", "profiles": {"g": {"gpus": [1], "gpu_share": 0.5, "gpu_memory": "4g"}},
                                  "workers": [{"count": 1, "profile": "g"}, {"count": 1}]}) as (rt, spec):
        outs = {n: job_out / f"{n}.json" for n in ("w0", "w1")}
        procs = [rt.start(n, write_environment, {"path": str(p)}) for n, p in outs.items()]
        for p in procs:
            p.join(30)
        seen = {n: json.loads(p.read_text()) for n, p in outs.items()}
        compute = rt.node_meta()["w0"]["compute"]
    assert seen["w0"] == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "EDGEBED_GPU_SHARE": "0.5",
                          "EDGEBED_GPU_MEMORY": str(4 << 30)}
    assert seen["w1"]["CUDA_VISIBLE_DEVICES"] == "" and seen["w1"]["EDGEBED_GPU_SHARE"] is None
    assert compute["gpus"] == [1] and compute["gpu_share"] == 0.5 and compute["gpu_memory_bytes"] == 4 << 30
    assert compute["gpu_share_by"] == "paced steps"  # no MPS daemon on this machine


def test_a_command_workload_gets_mps_threads_for_its_share():
    from testbed.node.gpu import program_env

    env = program_env(grant(Profile(gpus=[0], gpu_share=0.5), TWO_H100, "/run/x/pipe").env)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and "EDGEBED_GPU_MPS_THREADS" not in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in program_env(grant(Profile(gpus=[0], gpu_share=0.5), TWO_H100).env)


def test_a_step_that_runs_out_of_gpu_memory_fails_naming_the_cap(monkeypatch):
    from testbed.node.gpu import GpuMemoryCapExceeded, StepPacer
    from testbed.node.roles.common import device_step

    class Data:
        pacer = StepPacer(torch.device("cpu"))

    monkeypatch.setenv("EDGEBED_GPU_MEMORY", str(2 << 30))
    with pytest.raises(GpuMemoryCapExceeded, match="w1: went past its gpu_memory cap of 2.00 GiB: CUDA error: out"):
        with device_step(Data(), "w1"):
            raise RuntimeError("CUDA error: out of memory")
    with pytest.raises(ValueError):  # anything else is the step's own error
        with device_step(Data(), "w1"):
            raise ValueError("not a GPU matter")


def test_a_nodes_gpu_use_is_its_processes_by_nvml(monkeypatch):
    import sys
    import types

    from testbed.kernel.gpus import GpuProcessUse, gpu_process_use
    from testbed.runtimes.base import node_gpu_use

    class NVMLError(Exception):
        pass

    proc = lambda pid, mem: types.SimpleNamespace(pid=pid, usedGpuMemory=mem)  # noqa: E731
    sample = lambda pid, sm: types.SimpleNamespace(pid=pid, smUtil=sm)  # noqa: E731
    fake = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetComputeRunningProcesses=lambda h: ([proc(10, 100 << 20), proc(11, None)] if h == 0
                                                        else [proc(10, 50 << 20)]),
        nvmlDeviceGetProcessUtilization=lambda h, since: ([sample(10, 30), sample(12, 90)] if h == 0
                                                          else [sample(10, 45)]))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    use = gpu_process_use()
    assert use == {10: GpuProcessUse(150 << 20, 45), 11: GpuProcessUse(0, None), 12: GpuProcessUse(0, 90)}

    class Handle:
        compute = {"gpus": [0, 1]}

        class cgroup:
            pids = staticmethod(lambda: {10, 11, 99})

    assert node_gpu_use(Handle(), use) == (150 << 20, 45)
    Handle.compute = {}
    assert node_gpu_use(Handle(), use) == (None, None)  # a node without GPUs has no GPU columns


def test_a_command_workload_sees_no_gpu_without_one_and_its_mps_share_with_one(monkeypatch):
    from testbed.node.roles import command
    from testbed.node.roles.common import RoleConfig

    seen = {}
    monkeypatch.setattr(command.subprocess, "Popen", lambda argv, env, **kw: seen.update(env))
    cfg = RoleConfig(node="w0", role="worker", rank=0, run_dir="/r", t0=0.0, scenario={}, ps_address="10.0.0.2",
                     threads=1, workers=["w0"], addresses={"w0": "10.0.0.3"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what a node without GPUs starts with (gpu_share.grant)
    command._start(cfg, "{python} train.py", "/tmp/h")
    assert seen["CUDA_VISIBLE_DEVICES"] == ""  # kept although empty: an unset one would show every GPU
    for k, v in grant(Profile(gpus=[0], gpu_share=0.25), TWO_H100, "/run/x/pipe").env.items():
        monkeypatch.setenv(k, v)
    command._start(cfg, "{python} train.py", "/tmp/h")
    assert seen["CUDA_VISIBLE_DEVICES"] == "0" and seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
