"""Where a DDP all-reduce loses time on a shaped link: w0's interface counters, read every 2 ms
from inside its namespace (netns runtime) while `edgebed bench ddp`'s program runs at one rate.

    .venv/bin/python benchmarks/ddp_link_trace.py --rate 10mbit

Of the 50 ms slices with traffic, the share in which each direction moved at least 80% of the
rate, and both together; then 1.5 s of slices from the middle of the run. Both directions
running at the rate together is what the ring bound assumes; a direction that stalls while the
other runs is what TCP does when its ACKs wait behind the other direction's data in the link's
FIFO queue (gloo opens one TCP connection per pair of ranks and runs both ring directions over
it)."""

import argparse
import glob
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.bench.ddp import ddp_run  # noqa: E402
from testbed.scenario import units  # noqa: E402

SLICE = 0.05


def sample_w0(samples: list, stop: threading.Event) -> None:
    """In a thread of its own: wait for w0's namespace, enter it, read /proc/self/net/dev."""
    from testbed.kernel.netlink import enter_netns

    while not stop.is_set():
        found = glob.glob("/run/netns/eb*-w0")
        if found:
            break
        time.sleep(0.1)
    else:
        return
    enter_netns(os.path.basename(found[0]))  # this thread only (setns is per thread)
    while not stop.is_set() and os.path.exists(found[0]):
        with open("/proc/thread-self/net/dev") as f:
            for line in f:
                if line.strip().startswith("eth0:"):
                    v = line.split(":")[1].split()
                    samples.append((time.time(), int(v[8]), int(v[0])))
        time.sleep(0.002)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", default="10mbit")
    args = ap.parse_args()
    rate = units.parse_rate(args.rate)
    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_w0, args=(samples, stop), daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory() as tmp:
        res = ddp_run(args.rate, out=Path(tmp) / "run")
    stop.set()
    sampler.join(5)
    s = np.array(samples, dtype=float)
    t, tx, rx = s[:, 0], s[:, 1], s[:, 2]
    per_slice = rate / 8 * SLICE
    edges = np.arange(t[0], t[-1], SLICE)
    up, down = np.diff(np.interp(edges, t, tx)), np.diff(np.interp(edges, t, rx))
    active = (up + down) >= 0.1 * per_slice  # slices of an all-reduce (or the program's start)
    up_full, down_full = up[active] >= 0.8 * per_slice, down[active] >= 0.8 * per_slice
    print(json.dumps({k: v for k, v in res.items() if k in ("rate", "ratio", "allreduce_median_s", "ring_bound_s")}))
    print(f"{active.sum()} slices of {SLICE * 1000:.0f} ms with traffic: up at >= 80% of the rate in "
          f"{up_full.mean():.0%}, down in {down_full.mean():.0%}, both in {(up_full & down_full).mean():.0%}")
    middle = np.where(active)[0][active.sum() // 2]
    print(f"1.5 s of w0's link from the middle of the run (the rate moves {per_slice / 1e3:.1f} KB a slice):")
    for i in range(middle, min(middle + int(1.5 / SLICE), len(up))):
        print(f"  {edges[i] - edges[middle]:5.2f} s  up {up[i] / 1e3:6.1f} KB  down {down[i] / 1e3:6.1f} KB")

if __name__ == "__main__":
    main()
