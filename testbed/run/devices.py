"""Device profiles at bring-up: each node whose profile says `device:` or `speed:` is
calibrated on the host that runs it, in its own cgroup, before any role starts, and given the
CPU quota that makes its training step take the device's time.

The node measures (testbed/node/calibrate.py, a job after its privileges are dropped): the FLOPs
of one training step of the run's model (FlopCounterMode), and over several repetitions the
wall and CPU seconds of a step, on one thread, with no quota. The runner (here, the owner of the
cgroups) computes

    target step time  T = FLOPs / (device gflops per core * cores * 1e9)
                      (an accelerator's: its roofline of the step's FLOPs, parameters and
                      activations, scenario/devices/step_time.py; both in target_step_seconds)
    needed cores      n = (median CPU seconds per step) / T
    threads           k = ceil(n), at most the device's cores and the CPUs the node may run on
    quota             q = n (a paced device: up to PACE_HEADROOM x n, within what the host gives)

A device that needs more than one core of its host (a multi-core device on slower cores) trains
on k threads, as on the device, and is measured again on k threads before its quota is set:
parallel steps cost more CPU per step than one thread's, and the quota is CPU time. Its k
threads may run on any k of the node's CPUs (no cpuset is added: k threads cannot use more than
k CPUs, and the quota caps their sum); the check under the quota runs the same k threads, so
what a quota costs k threads within one CFS period is in the correction.

and sets q through the runtime's `set_cpus` (netns, docker: the node's cgroup; swarm: the
container's host engine). A host slower per CPU-second gives a larger q; a host whose CPU is
shared gives the same q (the quota is CPU time) as long as the node can get it. What the node
can get is the CPUs it may run on times the share of a CPU it got while calibrating (CPU/wall):
a device asking for more is refused with one line naming the node, the host and the shortfall.
Quotas on one host adding up to more than its CPUs are one warning.

Nodes calibrate side by side where that changes nothing of what each measures: a calibration
job runs one thread with no quota (a core), a check runs one thread under its quota, so at most
as many jobs as the host has CPUs, their cores adding up to at most that, each get what they would
get alone (calibration_batches; a host whose CPUs are not known here, or a node pinned to a
cpuset, measures alone). meta.json names
the nodes each one was measured beside (`calibrated_beside`, `checked_beside`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from testbed.errors import HostCannot, RunFailed
from testbed.node import untrusted
from testbed.plan.cluster import ClusterSpec, Node
from testbed.run.cpu_fit import local_cores
from testbed.scenario.devices.catalog import Device, Speed, catalog, resolve_speed
from testbed.scenario.devices.step_time import StepCost
from testbed.scenario.dilation import factor
from testbed.scenario.profiles import DEFAULT_CPU_PERIOD_S, MIN_CPU_QUOTA_S
from testbed.scenario.schema import Scenario

CALIBRATE_TARGET = "testbed.node.calibrate:run_calibration"
CALIBRATION_TIMEOUT_S = 300.0
REPETITIONS = 5
MIN_REP_S = 0.2
VERIFY_REPETITIONS, VERIFY_REP_S = 3, 0.5  # the check under the quota (refine_quota)
MAX_CORRECTION = 1.5
# A paced device (profile pace_steps, node/pacing.py): its quota is this many times what its steps
# need, so a step takes well under the device's time and is then held to it; the check under the
# quota raises it (MAX_CORRECTION at most, within what the host can give) while a step takes more
# than PACE_FILL of the device's time.
PACE_HEADROOM = 2.0
PACE_FILL = 0.8


class DeviceRefused(HostCannot):
    """A device faster than its host can give (one line)."""


@dataclass
class Calibration:
    """A node's calibration and the quota that follows from it (meta.json's `device`)."""

    node: str
    host: str
    device: str
    gflops_per_core: float
    cores: int
    model: str
    flops_per_step: int
    step_s: list[float]
    cpu_s: list[float]
    host_cpus: int
    target_step_s: float = 0.0
    quota_cores: float = 0.0
    threads: int = 1  # the node's training threads
    calibrated_threads: int = 1  # the threads step_s and cpu_s were measured on
    available_cores: float = 0.0
    needed_cores: float = 0.0  # CPU seconds per step over the step's time: what the device needs
    batch_size: int = 0  # the calibration's batch (a paced step's time is for this many samples)
    paced: bool = False
    params: int = 0  # the model's trainable parameters and a forward pass's activations (elements)
    activations: int = 0
    step_shape: dict = field(default_factory=dict)  # the device's StepTime for this model, any batch
    power: dict = field(default_factory=dict)  # the device's catalog Power (records/energy.py), if stated
    extra: dict = field(default_factory=dict)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_s)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.step_s)

    def meta(self) -> dict:
        d = asdict(self)
        d.pop("node")
        d.pop("calibrated_threads")
        d["calibration"] = {"model": d.pop("model"), "flops_per_step": d.pop("flops_per_step"),
                            "params": d.pop("params"), "activations": d.pop("activations"),
                            "repetitions": len(self.step_s), "threads": self.calibrated_threads,
                            "step_s": d.pop("step_s"), "cpu_s": d.pop("cpu_s"),
                            "step_s_median": self.wall_median, "step_s_spread": spread(self.step_s),
                            "cpu_s_median": self.cpu_median, "cpu_s_spread": spread(self.cpu_s)}
        d.update(d.pop("extra"))
        d["unit"] = "effective GFLOP/s per core, PyTorch fp32 CPU training"
        return d


def spread(xs: list[float]) -> float:
    """(max - min) / median of repetitions: the relative spread."""
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m > 0 else 0.0


def step_cost(cal: Calibration) -> StepCost:
    """What the calibrated step costs: its FLOPs, batch, parameters and activations."""
    return StepCost(flops=cal.flops_per_step, batch=cal.batch_size or 1, params=cal.params,
                    activations=cal.activations)


def target_step_seconds(cal: Calibration, speed: Speed) -> float:
    """The device's time for the calibrated step (its batch): the one place a target is made."""
    return speed.step_time(step_cost(cal)).seconds(cal.batch_size or 1)


def plan_quota(cal: Calibration, speed: Speed, paced: bool = False, dilation: float = 1.0) -> Calibration:
    """Fill in the target step time, the quota (a paced device's with headroom, within what the
    host can give), the threads and what the host can give: the share of a CPU the calibration
    got, on as many CPUs as the device has cores (a one-core device cannot be emulated by two of
    the host's slower ones). Under dilation k the device's step is k times as long on the wall
    (scenario.dilation): a device k times faster than the host can give is emulated."""
    cal.step_shape = speed.step_time(step_cost(cal)).as_dict()
    cal.target_step_s = target_step_seconds(cal, speed) * dilation
    if dilation != 1:
        cal.extra["world_step_s"] = cal.target_step_s / dilation
    cal.needed_cores = cal.quota_cores = cal.cpu_median / cal.target_step_s
    share = min(1.0, cal.cpu_median / (cal.wall_median * cal.calibrated_threads)) if cal.wall_median > 0 else 1.0
    cal.available_cores = min(cal.host_cpus, speed.cores) * share
    cal.paced = paced
    if paced:
        cal.quota_cores = max(cal.needed_cores, min(cal.available_cores, cal.needed_cores * PACE_HEADROOM))
    wanted = max(cal.calibrated_threads, math.ceil(cal.needed_cores - 1e-9))
    cal.threads = max(1, min(cal.host_cpus, speed.cores, wanted))
    return cal


def shortfall_line(cal: Calibration) -> Optional[str]:
    """One line when the device needs more CPU than the node can get on its host, else None."""
    need = cal.needed_cores if cal.paced else cal.quota_cores  # a paced quota's headroom is not a need
    if need <= cal.available_cores:
        return None
    short = need - cal.available_cores
    return (f"{cal.node}: device {cal.device} is faster than host {cal.host} can give: it needs "
            f"{need:.2f} cores of this host for {cal.model}, the node can get {cal.available_cores:.2f} "
            f"(short by {short:.2f} cores, {short / need:.0%}); run it dilated (dilation: "
            f"{max(2, math.ceil(need / max(cal.available_cores, 1e-9))):d} or auto), or pick a slower device or a "
            f"faster host")


def floor_line(cal: Calibration) -> Optional[str]:
    """One line when the quota is below the kernel's least (1 ms per 100 ms period), else None."""
    least = MIN_CPU_QUOTA_S / DEFAULT_CPU_PERIOD_S
    if cal.quota_cores >= least:
        return None
    return (f"{cal.node}: device {cal.device} is too slow to emulate on host {cal.host}: "
            f"it needs {cal.quota_cores:.4f} cores, under the kernel's least quota ({least:g} cores)")


def oversubscribed_lines(cals: list[Calibration]) -> list[str]:
    """One warning per host whose device quotas add up to more CPUs than it has."""
    by_host: dict[str, list[Calibration]] = {}
    for c in cals:
        by_host.setdefault(c.host, []).append(c)
    lines = []
    for host, cs in by_host.items():
        total = sum(c.quota_cores for c in cs)
        cpus = max(c.host_cpus for c in cs)
        if total > cpus + 1e-9:
            lines.append(f"host {host}: the device quotas of {len(cs)} node(s) add up to {total:.2f} cores, more than "
                         f"its {cpus}: the devices run slower than their catalog speed when all train at once")
    return lines


def device_nodes(sc: Scenario, spec: ClusterSpec) -> list[tuple[Node, str, Speed]]:
    """(node, device label, speed) of every node whose profile is in device terms."""
    known: dict[str, Device] = catalog(sc.devices)
    out = []
    for n in spec.nodes:
        got = resolve_speed(n.profile.device, n.profile.speed, known)
        if got is not None:
            out.append((n, *got))
    return out


@dataclass
class Job:
    """A calibration job started in a node: its process and the mailbox slot it answers in."""

    node: Node
    proc: Any
    slot: Any
    threads: int = 1
    dilation: float = 1.0  # the run's k: the device's step is k times as long on the wall

    def result(self, what: str) -> dict:
        """Wait for the job (CALIBRATION_TIMEOUT_S at most) and read its answer."""
        self.proc.join(CALIBRATION_TIMEOUT_S)
        if not self.slot.arrived():
            raise RunFailed(f"{self.node.name}: {what} did not report (exit code {self.proc.exitcode})")
        return untrusted.loads(self.slot.read_text())


def _start_job(runtime: Any, sc: Scenario, node: Node, slot_name: str, model: str, repetitions: int,
               min_rep_s: float, threads: int = 1) -> Job:
    slot = runtime.mailbox("calibrate") / slot_name
    kwargs = dict(result_path=str(slot), model=model, dataset=sc.workload.dataset, seed=sc.seed,
                  test_size=sc.workload.test_size, batch_size=sc.workload.batch_size, threads=threads,
                  repetitions=repetitions, min_rep_s=min_rep_s)
    return Job(node, runtime.start(node.name, CALIBRATE_TARGET, kwargs, label="calibrate"), slot, threads,
               factor(sc))


def start_calibration(runtime: Any, sc: Scenario, node: Node, model: str = "", repetitions: int = REPETITIONS,
                      min_rep_s: float = MIN_REP_S, threads: int = 1) -> Job:
    """Start the calibration job in `node` (no quota on it yet), on `threads` threads."""
    name = f"{node.name}.json" if threads == 1 else f"{node.name}-{threads}threads.json"
    return _start_job(runtime, sc, node, name, model or sc.workload.model, repetitions, min_rep_s, threads)


def finish_calibration(job: Job, label: str, speed: Speed) -> Calibration:
    """The calibration job's measurement, and the quota planned from it."""
    node = job.node
    r = job.result("the calibration job")
    cal = Calibration(node=node.name, host=node.host or str(r.get("host", "")), device=label,
                      gflops_per_core=speed.gflops, cores=speed.cores, model=str(r["model"]),
                      flops_per_step=int(r["flops_per_step"]), step_s=[float(x) for x in r["step_s"]],
                      cpu_s=[float(x) for x in r["cpu_s"]], host_cpus=max(1, int(r["cpus"])),
                      batch_size=int(r.get("batch_size") or 0), calibrated_threads=job.threads,
                      params=int(r.get("params") or 0), activations=int(r.get("activations") or 0),
                      power=speed.power.model_dump() if speed.power is not None else {})
    if cal.flops_per_step <= 0 or not cal.step_s or min(cal.cpu_s) <= 0:
        raise RunFailed(f"{node.name}: the calibration measured no work (model {cal.model})")
    return plan_quota(cal, speed, paced=node.profile.paces_steps(), dilation=job.dilation)


def calibrate_node(runtime: Any, sc: Scenario, node: Node, label: str, speed: Speed, model: str = "",
                   repetitions: int = REPETITIONS, min_rep_s: float = MIN_REP_S) -> Calibration:
    """Run the calibration job in `node` (no quota on it yet) and plan its quota; a device that
    needs more than one thread is measured again on its threads (the module's docstring)."""
    cal = finish_calibration(start_calibration(runtime, sc, node, model, repetitions, min_rep_s), label, speed)
    if cal.threads > cal.calibrated_threads and shortfall_line(cal) is None:
        job = start_calibration(runtime, sc, node, model, repetitions, min_rep_s, threads=cal.threads)
        cal = finish_calibration(job, label, speed)
    return cal


def refuse_if_short(cal: Calibration) -> None:
    line = shortfall_line(cal) or floor_line(cal)
    if line:
        raise DeviceRefused(line)


def start_check(runtime: Any, sc: Scenario, node: Node, cal: Calibration, model: str = "") -> Job:
    """Start the check of `cal`'s quota (already set on the node): steps timed under it, on the
    node's training threads."""
    return _start_job(runtime, sc, node, f"{node.name}-verify.json", model or cal.model, VERIFY_REPETITIONS,
                      VERIFY_REP_S, cal.threads)


def finish_check(runtime: Any, job: Job, cal: Calibration) -> Calibration:
    """Scale the quota by measured / target step time (within MAX_CORRECTION either way), so what
    a quota costs on this host (caches refilled after each throttled slice) is in it. Sets it."""
    r = job.result("the calibration's check under the quota")
    measured = statistics.median(float(x) for x in r["step_s"])
    first = cal.quota_cores
    if cal.paced:  # only raised, while a step takes more than PACE_FILL of the device's time
        factor = min(MAX_CORRECTION, max(1.0, measured / (PACE_FILL * cal.target_step_s)))
        cal.quota_cores = max(first, min(cal.available_cores, first * factor))
    else:
        factor = min(MAX_CORRECTION, max(1 / MAX_CORRECTION, measured / cal.target_step_s))
        cal.quota_cores = first * factor
    cal.extra.update(first_quota_cores=first, check_step_s=[float(x) for x in r["step_s"]],
                     check_step_s_median=measured, correction=factor)
    runtime.set_cpus(job.node.name, cal.quota_cores)
    return cal


def refine_quota(runtime: Any, sc: Scenario, node: Node, cal: Calibration, model: str = "") -> Calibration:
    """One closed-loop round: time steps under the quota just set, and correct it (finish_check)."""
    return finish_check(runtime, start_check(runtime, sc, node, cal, model), cal)


def calibration_batches(demands: list[tuple[Node, float]], host_cores: dict[str, int]) -> list[list[Node]]:
    """The nodes in groups that calibrate side by side: on each host a group has at most as many
    jobs as the host has CPUs and their demands (the cores each job may take) add up to at most
    that, so each job gets what it would get alone, as its measurement assumes (a CPU of its own:
    a throttled job never waits for one when its quota refills). `host_cores` by node.host ("" is
    this machine). A node on a host whose CPUs are not known here (another machine of a swarm) or
    pinned to a cpuset (its jobs would share those CPUs) goes alone. First fit, in the nodes' order."""
    groups: list[tuple[list[Node], dict[str, list[float]]]] = []
    for node, need in demands:
        cores = host_cores.get(node.host)
        if cores is None or node.profile.cpuset is not None:
            groups.append(([node], {node.host: [float("inf")]}))  # full: nothing joins it
            continue
        for members, taken in groups:
            mine = taken.setdefault(node.host, [])
            if len(mine) < cores and sum(mine) + need <= cores + 1e-9:
                members.append(node)
                mine.append(need)
                break
        else:
            groups.append(([node], {node.host: [need]}))
    return [members for members, _ in groups]


def _each(jobs: list[Job], finish: Callable[[Job], Calibration]) -> list[Calibration]:
    """`finish` of every job, in order; all are waited for before the first error is raised."""
    out, error = [], None
    for job in jobs:
        try:
            out.append(finish(job))
        except Exception as e:
            error = error or e
    if error is not None:
        raise error
    return out


def this_host_cores() -> dict[str, int]:
    """The CPUs this process may run on, by this machine's names ("" and its hostname)."""
    (name, cores), = local_cores().items()
    return {"": cores, name: cores}


def _measure(runtime: Any, sc: Scenario, threads: dict[str, int], nodes: list[Node],
             what: dict[str, tuple[str, Speed]], cores: dict[str, int]) -> dict[str, Calibration]:
    """Calibrate `nodes` (no quota on them) on threads[name] threads each, side by side where
    their threads fit their host's CPUs (calibration_batches), one group after another; a device
    faster than its host can give is refused as soon as its group is done."""
    cals: dict[str, Calibration] = {}
    for group in calibration_batches([(n, float(threads[n.name])) for n in nodes], cores):
        done = _each([start_calibration(runtime, sc, n, threads=threads[n.name]) for n in group],
                     lambda j: finish_calibration(j, *what[j.node.name]))
        for cal in done:
            refuse_if_short(cal)
            cal.extra["calibrated_beside"] = [n.name for n in group if n.name != cal.node]
            cals[cal.node] = cal
    return cals


def calibrate_devices(runtime: Any, sc: Scenario, spec: ClusterSpec, say: Callable[[str], None],
                      verify: bool = True,
                      host_cores: Optional[dict[str, int]] = None) -> tuple[dict[str, dict], list[str]]:
    """Calibrate every device node with no quota (one thread: a core each; a device that needs
    more than a core of its host again on its threads), set its quota, check it under that quota
    on its threads and correct it once (finish_check); (meta.json's `device` per node,
    warnings). Nodes measure side by side as long as their jobs' cores fit their host's CPUs
    (calibration_batches: its threads for a calibration, the quota for a check, at most a job
    per CPU), one group after another. DeviceRefused, before any role starts, when a device is
    faster than its host can give."""
    found = device_nodes(sc, spec)
    what = {n.name: (label, speed) for n, label, speed in found}
    cores = this_host_cores() if host_cores is None else host_cores
    nodes = [n for n, _, _ in found]
    cals = _measure(runtime, sc, {n.name: 1 for n in nodes}, nodes, what, cores)
    parallel = [n for n in nodes if cals[n.name].threads > 1]
    again = _measure(runtime, sc, {n.name: cals[n.name].threads for n in parallel}, parallel, what, cores)
    for name, cal in again.items():  # what one thread measured, kept beside the threads' calibration
        cal.extra["one_thread"] = {"needed_cores": cals[name].needed_cores, "cpu_s_median": cals[name].cpu_median}
    cals.update(again)
    for cal in cals.values():
        runtime.set_cpus(cal.node, cal.quota_cores)
    if verify:
        demands = [(n, min(float(cals[n.name].threads), cals[n.name].quota_cores)) for n in nodes]
        for group in calibration_batches(demands, cores):
            done = _each([start_check(runtime, sc, n, cals[n.name]) for n in group],
                         lambda j: finish_check(runtime, j, cals[j.node.name]))
            for cal in done:
                cal.extra["checked_beside"] = [n.name for n in group if n.name != cal.node]
                refuse_if_short(cal)
    for cal in cals.values():
        node = spec.node(cal.node)
        node.device_cpus, node.device_threads = cal.quota_cores, cal.threads
        if cal.paced:
            node.device_step_s, node.device_step_batch = cal.target_step_s, cal.batch_size or sc.workload.batch_size
            node.device_step_shape = cal.step_shape
        say(f"{cal.node}: device {cal.device} on host {cal.host}: {cal.model} step {cal.target_step_s * 1e3:.1f} ms "
            f"(host: {cal.cpu_median * 1e3:.1f} ms CPU, spread {spread(cal.cpu_s):.0%}) -> quota "
            f"{cal.quota_cores:.3f} cores, {cal.threads} thread(s)" + (", steps paced" if cal.paced else ""))
    return {c: cal.meta() for c, cal in cals.items()}, oversubscribed_lines(list(cals.values()))


def compute_basis(node: Node) -> Optional[str]:
    """meta.json's word on what a node's CPU limit is relative to."""
    if node.profile.is_device():
        return "device (calibrated on its host)"
    if node.profile.cpus is not None:
        return "host-relative (cpus: a share of whatever host runs the node)"
    return None


def describe(spec: ClusterSpec, calibrations: dict[str, dict], nodes_meta: dict) -> None:
    """Add each node's `device` (calibration, quota) and `cpu_basis` to meta.json's nodes."""
    for n in spec.nodes:
        entry = nodes_meta.get(n.name)
        if entry is None:
            continue
        basis = compute_basis(n)
        if basis is not None:
            entry["cpu_basis"] = basis
        if n.name in calibrations:
            entry["device"] = calibrations[n.name]
