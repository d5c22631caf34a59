"""The GPU check, for a machine lent with a GPU and no network; the same script on a
machine without one runs its CPU parts and says which GPU steps it skipped and why.

    bash benchmarks/gpu_check.sh [OUT.json]        (installs `make gpu-wheels`' wheels first)

Parts, each bounded in time, each with `status` ran / failed / skipped and its reason:
  probe        torch, CUDA, the GPUs, whether this machine can make netns nodes (a gVisor sandbox
               may lack namespaces, veth, tc or cgroups) and whether an MPS daemon starts;
  step_time    a worker's training step (edgebed's worker code: worker_setup, device_step) on the
               CPU and on the GPU, the smoke model (adacomp_cnn) at batch 32 and 128, and the
               accuracy after training on the GPU (the roles' training on CUDA, in one process);
  smoke        edgebed up on the netns runtime: the smoke scenario with `gpus: 1` for every worker;
               accuracy >= 0.90, each worker's log names the GPU;
  shares       8 workers on one GPU at once for a fixed window, two each at gpu_share 1, 0.5, 0.25,
               0.125, by MPS (where it starts) and by paced steps; a 9th pushed past its gpu_memory
               must fail alone, naming the cap. Verdict fixed before the run: a group's median step
               time is within 0.75-1.33x of (share 1's median) / share;
  ddp          examples/ddp/train.py, two ranks on one GPU: NCCL, else gloo on CUDA tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARES = [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125]
GPU_PARTS = ("shares_pace", "shares_mps", "mps_threads_small", "mps_threads_large", "ddp", "smoke", "netns_shares")
FOLLOWS = (0.75, 1.33)  # a share's step time / (share 1's / share): the verdict's band, fixed before the run
CAP_BYTES = 1 << 30  # the 9th worker's gpu_memory, which it pushes past (MPS clients need room for their context)


def child_env(extra: dict) -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **extra}


def run_child(job: dict, env: dict, timeout: float) -> dict:
    """One worker in a process of its own (its CUDA environment set before CUDA starts)."""
    cmd = [sys.executable, str(Path(__file__)), "--child", json.dumps(job)]
    try:
        p = subprocess.run(cmd, env=child_env(env), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout:g} s"}
    return parse_child(p.returncode, p.stdout, p.stderr)


def parse_child(code: int, out: str, err: str) -> dict:
    last = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        res = json.loads(last)
    except ValueError:
        res = {}
    log = [line for line in out.splitlines() if "training on" in line]
    return {"status": "ran" if code == 0 else "failed", "exit": code, **res, "log": log,
            **({"error": err.strip().splitlines()[-1] if err.strip() else ""} if code else {})}


# -- the child: a worker's training with edgebed's own code -------------------------------------------
def child(job: dict) -> None:
    import torch
    import torch.nn.functional as F

    from testbed.node.roles.common import RoleConfig, device_step, worker_setup
    from testbed.node.roles.evaluator import evaluate
    from testbed.plan import parse_scenario

    sc = parse_scenario({"name": "gpu-check", "seed": 1, "workload": {
        "model": job.get("model", "adacomp_cnn"), "dataset": "mnist5k", "batch_size": job["batch"], "lr": 0.05}})
    cfg = RoleConfig(node=job["node"], role="worker", rank=0, run_dir=tempfile.mkdtemp(), t0=time.time(),
                     scenario=sc.model_dump(mode="json"), ps_address="", threads=job.get("threads", 1),
                     workers=[job["node"]])
    torch.set_num_threads(cfg.threads)
    data = worker_setup(cfg, sc)
    if job.get("start_at"):  # the shares' common window
        time.sleep(max(0.0, job["start_at"] - time.time()))
    times = train(data, job, cfg.node, device_step, F)
    out = {"device": str(data.device), "steps": len(times), "median_step_s": statistics.median(times[2:] or times),
           "paused_s": round(data.pacer.paused_seconds, 3)}
    if job.get("evaluate"):
        n = min(1000, len(data.dataset.test_y))
        x = torch.from_numpy(data.dataset.test_x[:n]).to(data.device)
        y = torch.from_numpy(data.dataset.test_y[:n]).to(data.device)
        out["accuracy"] = round(evaluate(data.model, x, y)[0], 4)
    print(json.dumps(out), flush=True)


def train(data, job: dict, node: str, device_step, F) -> list[float]:
    """Plain SGD steps, for `steps` or until `until`; the 9th share worker pushes past its cap."""
    import torch

    times, step = [], 0
    while step < job.get("steps", 10**9) and time.time() < job.get("until", float("inf")):
        step += 1
        idx = torch.from_numpy(data.batches.next())
        t = time.perf_counter()
        with device_step(data, node):
            data.model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(data.model(data.x[idx].to(data.device)), data.y[idx].to(data.device))
            loss.backward()
            loss.item()
            if job.get("push_past") and step == 5:
                torch.empty(2 * CAP_BYTES, dtype=torch.uint8, device=data.device)
        with torch.no_grad():
            for p in data.model.parameters():
                p.sub_(p.grad, alpha=0.05)
        times.append(time.perf_counter() - t)
    return times


# -- the parts --------------------------------------------------------------------------------
def probe() -> dict:
    import torch

    out = {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.cuda.is_available(),
           "cpus": os.cpu_count(), "kernel": platform.release()}
    from testbed.kernel.gpus import host_gpus

    out["gpus"] = [g.__dict__ for g in host_gpus()]
    try:  # in a process of its own: a sandbox's half-made namespace must not hang the check
        p = subprocess.run([sys.executable, str(Path(__file__)), "--netns-probe"], env=child_env({}),
                           capture_output=True, text=True, timeout=90)
        out["netns"] = (p.stdout.strip().splitlines() or [f"probe exited {p.returncode}: {p.stderr[-300:]}"])[-1]
    except subprocess.TimeoutExpired:
        out["netns"] = "the namespace probe did not finish in 90 s"
    out["mps"] = mps_problem() if out["gpus"] else "no GPU"
    return out


def netns_problem() -> str:
    """'' when this machine can make a netns node: root, a namespace, a veth, HTB, a cgroup."""
    if os.geteuid() != 0:
        return "not root"
    from testbed.kernel import cgroups
    from testbed.kernel.shaping import probe_kernel

    try:
        caps = probe_kernel()  # a scratch namespace with a veth pair and each qdisc tried on it
    except Exception as e:
        return f"no network namespace with a veth pair: {type(e).__name__}: {e}"
    if not caps.htb:
        return "no HTB qdisc"
    run_id = secrets.token_hex(3)
    try:
        cgroups.NodeCgroup(run_id, "probe").create(0.5, 64 << 20, None, None)
    except Exception as e:
        return f"no cgroup: {type(e).__name__}: {e}"
    finally:
        cgroups.kill_and_remove(f"{cgroups.TOP}/{run_id}")
    return ""


def mps_problem() -> str:
    from testbed.runtimes.gpu_share import MpsDaemon

    d = MpsDaemon(Path(tempfile.mkdtemp(prefix="edgebed-mps-check-")))
    ok = d.start([0])
    d.stop()
    return "starts" if ok else d.problem


def step_time(cuda: bool) -> dict:
    out = {}
    for batch in (32, 128):
        out[f"cpu_b{batch}"] = run_child({"node": "w0", "batch": batch, "steps": 40, "threads": min(8, os.cpu_count())},
                                         {"CUDA_VISIBLE_DEVICES": ""}, 300)
        if cuda:
            out[f"gpu_b{batch}"] = run_child({"node": "w0", "batch": batch, "steps": 200 if batch == 128 else 60,
                                              "evaluate": batch == 128}, {"CUDA_VISIBLE_DEVICES": "0"}, 300)
    if not cuda:
        out["gpu"] = {"status": "skipped", "reason": "torch sees no CUDA device"}
    return out


def shares(mps: bool, by: str = "pace", model: str = "adacomp_cnn", batch: int = 128, window: float = 20.0) -> dict:
    """8 workers at once on GPU 0 with edgebed's grant (paced steps; `mps`: beside an MPS daemon,
    which pins memory), or `by="mps"`: MPS's thread percentage alone, as a command workload gets it;
    and a 9th pushed past its memory cap beside them."""
    from testbed.kernel.gpus import host_gpus
    from testbed.node.gpu import GPU_SHARE_BY_ENV, program_env
    from testbed.runtimes.gpu_share import MpsDaemon, grant
    from testbed.scenario.schema import Profile

    share_env = (lambda env: {**program_env(env), GPU_SHARE_BY_ENV: "mps"}) if by == "mps" else (lambda env: env)
    daemon = MpsDaemon(Path(tempfile.mkdtemp(prefix="edgebed-mps-shares-"))) if mps else None
    if daemon is not None and not daemon.start([0]):
        return {"status": "failed", "reason": f"MPS: {daemon.problem}"}
    host, pipe = host_gpus(), str(daemon.pipe) if daemon else None
    try:
        start = time.time() + 25  # after every worker's set-up
        job = {"batch": batch, "model": model, "start_at": start, "until": start + window}
        jobs = [({**job, "node": f"w{i}"}, share_env(grant(Profile(gpus=[0], gpu_share=s), host, pipe).env))
                for i, s in enumerate(SHARES)]
        jobs.append(({**job, "node": "w8", "push_past": True},
                     grant(Profile(gpus=[0], gpu_memory=CAP_BYTES), host, pipe).env))
        results = _all_at_once(jobs, timeout=window + 120)
    finally:
        if daemon is not None:
            daemon.stop()
    return {"mps": mps, "by": by, "model": model, "batch": batch, **judge_shares(results)}


def _all_at_once(jobs: list[tuple[dict, dict]], timeout: float) -> list[dict]:
    cmd = lambda job: [sys.executable, str(Path(__file__)), "--child", json.dumps(job)]  # noqa: E731
    procs = [subprocess.Popen(cmd(j), env=child_env(e), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for j, e in jobs]
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append(parse_child(p.returncode, out, err))
    return results


def judge_shares(results: list[dict]) -> dict:
    ran = [r for r in results[:len(SHARES)] if r["status"] == "ran"]
    rows = []
    base = statistics.median(r["median_step_s"] for r, s in zip(results, SHARES) if s == 1.0 and r["status"] == "ran") \
        if any(s == 1.0 and r["status"] == "ran" for r, s in zip(results, SHARES)) else None
    for share in sorted(set(SHARES), reverse=True):
        group = [r for r, s in zip(results, SHARES) if s == share and r["status"] == "ran"]
        if not group or base is None:
            rows.append({"share": share, "status": "failed"})
            continue
        med = statistics.median(r["median_step_s"] for r in group)
        ratio = med / (base / share)
        rows.append({"share": share, "median_step_s": round(med, 5), "expected_s": round(base / share, 5),
                     "ratio": round(ratio, 3), "follows": FOLLOWS[0] <= ratio <= FOLLOWS[1],
                     "steps": [r.get("steps") for r in group]})
    capped = results[-1]
    cap_ok = capped["status"] == "failed" and "gpu_memory cap" in capped.get("error", "")
    return {"status": "ran", "rows": rows, "all_ran": len(ran) == len(SHARES), "capped_worker": capped,
            "capped_fails_alone": cap_ok and len(ran) == len(SHARES),
            "verdict": "holds" if all(r.get("follows") for r in rows) else "does not hold"}


def smoke(timeout: float = 240) -> dict:
    """edgebed up on netns with a GPU per worker."""
    import yaml

    sc = yaml.safe_load((ROOT / "scenarios/smoke.yaml").read_text())
    sc["runtime"] = "netns"
    for name in ("edge-fast", "edge-slow"):
        sc["profiles"][name]["gpus"] = 1
    p, run_dir = edgebed_up(sc, timeout)
    if p is None:
        return {"status": "failed", "reason": f"timed out after {timeout:g} s"}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    named = sorted({line.split(":")[0] for line in p.stdout.splitlines() + p.stderr.splitlines()
                    if ": training on" in line})
    steps = _median_compute(run_dir)
    return {"status": "ran" if p.returncode == 0 else "failed", "exit": p.returncode,
            "accuracy": summary.get("final_accuracy"), "summary": summary, "nodes_naming_the_gpu": named,
            "median_compute_s": steps, "tail": (p.stdout + p.stderr)[-1500:]}


def edgebed_up(sc: dict, timeout: float):
    """(the finished `edgebed up` process, or None past `timeout`; its run folder)."""
    import yaml

    run_dir = Path(tempfile.mkdtemp(prefix=f"edgebed-{sc['name']}-")) / "run"
    path = run_dir.parent / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc))
    cmd = [sys.executable, "-c", "from testbed.cli import main; main()", "up", str(path), "--out", str(run_dir)]
    try:
        return (subprocess.run(cmd, env=child_env({}), capture_output=True, text=True, timeout=timeout, cwd=ROOT),
                run_dir)
    except subprocess.TimeoutExpired:
        return None, run_dir


def netns_shares(timeout: float = 200) -> dict:
    """The netns runtime: 8 ASGD workers on GPU 0 at gpu_share 1/0.5/0.25/0.125 (two each) and
    gpu_memory 2g; each worker's median compute time (steps.csv) against share 1's / share."""
    groups = [{"count": 2, "name": f"s{k}", "profile": {"gpus": [0], "gpu_share": s, "gpu_memory": "2g", "cpus": 1.0}}
              for k, s in enumerate(sorted(set(SHARES), reverse=True))]
    sc = {"name": "gpu-shares", "seed": 1, "runtime": "netns", "algorithm": {"name": "asgd"},
          "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 128, "lr": 0.05,
                       "eval_interval": 200},
          "stop": {"seconds": 45}, "ps": {"profile": {"cpus": 4.0}}, "evaluator": {"profile": {"cpus": 1.0}},
          "workers": groups}
    p, run_dir = edgebed_up(sc, timeout)
    if p is None:
        return {"status": "failed", "reason": f"timed out after {timeout:g} s"}
    med = _median_compute(run_dir) or {}
    meta = json.loads((run_dir / "meta.json").read_text()) if (run_dir / "meta.json").exists() else {}
    compute = {n: m.get("compute") for n, m in meta.get("nodes", {}).items() if n.startswith("s")}
    results = [{"status": "ran", "median_step_s": med[n]} if n in med else {"status": "failed"}
               for n in sorted(compute, key=lambda n: (-compute[n].get("gpu_share", 0), n))]
    return {"status": "ran" if p.returncode == 0 else "failed", "exit": p.returncode, "compute": compute,
            "warnings": meta.get("warnings"), **judge_shares(results + [{"status": "skipped"}]),
            "tail": (p.stdout + p.stderr)[-800:]}


def _median_compute(run_dir: Path):
    try:
        import pandas as pd

        df = pd.read_csv(run_dir / "steps.csv")
        return {str(k): round(float(v), 5) for k, v in df.groupby("node")["compute_seconds"].median().items()}
    except Exception:
        return None


def ddp(timeout: float = 120) -> dict:
    """Two ranks of the DDP example on GPU 0: NCCL first, gloo on CUDA tensors if NCCL refuses."""
    out = {}
    for backend in ("nccl", "gloo"):
        res = _ddp_pair(backend, timeout)
        out[backend] = res
        if res["status"] == "ran":
            break
    return out


def _ddp_pair(backend: str, timeout: float) -> dict:
    port = 29500 + os.getpid() % 1000
    procs = []
    for rank in (0, 1):
        env = child_env({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": "0"})
        procs.append(subprocess.Popen([sys.executable, "examples/ddp/train.py", "--steps", "20", "--device", "cuda",
                                       "--backend", backend], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs, t0 = [], time.time()
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, timeout - (time.time() - t0)))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            outs.append(p.communicate()[0] + "\n(timed out)")
    ok = all(p.returncode == 0 for p in procs)
    ar = [float(line.split("all-reduce ")[1].split()[0]) for o in outs for line in o.splitlines()
          if "all-reduce" in line]
    return {"status": "ran" if ok else "failed", "exits": [p.returncode for p in procs],
            "median_allreduce_s": statistics.median(ar) if ar else None,
            "tail": "" if ok else "\n".join(o[-600:] for o in outs)}


def check(out_path: Path, only: set | None = None) -> dict:
    """Every part in turn; the JSON is written after each (a part that runs out of time keeps the rest)."""
    t0 = time.time()
    report: dict = {"started": t0, "host": platform.node()}
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def part(name: str, result: dict) -> dict:
        report[name] = result
        report["seconds"] = round(time.time() - t0, 1)
        out_path.write_text(json.dumps(report, indent=1, default=str))
        return result

    pr = part("probe", probe())
    cuda = bool(pr["cuda"])
    no_gpu = {"status": "skipped", "reason": "torch sees no CUDA device"}
    if only is None or "step_time" in only:
        part("step_time", step_time(cuda))
    if not cuda:
        for name in GPU_PARTS:
            part(name, no_gpu)
        return report
    mps_down = {"status": "skipped", "reason": pr["mps"]}
    mps_ok = pr["mps"] == "starts"
    todo = {
        "shares_pace": lambda: shares(mps=False),
        "shares_mps": lambda: shares(mps=True) if mps_ok else mps_down,
        "mps_threads_small": lambda: shares(mps=True, by="mps") if mps_ok else mps_down,
        "mps_threads_large": lambda: shares(mps=True, by="mps", model="dlion_cnn", batch=2048) if mps_ok else mps_down,
        "ddp": ddp,
        "smoke": lambda: smoke() if pr["netns"] == "usable" else {"status": "skipped", "reason": pr["netns"]},
        "netns_shares": lambda: netns_shares() if pr["netns"] == "usable" else {"status": "skipped",
                                                                                 "reason": pr["netns"]},
    }
    for name, run in todo.items():
        if only is None or name in only:
            part(name, run())
    return report


def summary_lines(report: dict) -> list[str]:
    lines = [f"gpu check: {report['seconds']} s; GPUs {[g['name'] for g in report['probe']['gpus']]}; "
             f"netns: {report['probe']['netns']}; MPS: {report['probe']['mps']}"]
    for part in GPU_PARTS:
        r = report.get(part, {"status": "not run"})
        lines.append(f"  {part}: {r.get('status', 'ran')} {r.get('verdict', '')} {r.get('reason', '')}".rstrip())
    for key, r in report.get("step_time", {}).items():
        lines.append(f"  step_time {key}: {r.get('status')} {r.get('median_step_s', r.get('reason', ''))}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/gpu_check.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--netns-probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--only", help="comma-separated parts (the probe always runs)")
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.netns_probe:
        return print(netns_problem() or "usable")
    report = check(args.out, set(args.only.split(",")) if args.only else None)
    print("\n".join(summary_lines(report)))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
