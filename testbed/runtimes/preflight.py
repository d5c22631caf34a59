"""What a valid scenario needs from this machine's engines, asked after validation and before
bring-up: validation (testbed.scenario) is pure and contacts no engine."""
from __future__ import annotations

import os
from pathlib import Path

from testbed.kernel.gpus import HostGpu, host_gpus
from testbed.runtimes.docker import docker_client, nvidia_runtime_available
from testbed.scenario.units import parse_cpuset
from testbed.scenario.schema import (KAFKA_NEEDS, Profile, Scenario, ScenarioError, gpu_fields, gpu_profiles,
                                     profile_refs, uses_kafka_image)


def engine_problems(sc: Scenario) -> list[str]:
    """One line per field whose need the Docker engine cannot meet; GPUs on netns (or auto
    without an engine, which becomes netns) are this machine's to give."""
    gpus, kafka = gpu_fields(sc), uses_kafka_image(sc)
    if sc.runtime == "swarm":  # the hosts' GPUs are placement's to check (runtimes.hosts)
        return swarm_problems(sc)
    if sc.runtime == "netns":
        return host_gpu_problems(sc) if gpus else []
    if not (gpus or kafka):
        return []
    client = docker_client(timeout=3)
    if client is None:
        if sc.runtime == "auto" and not kafka:
            return host_gpu_problems(sc)
        return ([f"{w}: GPUs need the docker runtime (or netns), and no Docker engine answers" for w in gpus]
                + ([f"streaming.broker.kind: {KAFKA_NEEDS} and needs the docker runtime, and no Docker engine answers"]
                   if kafka else []))
    if gpus and not nvidia_runtime_available(client):
        return [f"{w}: GPUs need the NVIDIA container runtime, which this Docker engine does not have" for w in gpus]
    return []


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


def swarm_problems(sc: Scenario) -> list[str]:
    """What runtime swarm cannot make."""
    lines = [f"streaming.broker.kind: {KAFKA_NEEDS}; runtime swarm does not run it yet (use kind tansu)"] \
        if uses_kafka_image(sc) else []
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
    if sc.runtime == "swarm":
        return [f"{field}: '{ref}' is a plugin, and runtime swarm's nodes run edgebed's image, which does not take "
                "a user's package yet: use runtime docker (with packages:) or netns" for field, ref in user_code(sc)]
    if sc.runtime == "docker" and not sc.packages:
        return [f"{field}: '{ref}' is a plugin, and runtime docker's nodes run edgebed's image: name the package "
                "that holds it in `packages:` (it is installed into the image)" for field, ref in user_code(sc)]
    if "workload.model" not in theirs and "workload.dataset" not in theirs:
        return []
    try:
        ds = load_dataset(wl.dataset, seed=sc.seed, test_size=wl.test_size)
    except DatasetError as e:
        return [f"workload.dataset: {e}"]
    except Exception as e:  # a plugin's own failure
        return [f"workload.dataset: '{wl.dataset}' failed: {type(e).__name__}: {e}"]
    try:
        check_model(wl.model, tuple(ds.input_shape), ds.num_classes)
    except ModelError as e:
        return [f"workload.model: {e}"]
    except Exception as e:
        return [f"workload.model: '{wl.model}' failed: {type(e).__name__}: {e}"]
    return []


def preflight(sc: Scenario) -> None:
    """Raise ScenarioError, naming each field, when this machine cannot run `sc`."""
    lines = plugin_problems(sc) + cpuset_problems(sc) + engine_problems(sc)
    if lines:
        raise ScenarioError(lines)
