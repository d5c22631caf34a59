"""`edgebed bench device`: does a `device:` node train at its device's speed on this
host, and keep that speed when the host gets slower, where a `cpus:` node does not?

One cluster per host condition, every node pinned to CPU 0 (cpuset "0"): a node per catalog
device and one `cpus: 1.0` node (a whole host core, host-relative). Per device and per
calibration model the node is calibrated as at bring-up (testbed/run/devices.py: measured
unthrottled, quota set, checked under the quota and corrected once), then a job in the node
times training steps of each model (repetitions of whole steps, each at least `min_rep_s`): the
measured step time against the device's target for that model (FLOPs / device speed). The
calibration model's own row is the 5% criterion; the other rows are the error of a calibration
made on another model.

Host conditions: `idle`, and `slow`: a busy neighbour process in the host's own cgroup (not any
node's) pinned to the nodes' CPU, so every node gets at most about half of that CPU. `device:`
nodes should keep their step times (their quotas are CPU time and stay under that half);
`cpus: 1.0` should slow by the host's ratio (about 2). A host slower per CPU-second (an older
CPU) is not made here: the calibration sees it as more CPU seconds per step, by construction.

Accelerators (`--batches`, accelerator_benchmark): a GPU is faster than a small host, so it is
emulated under time dilation: the device made `dilation` times slower (Speed.dilated: every
target step time times k), calibrated at the largest batch, its steps paced to its roofline, and
each batch's paced step time against the model's for that batch, reported divided by k (virtual).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from testbed.bench.harness import Bench, save_result
from testbed.errors import RunFailed
from testbed.node import untrusted
from testbed.plan import parse_scenario
from testbed.run import devices as run_devices
from testbed.scenario.devices.catalog import builtin
from testbed.scenario.devices.step_time import StepTime

MODELS = ("adacomp_cnn", "resnet_small", "dlion_cnn")
DEVICES = ("raspberry-pi-3b", "raspberry-pi-4", "jetson-nano-cpu")
ACCELERATORS = ("jetson-nano", "t4", "a100")
BATCHES = (8, 32, 128)
TOLERANCE = 0.05
PRELOAD = ["torch", "numpy", "testbed.data.models", "testbed.data.datasets", "testbed.data.preload",
           "testbed.node.calibrate"]


class Neighbour:
    """A busy loop in the host's own cgroup, pinned to `cpu`: the host made slower for its nodes."""

    def __init__(self, cpu: int):
        self.cpu = cpu
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "Neighbour":
        code = f"import os\nos.sched_setaffinity(0, {{{self.cpu}}})\nwhile True:\n    pass\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def _scenario(devices: tuple[str, ...], dataset: str, pace: bool = False, batch_size: int = 32) -> dict:
    profiles: dict[str, dict] = {f"dev{i}": {"device": d, "cpuset": "0", "pace_steps": pace}
                                 for i, d in enumerate(devices)}
    profiles["host1"] = {"cpus": 1.0, "cpuset": "0"}
    workers = [{"count": 1, "profile": f"dev{i}", "name": f"d{i}"} for i in range(len(devices))]
    workers.append({"count": 1, "profile": "host1", "name": "h"})
    return {"name": "bench-device", "workload": {"dataset": dataset, "batch_size": batch_size}, "profiles": profiles,
            "workers": workers}


def _measure(bench: Bench, rt: Any, node: str, sc: Any, model: str, repetitions: int, min_rep_s: float,
             pace_s: float = 0.0, threads: int = 1, batch_size: int = 0,
             cal: Optional[run_devices.Calibration] = None) -> dict:
    """Step times of `model` in `node` under whatever quota it has now (`pace_s`: held to it), on
    `threads` threads (a device's: run.devices), of `batch_size` samples (default the scenario's;
    another batch is paced by `cal`'s step shape)."""
    slot = bench.result(f"measure-{node}-{model}-{time.monotonic_ns()}.json")
    shape = dict(pace_batch=cal.batch_size, pace_shape=cal.step_shape) if cal is not None else {}
    proc = rt.start(node, run_devices.CALIBRATE_TARGET,
                    dict(result_path=str(slot), model=model, dataset=sc.workload.dataset, seed=sc.seed,
                         test_size=sc.workload.test_size, batch_size=batch_size or sc.workload.batch_size,
                         threads=threads, repetitions=repetitions, min_rep_s=min_rep_s, pace_s=pace_s, **shape),
                    label="measure")
    proc.join(600)
    if not slot.arrived():
        raise RunFailed(f"{node}: the step-time job did not report (exit code {proc.exitcode})")
    return dict(untrusted.loads(slot.read_text()))


def _row(device: str, cal: Optional[run_devices.Calibration], m: dict, target: Optional[float]) -> dict:
    med = statistics.median(m["step_s"])
    row = {"device": device, "run_model": m["model"], "step_s": m["step_s"], "step_s_median": med,
           "step_s_spread": run_devices.spread(m["step_s"]), "flops_per_step": m["flops_per_step"]}
    if cal is not None and target is not None:
        row.update(calibration_model=cal.model, quota_cores=cal.quota_cores, target_step_s=target,
                   error=med / target - 1, calibration_cpu_s_median=cal.cpu_median,
                   calibration_spread=run_devices.spread(cal.cpu_s))
    return row


class DeviceBench:
    """One host condition: calibrate, set, measure, for each device and calibration model."""

    def __init__(self, devices: tuple[str, ...], models: tuple[str, ...], cross: bool, repetitions: int,
                 min_rep_s: float, dataset: str, say: Callable[[str], None], pace: bool = False, dilation: float = 1.0):
        self.devices, self.models, self.cross = devices, models, cross and not pace  # paced: to its own model
        self.k = dilation
        self.repetitions, self.min_rep_s, self.say, self.pace = repetitions, min_rep_s, say, pace
        self.sc = parse_scenario(_scenario(devices, dataset, pace))

    def run(self, runtime: str, condition: str) -> list[dict]:
        from testbed.data.preload import request

        request(self.sc.workload.dataset, self.sc.seed, self.sc.workload.test_size)  # the forkserver loads it once
        bench = Bench({}, runtime, scenario=self.sc.model_dump(mode="json", exclude_none=True), preload=tuple(PRELOAD))
        rows: list[dict] = []
        with bench as (rt, spec):
            neighbour = Neighbour(0) if condition == "slow" else None
            if neighbour is not None:
                neighbour.__enter__()
            try:
                for (node, label, speed), device in zip(run_devices.device_nodes(self.sc, spec), self.devices):
                    rows += self._device(bench, rt, node, label, speed.dilated(self.k), device, condition)
                host = next(n for n in spec.workers if n.profile.cpus is not None)
                for model in self.models:
                    m = _measure(bench, rt, host.name, self.sc, model, self.repetitions, self.min_rep_s)
                    rows.append({**_row("cpus: 1.0", None, m, None), "condition": condition})
                    self.say(f"{condition:5} cpus: 1.0        {model:13} "
                             f"step {rows[-1]['step_s_median'] * 1e3:7.1f} ms")
            finally:
                if neighbour is not None:
                    neighbour.__exit__()
        return rows

    def _device(self, bench: Bench, rt: Any, node: Any, label: str, speed: Any, device: str,
                condition: str) -> list[dict]:
        rows = []
        for cal_model in self.models:
            rt.set_cpus(node.name, None)  # calibrated unthrottled, as at bring-up
            cal = run_devices.calibrate_node(rt, self.sc, node, label, speed, model=cal_model)
            refused = run_devices.shortfall_line(cal) or run_devices.floor_line(cal)
            if refused:
                self.say(f"{condition:5} refused: {refused}")
                rows.append({"device": device, "condition": condition, "calibration_model": cal_model,
                             "refused": refused})
                continue
            rt.set_cpus(node.name, cal.quota_cores)
            run_devices.refine_quota(rt, self.sc, node, cal)  # as at bring-up
            for run_model in self.models if self.cross else (cal_model,):
                m = _measure(bench, rt, node.name, self.sc, run_model, self.repetitions, self.min_rep_s,
                             cal.target_step_s if self.pace else 0.0, cal.threads)
                row = {**_row(device, cal, m, speed.step_seconds(m["flops_per_step"])), "condition": condition,
                       "paced": self.pace, "dilation": self.k}
                row["virtual_step_s_median"] = row["step_s_median"] / self.k
                rows.append(row)
                self.say(f"{condition:5} {device:16} cal {cal_model:13} run {run_model:13} quota "
                         f"{cal.quota_cores:.3f}  target {row['target_step_s'] * 1e3:7.1f} ms  measured "
                         f"{row['step_s_median'] * 1e3:7.1f} ms  error {row['error']:+.1%}  spread "
                         f"{row['step_s_spread']:.1%}")
        return rows


def _verdict(rows: list[dict], conditions: tuple[str, ...]) -> dict:
    """The criteria: own-model error within 5% everywhere; device step times within 5% across
    the conditions; the cpus: profile's ratio across them (the host's ratio)."""
    own = [r for r in rows if "error" in r and r["calibration_model"] == r["run_model"]]
    cross = [r for r in rows if "error" in r and r["calibration_model"] != r["run_model"]]
    out: dict = {"own_model_max_abs_error": max((abs(r["error"]) for r in own), default=None),
                 "cross_model_abs_error": {"max": max((abs(r["error"]) for r in cross), default=None),
                                           "median": statistics.median([abs(r["error"]) for r in cross])
                                           if cross else None},
                 "refused": [r["refused"] for r in rows if "refused" in r]}
    ok = bool(own) and out["own_model_max_abs_error"] <= TOLERANCE and not out["refused"]
    if len(conditions) == 2:
        a, b = conditions
        ratios = {}
        for r in own:
            if r["condition"] == a:
                other = next((s for s in own if s["condition"] == b and s["device"] == r["device"]
                              and s["run_model"] == r["run_model"]), None)
                if other is not None:
                    ratios[f"{r['device']} {r['run_model']}"] = other["step_s_median"] / r["step_s_median"]
        host = {r["run_model"]: r["step_s_median"] for r in rows if r["device"] == "cpus: 1.0" and r["condition"] == a}
        host_ratio = {r["run_model"]: r["step_s_median"] / host[r["run_model"]] for r in rows
                      if r["device"] == "cpus: 1.0" and r["condition"] == b and r["run_model"] in host}
        out.update(device_ratio_slow_over_idle=ratios, cpus_ratio_slow_over_idle=host_ratio)
        ok = ok and bool(ratios) and all(abs(x - 1) <= TOLERANCE for x in ratios.values())
    out["ok"] = ok
    return out


def device_benchmark(*, quick: bool = False, runtime: str = "netns", out_dir: Path | None = None,
                     say: Callable[[str], None] = print, repetitions: int = 3, min_rep_s: float = 1.5,
                     dataset: str = "mnist5k", devices: tuple[str, ...] = DEVICES, cross: bool = True,
                     pace: bool = False, dilation: float = 1.0) -> dict:
    """The full run: 3 devices x 3 calibration models x 3 run models on the idle host (`cross`;
    else each on its own model), the own model again on the slow host. `quick`: one device, one
    model, the idle host (CI). The JSON is written after each host condition."""
    models = MODELS[:1] if quick else MODELS
    devices = DEVICES[1:2] if quick else devices
    conditions = ("idle",) if quick else ("idle", "slow")
    if quick:
        repetitions, min_rep_s = 3, 1.0
    rows: list[dict] = []
    t = time.monotonic()
    name = (f"device-{runtime}{'-quick' if quick else ''}{'' if (cross and not pace) or quick else '-own'}"
            f"{'-paced' if pace else ''}{f'-k{dilation:g}' if dilation != 1 else ''}.json")
    out: dict = {}
    for i, condition in enumerate(conditions):
        b = DeviceBench(devices, models, cross=cross and condition == "idle" and not quick, repetitions=repetitions,
                        min_rep_s=min_rep_s, dataset=dataset, say=say, pace=pace, dilation=dilation)
        rows += b.run(runtime, condition)
        verdict = _verdict(rows, conditions[:i + 1])
        out = {"benchmark": "device", "runtime": runtime, "quick": quick, "devices": list(devices),
               "device_speeds": {d: builtin()[d].speed.model_dump() for d in devices}, "models": list(models),
               "conditions": list(conditions[:i + 1]), "repetitions": repetitions, "min_rep_s": min_rep_s,
               "paced": pace, "dilation": dilation,
               "dataset": dataset, "cpuset": "0", "host_cpus": os.cpu_count(), "tolerance": TOLERANCE, "rows": rows,
               **verdict, "seconds": round(time.monotonic() - t, 1), "kernel": os.uname().release,
               "date": time.strftime("%Y-%m-%d %H:%M:%S")}
        save_result(out, out_dir, name, say)
    say(f"own-model max |error| {out['own_model_max_abs_error']}; ok {out['ok']}")
    return out


class AcceleratorBench:
    """Accelerators under dilation: per device, calibrated at the largest batch, then its paced
    steps of each batch timed against the device's roofline for that batch, times k."""

    def __init__(self, devices: tuple[str, ...], batches: tuple[int, ...], dilation: float, model: str,
                 repetitions: int, min_rep_s: float, dataset: str, say: Callable[[str], None]):
        self.devices, self.batches, self.k, self.model = devices, tuple(sorted(batches)), dilation, model
        self.repetitions, self.min_rep_s, self.say = repetitions, min_rep_s, say
        self.sc = parse_scenario(_scenario(devices, dataset, pace=True, batch_size=self.batches[-1]))

    def run(self, runtime: str) -> list[dict]:
        from testbed.data.preload import request

        request(self.sc.workload.dataset, self.sc.seed, self.sc.workload.test_size)
        bench = Bench({}, runtime, scenario=self.sc.model_dump(mode="json", exclude_none=True), preload=tuple(PRELOAD))
        rows: list[dict] = []
        with bench as (rt, spec):
            for (node, label, speed), device in zip(run_devices.device_nodes(self.sc, spec), self.devices):
                rows += self._device(bench, rt, node, label, speed.dilated(self.k), device)
        return rows

    def _device(self, bench: Bench, rt: Any, node: Any, label: str, speed: Any, device: str) -> list[dict]:
        cal = run_devices.calibrate_node(rt, self.sc, node, label, speed, model=self.model)
        refused = run_devices.shortfall_line(cal) or run_devices.floor_line(cal)
        if refused:
            self.say(f"refused: {refused}")
            return [{"device": device, "refused": refused}]
        rt.set_cpus(node.name, cal.quota_cores)
        run_devices.refine_quota(rt, self.sc, node, cal)
        shape = StepTime.from_dict(cal.step_shape)
        if shape is None:
            raise RunFailed(f"{device}: its calibration gave no step model")
        rows = []
        for b in self.batches:
            m = _measure(bench, rt, node.name, self.sc, self.model, self.repetitions, self.min_rep_s,
                         cal.target_step_s, cal.threads, batch_size=b, cal=cal)
            target = shape.seconds(b)
            med = statistics.median(m["step_s"])
            rows.append({"device": device, "model": self.model, "batch": b, "dilation": self.k,
                         "quota_cores": cal.quota_cores, "step_s": m["step_s"], "step_s_median": med,
                         "target_step_s": target, "virtual_step_s": med / self.k,
                         "virtual_target_step_s": target / self.k, "error": med / target - 1,
                         "host_cpu_s_median": m["cpu_s_median"], "flops_per_step": m["flops_per_step"]})
            self.say(f"{device:12} {self.model} batch {b:4d}  k {self.k:g}  model {target / self.k * 1e3:8.3f} ms  "
                     f"paced {med / self.k * 1e3:8.3f} ms (virtual)  error {rows[-1]['error']:+.1%}  "
                     f"host CPU {m['cpu_s_median'] * 1e3:.1f} ms")
        return rows


def accelerator_benchmark(*, runtime: str = "netns", out_dir: Path | None = None, say: Callable[[str], None] = print,
                          devices: tuple[str, ...] = ACCELERATORS, batches: tuple[int, ...] = BATCHES,
                          dilation: float = 100.0, model: str = "adacomp_cnn", repetitions: int = 3,
                          min_rep_s: float = 1.0, dataset: str = "mnist5k") -> dict:
    """3 accelerators x 3 batches, each paced step within TOLERANCE of its roofline time (virtual)."""
    t = time.monotonic()
    rows = AcceleratorBench(devices, batches, dilation, model, repetitions, min_rep_s, dataset, say).run(runtime)
    errors = [abs(r["error"]) for r in rows if "error" in r]
    refused = [r["refused"] for r in rows if "refused" in r]
    out = {"benchmark": "device-accelerators", "runtime": runtime, "devices": list(devices), "batches": list(batches),
           "dilation": dilation, "model": model, "dataset": dataset, "repetitions": repetitions,
           "min_rep_s": min_rep_s, "cpuset": "0", "host_cpus": os.cpu_count(), "tolerance": TOLERANCE,
           "rows": rows, "max_abs_error": max(errors, default=None), "refused": refused,
           "ok": bool(errors) and not refused and max(errors) <= TOLERANCE,
           "seconds": round(time.monotonic() - t, 1), "kernel": os.uname().release,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    save_result(out, out_dir, f"device-accelerators-{runtime}-k{dilation:g}.json", say)
    say(f"max |error| {out['max_abs_error']}; ok {out['ok']}")
    return out
