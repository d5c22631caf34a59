"""What a round's work costs in fresh processes against warm ones, with nothing but PyTorch: K
clients' local steps (the AdaComp CNN, batches of 32 from mnist5k, one torch thread each) done by
K processes forked with their model built and no step taken yet (a per-round trainer that just
started), by K processes that have taken 10 steps already (a parked trainer handed its round),
and by as many processes as cores, warm, taking the K clients' steps between them (Flower's
actors, the bench's ideal round). Each is timed from a common start to the last process's end.

    .venv/bin/python benchmarks/warm_trainers.py [--clients 10] [--steps 10] [--repetitions 3] [--out FILE]

No root; run it alone (results: BENCHMARKS.md, "Where a fleet's round goes")."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _steps(net, x, y, rng, n: int) -> None:
    import torch
    import torch.nn.functional as F

    for _ in range(n):
        idx = torch.from_numpy(rng.integers(0, len(y), 32))
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(x[idx]), y[idx]).backward()
        with torch.no_grad():
            for p in net.parameters():
                p.sub_(p.grad, alpha=0.01)


def timed(processes: int, steps_each: int, warm: bool, data) -> float:
    """Seconds from the start signal until `processes` forked processes took `steps_each` steps."""
    import numpy as np

    from testbed.data.models import build_model

    ds, x, y = data
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pids = []
    for i in range(processes):
        pid = os.fork()
        if pid == 0:
            net, rng = build_model("adacomp_cnn", tuple(ds.input_shape), ds.num_classes), np.random.default_rng(i)
            if warm:
                _steps(net, x, y, rng, 10)
            os.write(ready_w, b"r")
            os.read(go_r, 1)
            _steps(net, x, y, rng, steps_each)
            os._exit(0)
        pids.append(pid)
    for _ in range(processes):
        os.read(ready_r, 1)
    t = time.perf_counter()
    os.write(go_w, b"g" * processes)
    for pid in pids:
        os.waitpid(pid, 0)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10, help="local steps a client takes")
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import numpy as np
    import torch

    from testbed.data.datasets import load_dataset

    torch.set_num_threads(1)
    ds = load_dataset("mnist5k", seed=1)
    data = (ds, torch.from_numpy(np.ascontiguousarray(ds.train_x)), torch.from_numpy(np.ascontiguousarray(ds.train_y)))
    cores = os.cpu_count() or 1
    k, h = args.clients, args.steps
    runs: dict[str, list[float]] = {"fresh, one a client": [], "warm, one a client": [], "warm, one a core": []}
    for _ in range(args.repetitions):  # interleaved
        runs["fresh, one a client"].append(timed(k, h, False, data))
        runs["warm, one a client"].append(timed(k, h, True, data))
        runs["warm, one a core"].append(timed(cores, -(-k * h // cores), True, data))
    out = {"clients": k, "steps": h, "cores": cores, "seconds": runs,
           "median_s": {name: statistics.median(v) for name, v in runs.items()}}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
