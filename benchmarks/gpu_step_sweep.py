"""Step time against batch of edgebed's models on a GPU: the data to fit an accelerator entry's
roofline (testbed/scenario/devices/step_time.py) to a lent GPU.

    python benchmarks/gpu_step_sweep.py --out benchmarks/results/gpu_step_sweep.csv

Per model and batch: FlopCounterMode's FLOPs, parameters and activations (as the calibration
counts them), and the median of timed training steps (SGD, cross-entropy; CUDA synchronised per
step). A straight line through step time against batch gives the entry's overhead (intercept) and,
where the step is compute-bound, its efficiency (FLOPs per sample / slope / the GPU's peak); the
script prints both. Without CUDA it says so in one line and sweeps one small model on the CPU,
only so that the script is known to run (those rows are not an accelerator's).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ("mlp", "adacomp_cnn", "dlion_cnn", "resnet_small")
BATCHES = (1, 8, 32, 128, 512)
COLUMNS = ["device", "gpu", "model", "batch", "steps", "median_step_s", "min_step_s", "flops_per_step", "params",
           "activations"]


def sweep_one(model_name: str, batch: int, device, steps: int, warmup: int = 5) -> dict:
    """Timed training steps of `model_name` at `batch` on `device` (synthetic MNIST-shaped inputs)."""
    import torch

    from testbed.data.models import build_model
    from testbed.node.calibrate import count_activations, count_flops, sgd_step

    torch.manual_seed(0)
    net = build_model(model_name, (1, 28, 28), 10).to(device)
    x = torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    train = sgd_step(net, x, y)
    flops = count_flops(train)
    activations = count_activations(net, x)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        train()
    sync()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        train()
        sync()
        times.append(time.perf_counter() - t)
    return {"model": model_name, "batch": batch, "steps": steps, "median_step_s": statistics.median(times),
            "min_step_s": min(times), "flops_per_step": flops,
            "params": sum(p.numel() for p in net.parameters()), "activations": activations}


def fit_line(rows: list[dict]) -> tuple[float, float]:
    """Least-squares (intercept s, slope s per sample) of median step time against batch."""
    xs = [float(r["batch"]) for r in rows]
    ys = [float(r["median_step_s"]) for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/gpu_step_sweep.csv")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    if torch.cuda.is_available():
        device, gpu = torch.device("cuda"), torch.cuda.get_device_name(0)
        models, batches, steps = MODELS, BATCHES, args.steps
    else:
        print("gpu_step_sweep: no CUDA device: a short CPU sweep of mlp only, to show the script runs "
              "(not an accelerator's numbers)")
        device, gpu, models, batches, steps = torch.device("cpu"), "", ("mlp",), (8, 32), 5
    rows = []
    for model in models:
        mine = [{"device": device.type, "gpu": gpu, **sweep_one(model, b, device, steps)} for b in batches]
        rows += mine
        intercept, slope = fit_line(mine)
        per_sample = mine[-1]["flops_per_step"] / mine[-1]["batch"]
        rate = per_sample / slope / 1e12 if slope > 0 else float("nan")
        print(f"gpu_step_sweep: {model}: overhead {intercept * 1e3:.3f} ms, {slope * 1e6:.2f} us/sample "
              f"({rate:.2f} TFLOP/s reached at the margin)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"gpu_step_sweep: written: {args.out}")


if __name__ == "__main__":
    main()
