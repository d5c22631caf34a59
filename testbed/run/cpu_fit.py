"""Before a run starts: whether the CPU its nodes are promised fits the hosts that run them. The
intervals in which a node was starved anyway are judged after the run (records.fidelity)."""

from __future__ import annotations

import os
import socket
from typing import Callable, Optional

from testbed.plan.cluster import ClusterSpec, Node


def profile_cpus(node: Node) -> Optional[float]:
    """A node's quota as its profile gives it (`cpus:`, host-relative cores), or, without one, the
    background stress it runs (busy cores no quota bounds); None: no promise to count."""
    if node.profile.cpus is not None:
        return node.profile.cpus
    stress = node.profile.stress
    return stress.cpu if stress is not None else None


def calibrated_cpus(node: Node) -> Optional[float]:
    """A `device:` profile's quota, set once its host was calibrated (run/devices.py)."""
    return node.device_cpus


# Where a node's promised cores are known, asked in order (the first answer counts): a quota set
# at bring-up by calibration, else the profile's.
PROMISE_SOURCES: list[Callable[[Node], Optional[float]]] = [calibrated_cpus, profile_cpus]


def promised_cpus(node: Node) -> Optional[float]:
    """The cores `node` is promised, from the first source that knows (PROMISE_SOURCES)."""
    for source in PROMISE_SOURCES:
        cores = source(node)
        if cores is not None:
            return cores
    return None


def local_cores() -> dict[str, int]:
    """This host's name and the CPUs this process may run on (its affinity, not the machine's count)."""
    return {socket.gethostname(): len(os.sched_getaffinity(0))}


def oversubscription_warnings(spec: ClusterSpec, host_cores: Optional[dict[str, int]] = None,
                               workers_at_once: Optional[int] = None) -> list[str]:
    """One line per host whose nodes are promised more cores than it has (hosts whose cores are not
    known, another machine of a swarm, are not judged). `workers_at_once`: per-round trainers, at
    most that many workers run at once (a host counts its largest quotas that many times)."""
    cores = local_cores() if host_cores is None else host_cores
    here = next(iter(local_cores()))
    others: dict[str, float] = {}  # host -> cores promised to its other nodes
    workers: dict[str, list[float]] = {}  # host -> each worker's
    for n in spec.nodes:
        got = promised_cpus(n)
        if got is None:
            continue
        host = n.host or here
        if n.role == "worker":
            workers.setdefault(host, []).append(got)
        else:
            others[host] = others.get(host, 0.0) + got
    lines = []
    for host in sorted(set(others) | set(workers)):
        have = cores.get(host)
        total = others.get(host, 0.0) + sum(sorted(workers.get(host, []), reverse=True)[:workers_at_once])
        if have is not None and total > have + 1e-9:
            lines.append(f"host {host}: its nodes are promised {total:g} cores of CPU and it has {have}: nodes "
                         f"will run slower than their quotas say (the fidelity monitor flags the starved intervals)")
    return lines
