"""`dilation: auto`: the factor k chosen before a run from what its nodes are promised and what
this host has (scenario.dilation has the transformation; records.fidelity confirms k after the run).

What the world asks of the host, in cores, is each node's promise at its stated speed: a profile's
`cpus` and its background stress; a device's, its training step's CPU time on this host over the
device's step time (a short calibration of the run's model, in a process with no privileges); a
node promised nothing (no profile) a core while it trains, since it takes whatever it can; and the
runner's own share. Per-round trainers count as many workers as train at once. Under dilation k the
host gives 1/k of each, so the least k that fits is

    k = demand / (HOST_SHARE x the host's cores),

rounded up to a step of STEP, and 1 when the world fits as it is. A swarm's other hosts are not
counted: the runner's host decides.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from testbed.errors import HostCannot
from testbed.run.cpu_fit import local_cores
from testbed.scenario.devices.catalog import catalog, resolve_speed
from testbed.scenario.dilation import MAX_DILATION
from testbed.scenario.schema import Scenario
from testbed.strategies import make_strategy

# Of the host's cores, the share its nodes may be promised: the rest is the runner's, the control
# hub's and the kernel's (shaping, forwarding), which dilation does not slow.
HOST_SHARE = 0.8
RUNNER_CORES = 0.2  # the runner and its hub, at any size
RUNNER_CORES_PER_NODE = 0.0005  # a fleet's: sampling and the control channel, per node
UNPROMISED_CORES = 1.0  # a node with no quota trains on a thread: it takes a core
STEP = 0.5
CALIBRATION_TIMEOUT_S = 120.0

_MEASURE = """
import json, sys
from testbed.kernel.privileges import drop_privileges
drop_privileges()
from testbed.node.calibrate import measure_steps
print(json.dumps(measure_steps(**json.loads(sys.argv[1]))))
"""


def host_step(sc: Scenario) -> dict:
    """The run's model's training step on this host (one thread): FLOPs and CPU seconds, measured
    in a child process with every capability dropped (a plugin's model is a user's code)."""
    args = {"model": sc.workload.model, "dataset": sc.workload.dataset, "seed": sc.seed,
            "test_size": sc.workload.test_size, "batch_size": sc.workload.batch_size, "threads": 1,
            "repetitions": 3, "min_rep_s": 0.2}
    done = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(args)], capture_output=True, text=True,
                          timeout=CALIBRATION_TIMEOUT_S)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise HostCannot(f"dilation: auto could not time the model on this host: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def node_demand(sc: Scenario, node: str, step: Callable[[], dict]) -> float:
    """The cores `node` asks of the host at its stated speed (the world's, k = 1)."""
    prof = sc.profile_of(sc.node_profile_ref(node))
    stress = prof.stress.cpu if prof.stress is not None else 0.0
    if prof.cpus is not None:
        return prof.cpus + stress
    found = resolve_speed(prof.device, prof.speed, catalog(sc.devices))
    if found is not None:
        measured = step()
        return measured["cpu_s_median"] / found[1].step_seconds(measured["flops_per_step"]) + stress
    if node in ("broker", "producer"):
        return stress + UNPROMISED_CORES / 2  # a broker idles between its rates' batches
    return stress + UNPROMISED_CORES


def world_demand(sc: Scenario, step: Callable[[], dict]) -> float:
    """What the whole world asks of the host, in cores (runner included)."""
    names = sc.node_names()
    workers = [n for n, _ in sc.worker_names()]
    at_once = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed).trainers_at_once(len(workers))
    per_worker = sorted((node_demand(sc, w, step) for w in workers), reverse=True)[:at_once]
    others = sum(node_demand(sc, n, step) for n in names if n not in set(workers))
    return sum(per_worker) + others + RUNNER_CORES + RUNNER_CORES_PER_NODE * len(names)


def least_factor(demand: float, cores: int) -> float:
    """The least k (a multiple of STEP, at least 1) under which `demand` fits `cores`."""
    return least_factor_of(demand / (HOST_SHARE * cores))


def choose_dilation(sc: Scenario, say: Callable[[str], None] = print,
                    cores: Optional[int] = None, step: Optional[Callable[[], dict]] = None) -> Scenario:
    """The scenario with its dilation a number: as given, or for `auto` the least k that fits
    this host (said in one line); a demand past MAX_DILATION is refused."""
    if not isinstance(sc.dilation, str):
        return sc
    have = cores if cores is not None else next(iter(local_cores().values()))
    measured: dict = {}

    def once() -> dict:
        if not measured:
            measured.update(step() if step is not None else host_step(sc))
        return measured

    demand = world_demand(sc, once)
    k = least_factor(demand, have)
    if k > MAX_DILATION:
        raise HostCannot(f"dilation: auto: the world asks {demand:.1f} cores and this host has {have}: "
                         f"k {k:g} is past {MAX_DILATION:g}")
    say(f"dilation: auto chose k = {k:g} (the world asks {demand:.2f} cores; this host has {have}, "
        f"{HOST_SHARE:.0%} for the nodes)")
    return sc.model_copy(update={"dilation": k})


def host_cores(run_dir: Path) -> Optional[int]:
    """The runner's host's CPUs as meta.json says (None: not said)."""
    try:
        cpus = json.loads((Path(run_dir) / "meta.json").read_text()).get("host", {}).get("cpus")
    except (OSError, ValueError, AttributeError):
        return None
    return cpus if isinstance(cpus, int) and not isinstance(cpus, bool) and cpus > 0 else None


def enough_dilation(intervals: list, k: float, cores: Optional[int], quantile: float = 0.95) -> dict:
    """After a run: the least k its load would have needed (summary.json's fidelity.dilation). In
    each judged interval a node wanted the CPU it ran (`got`, the world's cores: k x the wall's)
    and the CPU it waited for (`wait`, a share of the interval: wall cores); summed over the
    nodes, that is what the host was asked. Its `quantile` over the run, against HOST_SHARE of the
    host's cores, gives the k under which it fits: a load of L wall cores at k is L x k / k' at k'."""
    nodes = [iv for iv in intervals if iv.kind == "node" and iv.end > iv.start and iv.verdict != "startup"]
    out: dict = {"k": k, "host_cores": cores}
    if not nodes or not cores:
        return {**out, "enough": None}
    width = max(min(iv.end - iv.start for iv in nodes), 1e-9)
    wanted: dict[int, float] = {}
    for iv in nodes:
        first = int(iv.start / width)
        for b in range(first, max(first + 1, int(iv.end / width))):
            wanted[b] = wanted.get(b, 0.0) + iv.got / k + (iv.wait or 0.0)
    levels = sorted(wanted.values())
    asked = levels[min(len(levels) - 1, int(quantile * len(levels)))]  # wall cores
    enough = least_factor_of(k * asked / (HOST_SHARE * cores))
    return {**out, "host_cores_wanted": round(asked, 3), "quantile": quantile, "enough": enough,
            "verdict": "enough" if enough <= k else f"not enough: k {enough:g} would have been"}


def least_factor_of(k: float) -> float:
    return max(1.0, math.ceil(k / STEP - 1e-9) * STEP)


def unstated_speed_warning(sc: Scenario, k: float) -> Optional[str]:
    """One warning when a dilated run has nodes of no stated speed (no cpus, device or speed): they
    run as fast as the host lets them, which is k times faster in the world's time."""
    if k == 1:
        return None
    free = [n for n in sc.node_names()
            if (p := sc.profile_of(sc.node_profile_ref(n))).cpus is None and not p.is_device()]
    if not free:
        return None
    shown = ", ".join(free[:8]) + (f" and {len(free) - 8} more" if len(free) > 8 else "")
    return (f"dilation {k:g}: {shown} state no speed (cpus, device or speed): they run as fast as this host "
            f"lets them, {k:g} times faster in the world's time than undilated; give them a profile")
