"""Past one bridge: bring up N workers (plus ps and evaluator) on the netns runtime with
no processes (namespaces, veths, HTB, cgroups, the control network), and report the seconds to make
and to tear down, each bridge's port count, and two checks across leaves of the trees: a TCP
connection from w0 to the last worker over the data network (it must connect), and one between the
same two over the control network (it must not: a node reaches the runner only).

    .venv/bin/python benchmarks/fleet_bringup.py --workers 1100 [--out benchmarks/results/fleet-bringup-1100.json]
    .venv/bin/python benchmarks/fleet_bringup.py --workers 1000 --crash [--out ...]
    .venv/bin/python benchmarks/fleet_bringup.py --workers 1000 --sample [--out ...]

--crash: a child process brings the fleet up and is killed with SIGKILL once it is up (no teardown
of its own); then `edgebed down` is timed, and what `edgebed status` lists of the run after it
must be nothing.

--sample: once up, what the run's monitor spends each second on the fleet (run/monitor.py's
Sampler: every access link's counters, every shaped class, every cgroup's usage), its parts
timed alone and ten whole samples a second apart (the links idle, as a fleet's mostly are).

Needs root; run with nothing else on the machine (it is a timing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.bench.harness import Bench  # noqa: E402
from testbed.kernel.netlink import ns_iproute  # noqa: E402
from testbed.run.progress import FleetProgress  # noqa: E402
from testbed.runtimes.state import leftovers  # noqa: E402

LISTEN = "import socket,sys;s=socket.socket();s.bind((sys.argv[1],9));s.listen();s.settimeout(20);s.accept()"
CONNECT = ("import socket,sys;s=socket.socket();s.settimeout(3)\n"
           "try:\n s.connect((sys.argv[1],9));print('connected')\nexcept OSError as e:\n print(type(e).__name__)")


def bridge_ports(netns: str) -> dict[str, int]:
    """Ports on each bridge of a switch namespace."""
    with ns_iproute(netns) as ipr:
        links = ipr.get_links()
        bridges = {link["index"]: link.get_attr("IFLA_IFNAME") for link in links if _kind(link) == "bridge"}
        ports = {name: 0 for name in bridges.values()}
        for link in links:
            master = link.get_attr("IFLA_MASTER")
            if master in bridges:
                ports[bridges[master]] += 1
    return ports


def _kind(link) -> str | None:
    info = link.get_attr("IFLA_LINKINFO")
    return info.get_attr("IFLA_INFO_KIND") if info is not None else None


def across(src_ns: str, dst_ns: str, address: str) -> str:
    """'connected' or the error of a TCP connection from src_ns to a listener on address in dst_ns."""
    listener = subprocess.Popen(["ip", "netns", "exec", dst_ns, sys.executable, "-c", LISTEN, address])
    time.sleep(1.0)
    try:
        out = subprocess.run(["ip", "netns", "exec", src_ns, sys.executable, "-c", CONNECT, address],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or out.stderr.strip()[-200:]
    finally:
        listener.kill()
        listener.wait()


def fleet(workers: int) -> dict:
    return {"name": "fleet", "profiles": {"p": {"bandwidth": "10mbit"}}, "ps": {"profile": "p"},
            "evaluator": {"profile": "p"}, "workers": [{"count": workers, "profile": "p"}]}


def hold(workers: int) -> None:
    """The child of --crash: up, say so with the run id, and wait to be killed."""
    bench = Bench({}, "netns", scenario=fleet(workers))
    with bench:
        print(f"up {bench.run_id}", flush=True)
        time.sleep(3600)


def crash(workers: int) -> dict:
    """Bring a fleet up in a child, SIGKILL it, and time `edgebed down`."""
    t0 = time.time()
    child = subprocess.Popen([sys.executable, __file__, "--workers", str(workers), "--hold"], stdout=subprocess.PIPE,
                             text=True)
    line = child.stdout.readline().split() if child.stdout else []
    up_s = time.time() - t0
    child.kill()
    child.wait()
    if line[:1] != ["up"]:
        return {"benchmark": "fleet-crash", "workers": workers, "ok": False, "error": "the child never came up"}
    run_id = line[1]
    t1 = time.time()
    down = subprocess.run([sys.executable, "-m", "testbed.cli", "down", run_id], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    down_s = time.time() - t1
    left = [x for x in leftovers() if x.startswith(run_id)]
    namespaces = ([n for n in os.listdir("/run/netns") if n.startswith(f"eb-{run_id}-")]
                  if os.path.isdir("/run/netns") else [])
    return {"benchmark": "fleet-crash", "workers": workers, "nodes": workers + 2, "up_seconds": round(up_s, 1),
            "down_after_kill_seconds": round(down_s, 1), "down_exit": down.returncode,
            "down_output_lines": len(down.stdout.splitlines()), "left_after": left, "namespaces_after": len(namespaces),
            "ok": down.returncode == 0 and not left and not namespaces, "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def sampling(rt, run_dir: Path, samples: int = 10) -> dict:
    """Seconds the monitor's pieces take on this fleet (mean of 5 calls each), and whole samples."""
    from testbed.records import metrics
    from testbed.run.monitor import Sampler

    def timed(fn, n: int = 5) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return round((time.perf_counter() - t) / n, 4)

    parts = {"counters": timed(rt.counters), "usage": timed(rt.usage),
             "link_stats_every_class": timed(rt.link_stats, 1)}
    run_dir.mkdir(exist_ok=True)
    metrics.init_tables(run_dir)
    sampler = Sampler(rt, run_dir, time.time(), {})
    whole = []
    for _ in range(samples):
        t = time.perf_counter()
        sampler.sample()
        whole.append(round(time.perf_counter() - t, 4))
        time.sleep(max(0.0, 1.0 - whole[-1]))
    return {"part_seconds": parts, "sample_seconds": whole}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1100)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--profile", action="store_true", help="where bring-up's time goes (cProfile, the top 25)")
    ap.add_argument("--crash", action="store_true", help="kill -9 the bring-up's process, then time `edgebed down`")
    ap.add_argument("--sample", action="store_true", help="time the run monitor's sampling of the fleet once up")
    ap.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hold:
        hold(args.workers)
        return 0
    if args.crash:
        return report(crash(args.workers), args.out)
    scenario = fleet(args.workers)
    t0 = time.time()
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    bench = Bench({}, "netns", scenario=scenario)
    assert bench.rt is not None  # opened, or Bench raised
    bench.rt.progress = up_stages = FleetProgress(print, sys.stdout.isatty())
    with bench as (rt, spec):
        up_s = time.time() - t0
        up_stages.close()
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)
        run_id, last = bench.run_id, spec.nodes[-1].name
        data = bridge_ports(f"eb-{run_id}-sw")
        control = bridge_ports(f"eb-{run_id}-ctl")
        data_check = across(f"eb-{run_id}-w0", f"eb-{run_id}-{last}", spec.node(last).address)
        control_check = across(f"eb-{run_id}-w0", f"eb-{run_id}-{last}", rt.control.addresses[last])
        sampled = sampling(rt, bench.scratch / "records") if args.sample else None
        rt.progress = down_stages = FleetProgress(print, sys.stdout.isatty())
        t1 = time.time()
    down_s = time.time() - t1
    down_stages.close()
    out = {"benchmark": "fleet-bringup", "workers": args.workers, "nodes": len(spec.nodes),
           "up_seconds": round(up_s, 1),
           "up_stage_seconds": {k: round(v, 1) for k, v in up_stages.stages.items()},
           "teardown_seconds": round(down_s, 1),
           "teardown_stage_seconds": {k: round(v, 1) for k, v in down_stages.stages.items()},
           "data_bridge_ports": data, "control_bridge_ports": control,
           "data_w0_to_last": data_check, "control_w0_to_last": control_check,
           **({"sampling": sampled} if sampled else {}),
           "ok": data_check == "connected" and control_check != "connected"
           and max([*data.values(), *control.values()]) <= 1023 and bench.problems == [],
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return report(out, args.out)


def report(out: dict, path: Path | None) -> int:
    print(json.dumps(out, indent=1))
    if path:
        path.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
