"""`edgebed down` after `kill -9` of a runner on the two-host lab: a fleet scenario on
runtime swarm (`edgebed lab up --hosts 2` first), the runner killed `--after` seconds past its
first closed round, then `edgebed down` timed, and each lab host's engine asked once a second
for containers labelled edgebed's until none is left (down waits for them since it removes the
services; before, the containers went up to a minute after it returned). Needs root; run it
with nothing else on the machine.

    python benchmarks/swarm_crash_down.py --devices 1000 --out benchmarks/results/swarm-crash-down-1000.json
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emit import emit  # noqa: E402

from testbed.runtimes.swarm.lab import lab_hosts  # noqa: E402

EDGEBED = [str(REPO / ".venv" / "bin" / "edgebed")]


def scenario(devices: int, path: Path) -> Path:
    sc = yaml.safe_load((REPO / "scenarios" / "fleet" / "availability.yaml").read_text())
    sc["runtime"] = "swarm"
    sc["workers"][0]["count"] = devices
    sc["stop"] = {"seconds": 600}
    path.write_text(yaml.safe_dump(sc))
    return path


def rounds_closed(run_dir: Path) -> int:
    try:
        return max(0, len((run_dir / "rounds.csv").read_text().splitlines()) - 1)
    except OSError:
        return 0


def ours_on_each_host() -> dict[str, int]:
    import docker

    counts = {}
    for h in lab_hosts():
        engine = docker.DockerClient(base_url=h.socket, timeout=30)
        counts[h.name] = len(engine.containers.list(all=True, filters={"label": "edgebed"}, sparse=True))
    return counts


def measure(devices: int, after: float) -> dict:
    if len(lab_hosts()) < 2:
        sys.exit("needs the lab: edgebed lab up --hosts 2")
    tmp = Path(tempfile.mkdtemp(prefix="eb-crash-"))
    run_dir = tmp / "run"
    t0 = time.time()
    runner = subprocess.Popen(EDGEBED + ["up", str(scenario(devices, tmp / "sc.yaml")), "--out", str(run_dir), "-q"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while rounds_closed(run_dir) < 1:
        if runner.poll() is not None or time.time() - t0 > 900:
            return {"ok": False, "error": f"no round closed (runner exit {runner.poll()})"}
        time.sleep(1)
    first_round_s = time.time() - t0
    time.sleep(after)
    before = ours_on_each_host()
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    t1 = time.time()
    down = subprocess.run(EDGEBED + ["down"], capture_output=True, text=True)
    down_s = time.time() - t1
    at_return = ours_on_each_host()
    left, gone_s = at_return, 0.0
    while any(left.values()) and time.time() - t1 < 300:
        time.sleep(1)
        left = ours_on_each_host()
        gone_s = time.time() - t1
    return {"benchmark": "swarm-crash-down", "devices": devices, "first_round_s": round(first_round_s, 1),
            "killed_after_first_round_s": after, "containers_before_kill": before,
            "down_seconds": round(down_s, 1), "down_exit": down.returncode, "down_tail": down.stdout[-600:],
            "containers_when_down_returned": at_return,
            "all_containers_gone_s": round(max(gone_s, down_s), 1) if not any(left.values()) else None,
            "ok": down.returncode == 0 and not any(at_return.values()),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--after", type=float, default=20.0, help="seconds past the first closed round to kill at")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    result = measure(args.devices, args.after)
    emit(result, args.out)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
