"""A node's measure of its host (calibration): timed training steps of the run's own
model, in the node's own cgroup and on its own host, handed to the runner over the mailbox.

Run as a job (`runtime.start(node, "testbed.node.calibrate:run_calibration", ...)`) after the
node's bootstrap has dropped privileges: torch is imported here, never before. The runner
(testbed/run/devices.py) turns the result into the node's CPU quota: the quota that makes a step
take the device's time is the step's CPU seconds divided by that time.

The same function, run again once the quota is set, measures the step time the node gets
(`edgebed bench device`)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from typing import Any, Optional

from testbed.node import mailbox

WARMUP_STEPS = 2


def _batch(dataset: str, seed: int, test_size: Any, batch_size: int):
    import torch

    from testbed.data.datasets import shared_dataset

    ds = shared_dataset(dataset, seed=seed, test_size=test_size)
    n = min(batch_size, len(ds.train_y))
    x = torch.from_numpy(ds.train_x[:n].copy())
    y = torch.from_numpy(ds.train_y[:n].copy())
    return ds, x, y


def count_flops(step) -> int:
    """FLOPs of one call of `step` (forward and backward), as FlopCounterMode counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def sgd_step(net, x, y):
    """One training step of `net` on (x, y) as a function: SGD, cross-entropy."""
    import torch

    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train() -> None:
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()

    return train


def count_activations(net, x) -> int:
    """Elements of every leaf module's output in one forward pass of `x` (the traffic that grows
    with the batch, for an accelerator's roofline)."""
    import torch

    sizes: list[int] = []

    def hook(_module, _inputs, output) -> None:
        if isinstance(output, torch.Tensor):
            sizes.append(output.numel())

    leaves = [m for m in net.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in handles:
            h.remove()
    return sum(sizes)


def measure_steps(model: str, dataset: str, seed: int = 0, test_size: Any = None, batch_size: int = 32,
                  threads: int = 1, repetitions: int = 5, min_rep_s: float = 0.2, pace_s: float = 0.0,
                  pace_batch: int = 0, pace_shape: Optional[dict] = None) -> dict:
    """Per repetition, the wall and CPU seconds of one training step (SGD, cross-entropy) of
    `model` on a batch of `dataset`; each repetition runs whole steps for at least `min_rep_s`,
    after a warm-up of as long (a fresh process's first steps are slower, more so under a quota).
    `pace_s`: each step held to that time, as a paced device's worker holds it (node.pacing): the
    time of a step of `pace_batch` samples (default this batch) and `pace_shape` the device's
    step-time shape (StepTime.as_dict; default proportional)."""
    import torch

    from testbed.data.models import build_model
    from testbed.node.pacing import DevicePace
    from testbed.scenario.devices.step_time import StepTime

    torch.set_num_threads(threads)
    ds, x, y = _batch(dataset, seed, test_size, batch_size)
    torch.manual_seed(seed)
    net = build_model(model, tuple(ds.input_shape), ds.num_classes)
    train = sgd_step(net, x, y)
    shape = StepTime.from_dict(pace_shape)
    pace = DevicePace(pace_s, pace_batch or len(y), shape=shape) if pace_s > 0 else None

    def step() -> None:
        t0 = time.perf_counter()
        train()
        if pace is not None:
            pace.after(time.perf_counter() - t0, len(y))

    flops = count_flops(train)
    activations = count_activations(net, x)
    t, warm = time.perf_counter(), 0
    while warm < WARMUP_STEPS or time.perf_counter() - t < min_rep_s:  # first touches, allocator, caches
        step()
        warm += 1
    t = time.perf_counter()
    step()
    per_step = max(1e-6, time.perf_counter() - t)
    steps = max(1, int(min_rep_s / per_step + 0.999))
    wall, cpu = [], []
    for _ in range(repetitions):
        t, c = time.perf_counter(), time.process_time()
        done = 0
        while done < steps or time.perf_counter() - t < min_rep_s:
            step()
            done += 1
        wall.append((time.perf_counter() - t) / done)
        cpu.append((time.process_time() - c) / done)
    return {"model": model, "dataset": dataset, "batch_size": int(len(y)), "threads": threads,
            "flops_per_step": flops, "params": sum(p.numel() for p in net.parameters() if p.requires_grad),
            "activations": activations, "step_s": wall, "cpu_s": cpu, "repetitions": repetitions,
            "step_s_median": statistics.median(wall), "cpu_s_median": statistics.median(cpu),
            "cpus": len(os.sched_getaffinity(0)), "host": socket.gethostname(), "paced_s": pace_s}


def run_calibration(result_path: str, **kwargs: Any) -> None:
    """A job's entry point: measure_steps(**kwargs), its result put into the runner's slot."""
    mailbox.write_text(result_path, json.dumps(measure_steps(**kwargs)))
