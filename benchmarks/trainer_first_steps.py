"""What a per-round trainer's model costs as it starts: forked processes each take the run's
initial model (models.initial_model) and time it and their first steps, from a parent that kept
the model before forking (the netns forkserver with data/preload.py's keep_initial_model) or from
one that did not (each fork builds it). The AdaComp CNN, batches of 32 from mnist5k, one torch
thread. Each mode runs in its own parent process, the modes alternating.

    .venv/bin/python benchmarks/trainer_first_steps.py [--forks 8] [--steps 6] [--repetitions 3] [--out FILE]

No root; run it alone (results: BENCHMARKS.md, "Where a fleet's round goes")."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # warm_trainers' step

MODEL, SHAPE, CLASSES, SEED = "adacomp_cnn", (1, 28, 28), 10, 1


def one_parent(kept: bool, forks: int, steps: int) -> list[list[float]]:
    """[initial model ms, step 1 ms, ...] of each fork of this process."""
    import numpy as np
    import torch
    from warm_trainers import _steps as one_step

    from testbed.data import models
    from testbed.data.datasets import shared_dataset

    torch.set_num_threads(1)
    ds = shared_dataset("mnist5k", seed=SEED, test_size=None)
    x, y = torch.from_numpy(np.ascontiguousarray(ds.train_x)), torch.from_numpy(np.ascontiguousarray(ds.train_y))
    if kept:
        models.keep_initial_model(MODEL, SHAPE, CLASSES, SEED)
    out = []
    for i in range(forks):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            t = time.perf_counter()
            net = models.initial_model(MODEL, SHAPE, CLASSES, SEED)
            times, rng = [time.perf_counter() - t], np.random.default_rng(i)
            for _ in range(steps):
                t = time.perf_counter()
                one_step(net, x, y, rng, 1)
                times.append(time.perf_counter() - t)
            os.write(w, json.dumps([round(s * 1e3, 2) for s in times]).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        out.append(json.loads(os.read(r, 1 << 16)))
        os.close(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--parent", choices=["kept", "built"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.parent:
        print(json.dumps(one_parent(args.parent == "kept", args.forks, args.steps)))
        return
    rows: dict[str, list[list[float]]] = {"built in the fork": [], "kept by the parent": []}
    for _ in range(args.repetitions):  # alternating
        for mode, flag in (("built in the fork", "built"), ("kept by the parent", "kept")):
            got = subprocess.run([sys.executable, __file__, "--parent", flag, "--forks", str(args.forks),
                                  "--steps", str(args.steps)], capture_output=True, text=True, check=True)
            rows[mode] += json.loads(got.stdout)
    out = {"forks": args.forks * args.repetitions, "steps": args.steps, "ms": rows,
           "median_ms": {mode: {"initial model": statistics.median(r[0] for r in rs),
                                "step 1": statistics.median(r[1] for r in rs),
                                "steps 2..": statistics.median(s for r in rs for s in r[2:])}
                         for mode, rs in rows.items()}}
    print(json.dumps(out["median_ms"], indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
