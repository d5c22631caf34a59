"""How much of a gradient's squared L2 norm its largest entries hold (ScaDLES Table V).

ScaDLES' adaptive compression (testbed/strategies/compressors.AdaptiveTopC) sends a step's update
compressed when the top CR of its entries, chosen over the whole flattened update (all tensors at
once, not per layer), keep all but delta of its squared norm:

    compressed  <=>  | |g|^2 - |Topk(g)|^2 | / |g|^2 <= delta  <=>  share(g, CR) >= 1 - delta

Table V at ci scale (`make table-scadles-5`) had no step compressed at CR 0.01 for any delta. This
logs the share offline, with the strategy's own selection and loss (top_c_whole_model,
compression_loss), for the Table V model (adacomp_cnn, 211,690 parameters) against dlion_cnn and
resnet_small on the same data (mnist5k, 1x28x28): plain SGD at the scenario's lr 0.05 and batch 64
(scenarios/scadles/streams.ci.yaml; Table V's S1' rates have mean 64 samples/s, and ScaDLES'
linear lr rule scales 0.05 by sum(S_j) / (64 N), about 1 there), one worker, the gradient of each
step's batch exactly as a worker pushes it (testbed/node/roles/worker.py: p.grad of every
parameter). Per step: the shares at 1% and 10%; per (CR, delta) the fraction of steps that would
go compressed.

    nice -n 19 .venv/bin/python benchmarks/topk_norm_share.py [--steps 200] [--seeds 6,7,8]
        [--models adacomp_cnn,dlion_cnn,resnet_small] [--out benchmarks/results/topk-norm-share.json]

One thread (torch.set_num_threads(1)). Results: BENCHMARKS.md, "Top-k norm share"; REPRODUCTION.md,
"ScaDLES Table V".
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from testbed.strategies.compressors import compression_loss, top_c_whole_model

ROOT = Path(__file__).resolve().parents[1]
CRS = (0.1, 0.01)
DELTAS = (0.1, 0.2, 0.3, 0.4)


def norm_share(grads: dict[str, torch.Tensor], c: float) -> float:
    """Share of the update's squared L2 norm held by its ceil(c * entries) largest |entries| over
    the whole model: 1 - ScaDLES' compression loss for the same selection."""
    return 1.0 - compression_loss(grads, top_c_whole_model(grads, c))


def would_compress(share: float, delta: float) -> bool:
    """AdaptiveTopC's rule, written with the share: loss = 1 - share <= delta."""
    return 1.0 - share <= delta


def _pct(values, q) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _summary(values) -> dict:
    return {"median": _pct(values, 50), "p10": _pct(values, 10), "p90": _pct(values, 90),
            "min": float(np.min(values)), "max": float(np.max(values))}


def run_one(model_name: str, ds, seed: int, steps: int, batch: int, lr: float) -> dict:
    from testbed.data.models import build_model, count_parameters

    torch.manual_seed(seed)  # as model_and_data: the same initial model for a seed
    model = build_model(model_name, tuple(ds.input_shape), ds.num_classes)
    x, y = torch.from_numpy(ds.train_x), torch.from_numpy(ds.train_y).long()
    rng = np.random.default_rng(seed * 1000)
    order, pos = rng.permutation(len(y)), 0
    opt = torch.optim.SGD(model.parameters(), lr=lr)  # plain SGD: no momentum, no weight decay
    share1, share10, losses = [], [], []
    cpu0 = time.process_time()
    for _ in range(steps):
        if pos + batch > len(order):
            order, pos = rng.permutation(len(y)), 0
        idx = torch.from_numpy(order[pos:pos + batch])
        pos += batch
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        share1.append(norm_share(grads, 0.01))
        share10.append(norm_share(grads, 0.1))
        losses.append(float(loss.item()))
        opt.step()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(ds.test_x)).argmax(1).numpy() == ds.test_y).mean())
    shares = {0.01: share1, 0.1: share10}
    cnc = {f"CR={cr}": {f"delta={d}": float(np.mean([would_compress(s, d) for s in shares[cr]])) for d in DELTAS}
           for cr in CRS}
    return {"model": model_name, "seed": seed, "parameters": count_parameters(model), "steps": steps,
            "share_top1": [round(s, 6) for s in share1], "share_top10": [round(s, 6) for s in share10],
            "loss_first10": float(np.mean(losses[:10])), "loss_last10": float(np.mean(losses[-10:])),
            "test_accuracy": acc, "cnc": cnc, "cpu_s": time.process_time() - cpu0}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == name]
        s1 = [v for r in mine for v in r["share_top1"]]
        s10 = [v for r in mine for v in r["share_top10"]]
        out[name] = {
            "parameters": mine[0]["parameters"],
            "share_top1": _summary(s1), "share_top10": _summary(s10),
            "share_top1_median_per_seed": [float(np.median(r["share_top1"])) for r in mine],
            "share_top10_median_per_seed": [float(np.median(r["share_top10"])) for r in mine],
            # steps pooled over the seeds: a seed's fraction is in runs[].cnc
            "cnc": {cr: {d: float(np.mean([r["cnc"][cr][d] for r in mine])) for d in mine[0]["cnc"][cr]}
                    for cr in mine[0]["cnc"]},
            "test_accuracy": [r["test_accuracy"] for r in mine],
            "loss_first10": [r["loss_first10"] for r in mine], "loss_last10": [r["loss_last10"] for r in mine],
            "cpu_s": sum(r["cpu_s"] for r in mine)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="adacomp_cnn,dlion_cnn,resnet_small")
    ap.add_argument("--dataset", default="mnist5k")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", default="6,7,8", help="Table V's seeds (make table-scadles-5 SEEDS=3)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/topk-norm-share.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from testbed.data.datasets import load_dataset

    seeds = [int(s) for s in a.seeds.split(",")]
    runs = []
    wall0 = time.time()
    for seed in seeds:
        ds = load_dataset(a.dataset, seed=seed)  # the held-out split follows the seed, as in a run
        for name in a.models.split(","):
            r = run_one(name, ds, seed, a.steps, a.batch, a.lr)
            runs.append(r)
            print(f"{name} seed {seed}: {r['parameters']:,} params, top-1% share median "
                  f"{np.median(r['share_top1']):.3f}, top-10% {np.median(r['share_top10']):.3f}, "
                  f"loss {r['loss_first10']:.2f} -> {r['loss_last10']:.2f}, acc {r['test_accuracy']:.3f}, "
                  f"{r['cpu_s']:.0f} CPU s", flush=True)
    summary = summarize(runs)
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    doc = {"benchmark": "topk-norm-share", "date": time.strftime("%Y-%m-%d"), "commit": commit,
           "machine": f"{platform.machine()}, torch {torch.__version__}, 1 thread",
           "setup": {"dataset": a.dataset, "batch": a.batch, "lr": a.lr, "optimizer": "plain SGD (no momentum)",
                     "steps": a.steps, "seeds": seeds, "selection": "whole model (top_c_whole_model)",
                     "crs": list(CRS), "deltas": list(DELTAS)},
           "summary": summary, "runs": runs,
           "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.time() - wall0}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for name, s in summary.items():
        print(f"{name} ({s['parameters']:,} params): top-1% {s['share_top1']['median']:.3f} "
              f"[{s['share_top1']['p10']:.3f}, {s['share_top1']['p90']:.3f}], top-10% "
              f"{s['share_top10']['median']:.3f} [{s['share_top10']['p10']:.3f}, {s['share_top10']['p90']:.3f}]; "
              f"CNC CR=0.01 {list(s['cnc']['CR=0.01'].values())}, CR=0.1 {list(s['cnc']['CR=0.1'].values())}")
    print(f"wrote {out} ({doc['cpu_s']:.0f} CPU s, {doc['wall_s']:.0f} s wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
