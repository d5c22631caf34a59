"""What a valid scenario needs from this machine's engines, asked after validation and before
bring-up: validation (testbed.scenario) is pure and contacts no engine."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from testbed import runtimes
from testbed.kernel.gpus import HostGpu, host_gpus
from testbed.scenario.schema import Profile, Scenario, ScenarioError, gpu_profiles, profile_refs
from testbed.scenario.units import parse_cpuset


def engine_problems(sc: Scenario) -> list[str]:
    """One line per field whose need this machine's engines cannot meet on the scenario's runtime
    (its `problems`; under auto, the runtime's that auto would pick)."""
    return runtimes.engine_problems(sc)


def host_gpu_problems(sc: Scenario, have: list[HostGpu] | None = None) -> list[str]:
    """GPUs a profile asks for that this machine lacks, and memory caps over what its GPUs hold."""
    have = host_gpus() if have is None else have
    by_index = {g.index: g for g in have}
    listed = "none" if not have else _ranges(sorted(by_index))
    lines = []
    for where, prof in gpu_profiles(sc):
        wanted = prof.gpus if isinstance(prof.gpus, list) else list(range(int(prof.gpus)))
        missing = [i for i in wanted if i not in by_index]
        if missing:
            what = f"{len(wanted)} GPUs" if not isinstance(prof.gpus, list) else f"GPU {missing[0]}"
            lines.append(f"{where}: {what} asked for, and this machine has {listed}")
            continue
        smallest = min(by_index[i].memory_bytes for i in wanted)
        if prof.gpu_memory is not None and prof.gpu_memory > smallest:
            lines.append(f"{where[:-len('gpus')]}gpu_memory: {prof.gpu_memory / 2**30:g} GiB is more than the GPU "
                         f"holds ({smallest / 2**30:.1f} GiB)")
    return lines


def cpuset_problems(sc: Scenario, available: set[int] | None = None) -> list[str]:
    """A profile pinned to CPUs this machine does not have (the kernel would refuse it mid-bring-up)."""
    have = available if available is not None else os.sched_getaffinity(0)
    pinned = [(f"profiles.{n}.cpuset", p.cpuset) for n, p in sc.profiles.items() if p.cpuset]
    pinned += [(f"{w}.cpuset", ref.cpuset) for w, ref in profile_refs(sc) if isinstance(ref, Profile) and ref.cpuset]
    lines = []
    for where, cpuset in pinned:
        missing = sorted(parse_cpuset(cpuset) - have)
        if missing:
            lines.append(f"{where}: CPU {missing[0]} is not on this machine (it has {_ranges(sorted(have))})")
    return lines


def _ranges(ids: list[int]) -> str:
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def user_code(sc: Scenario) -> list[tuple[str, str]]:
    """(field, name) of each plugin the scenario names: not one of edgebed's own."""
    from testbed import plugins

    out = []
    for field, kind, ref in (("algorithm.name", "algorithm", sc.algorithm.name),
                             ("workload.model", "model", sc.workload.model),
                             ("workload.dataset", "dataset", sc.workload.dataset)):
        ep = plugins.registered(kind).get(ref.split(":")[0] if kind == "dataset" else ref)
        if ep is None or not ep.value.startswith("testbed."):
            out.append((field, ref))
    return out


def _is_package(path: Path) -> bool:
    return (path.is_dir() and any((path / f).is_file() for f in ("pyproject.toml", "setup.py"))) or \
        (path.is_file() and path.suffix == ".whl")


def shard_problems(sc: Scenario) -> list[str]:
    """More workers than training samples: each worker's partition needs one of its own (every
    worker would exit with the partition's error once started). Datasets whose size is known
    before loading: edgebed's own (a plugin's is loaded by plugin_problems)."""
    from testbed.data.datasets import edgebeds_own, known_train_size

    wl = sc.workload
    if not edgebeds_own(wl.dataset):
        return []
    size = known_train_size(wl.dataset, wl.test_size)
    if size is None:
        return []
    if wl.train_fraction is not None:
        size = max(1, round(wl.train_fraction * size))
    if sc.n_workers <= size:
        return []
    return [f"workers: {sc.n_workers} workers and {size} training samples in workload.dataset '{wl.dataset}'"
            f"{' (its train_fraction)' if wl.train_fraction is not None else ''}: each worker needs one of its "
            "own (a larger dataset, such as mnist, or fewer workers)"]


def plugin_problems(sc: Scenario) -> list[str]:
    """A plugin's model or dataset, tried before anything starts: the dataset loads, and the model
    takes two of its samples and gives (2, classes) logits. (edgebed's own are tested; a plugin's
    strategy is checked by validation: its class and Params.)"""
    from testbed.data.datasets import DatasetError, load_dataset
    from testbed.data.models import ModelError, check_model

    wl = sc.workload
    theirs = [field for field, _ in user_code(sc)]
    missing = [f"packages.{i}: {p} is neither a folder with a pyproject.toml or setup.py nor a wheel"
               for i, p in enumerate(sc.packages) if not _is_package(Path(p))]
    if missing:
        return missing
    refused = runtimes.plugin_refusals(sc, user_code(sc))  # nodes that cannot run a user's package
    if refused:
        return refused
    if "workload.model" not in theirs and "workload.dataset" not in theirs:
        return []
    try:
        ds = load_dataset(wl.dataset, seed=sc.seed, test_size=wl.test_size)
    except DatasetError as e:
        return [f"workload.dataset: {e}"]
    except Exception as e:  # a plugin's own failure
        return [f"workload.dataset: '{wl.dataset}' failed: {type(e).__name__}: {e}"]
    if sc.n_workers > len(ds.train_y):
        return [f"workers: {sc.n_workers} workers and {len(ds.train_y)} training samples in workload.dataset "
                f"'{wl.dataset}': each worker needs one of its own"]
    try:
        check_model(wl.model, tuple(ds.input_shape), ds.num_classes)
    except ModelError as e:
        return [f"workload.model: {e}"]
    except Exception as e:
        return [f"workload.model: '{wl.model}' failed: {type(e).__name__}: {e}"]
    return []


# What one node costs this machine, measured (BENCHMARKS.md "Start-up and scale"): a
# training process (a worker, the PS, the evaluator: torch, its data, the model) and the runner's
# open files for it (its control connections, its netns handles).
NODE_PROCESS_MIB = 37.0
IDLE_NODE_MIB = 0.6  # a node with no process (namespace, veths, qdiscs, cgroup), rounded up
NODE_FILES = 8
IDLE_NODE_FILES = 1  # a node with no process: under one of the runner's files each
RESERVE_MIB = 1024.0  # the runner, the page cache a run reads its data through
RESERVE_FILES = 256


def host_memory_mib() -> Optional[float]:
    """MemAvailable in MiB (None: not readable)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def capacity_problems(sc: Scenario, memory_mib: Optional[float] = None, files: Optional[int] = None) -> list[str]:
    """A run this machine cannot hold, one line naming the limit: its nodes' processes past the
    memory available, or their files past the runner's open-file limit (checked only where known)."""
    import resource

    from testbed.strategies import make_strategy

    nodes = len(sc.node_names())
    busy = nodes - sc.n_workers + make_strategy(sc.algorithm.name, sc.algorithm.params).trainers_alive(sc.n_workers)
    memory_mib = host_memory_mib() if memory_mib is None else memory_mib
    files = reachable_open_files() if files is None else files
    lines = []
    need = busy * NODE_PROCESS_MIB + (nodes - busy) * IDLE_NODE_MIB + RESERVE_MIB
    if memory_mib is not None and need > memory_mib:
        lines.append(f"workers: {nodes} nodes need about {need / 1024:.1f} GiB ({busy} training processes at once, "
                     f"{NODE_PROCESS_MIB:g} MiB each, measured), and this machine has {memory_mib / 1024:.1f} GiB "
                     "available")
    need_files = files_needed(nodes, busy)
    if files != resource.RLIM_INFINITY and need_files > files:
        lines.append(f"workers: {nodes} nodes need about {need_files} open files in the runner, and its limit is "
                     f"{files} (ulimit -Hn; raise nofile)")
    return lines


def files_needed(nodes: int, busy: Optional[int] = None) -> int:
    """The runner's open files for `nodes`, `busy` of them with a process at once (all: None)."""
    busy = nodes if busy is None else busy
    return busy * NODE_FILES + (nodes - busy) * IDLE_NODE_FILES + RESERVE_FILES


CAP_SYS_RESOURCE = 24


def may_raise_limits() -> bool:
    """Whether this process may raise its hard limits (CAP_SYS_RESOURCE: root usually, not in
    every container or sandbox: not on this project's build machines)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def reachable_open_files() -> int:
    """The most files the runner may hold: its hard limit, or with CAP_SYS_RESOURCE the kernel's
    fs.nr_open (it raises its own hard limit up to that: run.runner.raise_open_files)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if not may_raise_limits():
        return hard
    try:
        return max(hard, int(Path("/proc/sys/fs/nr_open").read_text()))
    except (OSError, ValueError):
        return hard


def preflight(sc: Scenario) -> None:
    """Raise ScenarioError, naming each field, when this machine cannot run `sc`."""
    lines = runtimes.scenario_problems(sc)
    if runtimes.unknown_runtime(sc.runtime) is not None:
        raise ScenarioError(lines)  # nothing else can be asked of a runtime that is not there
    lines += shard_problems(sc) + plugin_problems(sc) + cpuset_problems(sc) + engine_problems(sc)
    if lines:
        raise ScenarioError(lines)
