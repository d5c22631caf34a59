"""What sealing a netns node process costs at its start: the steps runtimes/netns._bootstrap takes
after joining its namespace, timed in forked children of a process that imported torch (as the
forkserver has), old way against new:

    before: a mount namespace with the host's controls read-only, every capability dropped (uid 0)
    after:  the same with a procfs of its own (hidepid=invisible), the forkserver's handles let go,
            the bridges to what root's closed folders hold (kernel.mounts.bridges, planned once),
            and the node's own uid (kernel.identity)

    .venv/bin/python benchmarks/seal_cost.py [--children 200] [--out FILE.json]

Needs root. A timing: run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402,F401  (the forkserver's pages: a child forks from a process that holds them)

from testbed.kernel.identity import node_identity  # noqa: E402
from testbed.kernel.mounts import bridges, make_bridges, read_only_host_controls  # noqa: E402
from testbed.kernel.privileges import drop_privileges  # noqa: E402
from testbed.runtimes.netns.runtime import _leave_forkserver, reached_paths  # noqa: E402


def _child(sealed: bool, plan) -> float:
    t0 = time.perf_counter()
    if sealed:
        _leave_forkserver()
    read_only_host_controls(hide_others=sealed)
    if sealed:
        make_bridges(plan)
    drop_privileges(node_identity("abcdef", 1) if sealed else None)
    return time.perf_counter() - t0


def timed(sealed: bool, plan, children: int) -> list[float]:
    out = []
    for _ in range(children):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, repr(_child(sealed, plan)).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            out.append(float(f.read()))
        os.waitpid(pid, 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=200)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    plan = bridges(reached_paths())
    result = {"bridges": [f for f, _ in plan]}
    for name, sealed in (("before", False), ("after", True), ("before again", False), ("after again", True)):
        ms = [1000 * s for s in timed(sealed, plan, args.children)]
        result[name] = {"median_ms": round(statistics.median(ms), 3),
                        "p90_ms": round(sorted(ms)[int(0.9 * len(ms))], 3)}
        print(f"{name:>13}: median {result[name]['median_ms']:.3f} ms, p90 {result[name]['p90_ms']:.3f} ms "
              f"({args.children} children)")
    print(f"bridged: {', '.join(result['bridges']) or 'nothing'}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
