"""The tight timing bounds that used to sit in tests (BENCHMARKS.md, "Timing bounds"): each check
measures and compares with the bound the test had; the tests keep only a loose bound that a broken
mechanism fails (a missing shaper, a class ignored, a delay applied twice), not noise on a loaded CI
machine. Root needed (namespaces, tc, cgroups); docker checks need an engine.

    .venv/bin/python benchmarks/timing_bounds.py [--only timeline,stream,topology,peer-classes,smoke-rtt,swarm-links]
                                                 [--runtime netns|docker] [--out benchmarks/results]

Prints one line per bound and exits 1 if any does not hold; writes timing-bounds-RUNTIME.json."""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def stream(runtime: str) -> list[tuple[str, float, bool]]:
    """Two devices at 50 samples/s of 3 KB through the embedded broker: each within 5% of the rate
    (was tests/data/test_broker.py); nothing lost."""
    from testbed.bench.stream import stream_benchmark

    res = stream_benchmark(2, 50.0, seconds=10.0, warmup=2.0, say=lambda s: None)
    out = [(f"stream {t['topic']} samples/s (50 +/- 5%)", t["achieved"], abs(t["achieved"] / 50.0 - 1) <= 0.05)
           for t in res["per_topic"]]
    return out + [(f"stream {t['topic']} lost samples (0)", t["sent"] - t["received"], t["sent"] == t["received"])
                  for t in res["per_topic"]]


def topology(runtime: str) -> list[tuple[str, float, bool]]:
    """Two sites, 200 Mbit/s LANs, a 20 Mbit/s WAN: goodput 95% +/- 5 points of the rate on each path
    and direction (was tests/runs/test_topology_runtime.py)."""
    from testbed.bench.links import topology_benchmark

    res = topology_benchmark(lan="200mbit", wan="20mbit", seconds=3.0, say=lambda s: None, tolerance=0.10,
                             runtime=runtime)
    return [(f"topology {r['path']} {r['direction']} goodput/rate (0.95 +/- 0.05)", r["goodput_ratio"],
             abs(r["goodput_ratio"] - 0.95) <= 0.05) for r in res["results"]]


def peer_classes(runtime: str) -> list[tuple[str, float, bool]]:
    """w0's 40 Mbit/s access link with its traffic to w1 held to 8 Mbit/s (16 back): goodput 95% +/- 6
    points of each class's rate (was tests/runs/test_topology_runtime.py)."""
    from testbed.bench.harness import Bench, measure_transfer

    scenario = {"name": "bench", "runtime": "netns", "profiles": {"edge": {"bandwidth": "40mbit", "loss": 0.0001}},
                "workers": [{"count": 2, "profile": "edge"}],
                "links": [{"between": ["w0", "w1"], "forward": "8mbit", "reverse": "16mbit"}]}
    bench = Bench({}, "netns", scenario=scenario)
    out = []
    with bench as (rt, spec):
        for src, dst, rate in (("w0", "w1", 8e6), ("w1", "w0", 16e6), ("w0", "ps", 40e6)):
            got, _ = measure_transfer(bench, spec.node(src), spec.node(dst), 3.0, 1, f"{src}-{dst}",
                               lambda n=src: rt.counters()[n]["up_bytes"])
            out.append((f"peer class {src}->{dst} {rate / 1e6:g} Mbit/s: goodput/rate (0.95 +/- 0.06)", got / rate,
                        abs(got / rate - 0.95) <= 0.06))
    return out


def _link_check(runtime: str, **changes) -> list[dict] | int:
    """scenarios/smoke.yaml (with `changes`) run with --verify-links: the link check's rows, or the
    exit code of a run that failed."""
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        sc = {**yaml.safe_load((REPO / "scenarios" / "smoke.yaml").read_text()), "runtime": runtime, **changes}
        path, run_dir = Path(tmp) / "s.yaml", Path(tmp) / "run"
        path.write_text(yaml.safe_dump(sc))
        exe = Path(sys.executable).with_name("edgebed")
        r = subprocess.run([str(exe), "up", str(path), "--out", str(run_dir), "--verify-links", "-q"], cwd=REPO,
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            print(r.stdout[-2000:] + r.stderr[-2000:], file=sys.stderr)
            return r.returncode
        return json.loads((run_dir / "meta.json").read_text())["link_check"]["rows"]


def _rtt_bounds(name: str, rows: list[dict]) -> list[tuple[str, float, bool]]:
    return [(f"{name} {row['node']} rtt over configured, ms (0 to 8)", 1000 * (row["measured_rtt_s"] -
             row["expected_rtt_s"]), 0 <= row["measured_rtt_s"] - row["expected_rtt_s"] < 0.008)
            for row in rows if row["direction"] == "rtt"]


def smoke_rtt(runtime: str) -> list[tuple[str, float, bool]]:
    """scenarios/smoke.yaml with --verify-links: each worker's measured round trip at most 8 ms over
    the configured one (was tests/runs/test_smoke_run.py); 15 s of training is enough for the check."""
    rows = _link_check(runtime, stop={"seconds": 15})
    return [("smoke run exit code", rows, False)] if isinstance(rows, int) else _rtt_bounds("smoke", rows)


def swarm_links(runtime: str) -> list[tuple[str, float, bool]]:
    """The smoke scenario on the lab of two hosts (made here if none is up, removed after), workers
    on the second: every cross-host rate within 3% (was tests/lab/test_swarm.py), round trips as smoke-rtt."""
    from testbed.runtimes.swarm import lab

    made = not lab.lab_hosts()
    if made:
        lab.lab_up(2)
    try:
        rows = _link_check("swarm", stop={"steps": 20},
                           placement={"ps": "eb-lab-h1", "eval": "eb-lab-h1", "workers": "eb-lab-h2"})
    finally:
        if made:
            lab.lab_down()
    if isinstance(rows, int):
        return [("swarm run exit code", rows, False)]
    return [(f"swarm {row['node']} {row['direction']} rate ratio (1 +/- 0.03)", row["ratio"],
             abs(row["ratio"] - 1) <= 0.03) for row in rows if row["direction"] != "rtt"] + _rtt_bounds("swarm", rows)


def timeline(runtime: str) -> list[tuple[str, float, bool]]:
    """The timeline's thread on the wall clock: each change applied within 100 ms of its time (was
    tests/run/test_timeline.py). No root needed."""
    from testbed.run.timeline import Change, Timeline

    got: list[tuple[float, float]] = []
    changes = [Change(t, None, f"w{i}", "cpu", {"cpus": 1.0}) for i, t in enumerate((0.2, 0.5, 0.9))]
    tl = Timeline(changes, apply=lambda c: "ok", record=lambda c, at, d: got.append((c.time, at)), t0=time.time())
    tl.start()
    deadline = time.time() + 5
    while len(got) < 3 and time.time() < deadline:
        time.sleep(0.05)
    tl.stop()
    return [(f"timeline change at {s:.1f} s, late by ms (0 to 100)", 1000 * (a - s), 0 <= a - s < 0.1)
            for s, a in got] + [("timeline changes applied (3)", len(got), len(got) == 3)]


CHECKS = {"timeline": timeline, "stream": stream, "topology": topology, "peer-classes": peer_classes,
          "smoke-rtt": smoke_rtt, "swarm-links": swarm_links}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(c for c in CHECKS if c != "swarm-links"),
                    help="checks, comma-separated: " + ", ".join(CHECKS) + " (all but swarm-links by default)")
    ap.add_argument("--runtime", default="netns", choices=["netns", "docker"],
                    help="for topology and smoke-rtt (the others are netns only)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    rows = []
    for name in args.only.split(","):
        t0 = time.monotonic()
        for label, value, ok in CHECKS[name](args.runtime):
            rows.append({"check": name, "bound": label, "value": value, "ok": ok})
            print(f"{'ok  ' if ok else 'OFF '} {label}: {value:.3f}", flush=True)
        print(f"     ({name}: {time.monotonic() - t0:.0f} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    runtime = "swarm" if args.only == "swarm-links" else args.runtime  # (swarm-links runs on swarm only)
    (args.out / f"timing-bounds-{runtime}.json").write_text(json.dumps(
        {"benchmark": "timing-bounds", "runtime": runtime, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
         "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
