"""What cutting a device off from everyone but the runner's path costs (node.own_link.cut_everyone:
a device gone offline on runtime swarm, made by its fleet host's one process): an eBPF classifier
each way against 32 u32 prefixes each way, on a shaped veth in a namespace of its own, shaped
and cut from this process as a fleet host does (OwnLink(netns)). Needs root.

    python benchmarks/cut_everyone.py --cycles 50 --out benchmarks/results/cut-everyone.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emit import emit  # noqa: E402

from testbed.node.own_link import OwnLink  # noqa: E402

SPARE = ["10.77.0.3"]


def namespace() -> str:
    tag = uuid.uuid4().hex[:6]
    ns = f"ebbench-{tag}"
    for cmd in (f"ip netns add {ns}", f"ip -n {ns} link add v{tag} type veth peer name p{tag}",
                f"ip -n {ns} addr add 10.77.0.1/24 dev v{tag}", f"ip -n {ns} link set v{tag} up"):
        subprocess.run(cmd.split(), check=True, capture_output=True)
    return ns


def cycles(kind: str, n: int) -> dict:
    ns = namespace()
    try:
        link = OwnLink(ns)
        link.shape("10.77.0.1", {"rate_bps": 20_000_000}, {"rate_bps": 20_000_000})
        link.bpf_cuts = None if kind == "bpf" else False
        cut, heal = [], []
        for _ in range(n):
            t = time.perf_counter()
            link.cut_everyone(True, SPARE)
            cut.append(time.perf_counter() - t)
            t = time.perf_counter()
            link.cut_everyone(False, SPARE)
            heal.append(time.perf_counter() - t)
        return {"kind": link.everyone_kind, "cycles": n,
                "cut_ms": {"median": round(statistics.median(cut) * 1e3, 2), "max": round(max(cut) * 1e3, 2)},
                "heal_ms": {"median": round(statistics.median(heal) * 1e3, 2), "max": round(max(heal) * 1e3, 2)}}
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = {"benchmark": "cut-everyone", "spared": SPARE, "runs": [cycles(k, args.cycles) for k in ("bpf", "u32")],
              "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
