"""The `edgebed` command line."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="edgebed: emulate an edge cluster on this machine and train on it.")
bench_app = typer.Typer(no_args_is_help=True, help="Fidelity benchmarks (JSON results under benchmarks/results/).")
app.add_typer(bench_app, name="bench")
lab_app = typer.Typer(no_args_is_help=True, help="A swarm of N emulated hosts on this machine (for runtime swarm).")
app.add_typer(lab_app, name="lab")


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(msg, err=True)
    raise typer.Exit(code)


def _load(path: Path, trace_dirs: list[Path]):
    from testbed.plan import load_scenario

    return _checked(lambda: load_scenario(path, trace_dirs))


_TRACE_DIRS = typer.Option([], "--trace-dir", help="also read link and rate traces from this folder "
                                                   "(default: the scenario file's folder only), repeatable")
_DOCKER_HOST = typer.Option(None, "--docker-host", help="the Docker engine (runtime swarm: a manager's), as "
                                                       "DOCKER_HOST: unix://, tcp://, ssh://user@host")


def _use_docker_host(url: Optional[str]) -> None:
    if url:
        os.environ["DOCKER_HOST"] = url  # for this process and the nodes' tools alike


def _checked(make):
    """The scenario `make()` returns, validated and checked against this machine's engines."""
    from testbed.runtimes.preflight import preflight
    from testbed.scenario.schema import ScenarioError

    try:
        sc = make()
        preflight(sc)
        return sc
    except ScenarioError as e:
        for line in e.lines:
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2)


@app.command()
def validate(scenario: Path = typer.Argument(..., help="scenario YAML file"),
             trace_dir: list[Path] = _TRACE_DIRS) -> None:
    """Check a scenario file; errors name the field."""
    sc = _load(scenario, trace_dir)
    typer.echo(f"ok: {sc.name}: {sc.n_workers} workers, algorithm {sc.algorithm.name}, "
               f"model {sc.workload.model}, dataset {sc.workload.dataset}, runtime {sc.runtime}")


@app.command()
def up(scenario: Path = typer.Argument(..., help="scenario YAML file"),
       out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (default runs/<name>-<time>)"),
       quiet: bool = typer.Option(False, "--quiet", "-q", help="no live progress"),
       runtime: Optional[str] = typer.Option(None, "--runtime", help="override the scenario's runtime (auto, netns, docker, swarm)"),
       algorithm: Optional[str] = typer.Option(None, "--algorithm", help="run another algorithm (its params: --param)"),
       param: list[str] = typer.Option([], "--param", help="algorithm parameter NAME=VALUE (YAML value), repeatable"),
       verify_links: bool = typer.Option(False, "--verify-links", help="measure each worker's link (rate, RTT) "
                                                                      "after bring-up: RUN/link_check.csv"),
       trace_dir: list[Path] = _TRACE_DIRS, docker_host: Optional[str] = _DOCKER_HOST,
       tensorboard: Optional[Path] = typer.Option(None, "--tensorboard", help="write the records as TensorBoard "
                                                   "scalars to this folder while the run goes")) -> None:
    """Bring up the cluster, train, record, tear everything down."""
    import yaml

    from testbed.run import api
    from testbed.plan import parse_scenario
    from testbed.run.runner import EXIT_STOPPED, default_run_dir
    from testbed.runtimes import RuntimeUnavailable

    _use_docker_host(docker_host)
    if tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        _fail("error: --tensorboard: needs the tensorboard package (pip install tensorboard)")
    sc = _load(scenario, trace_dir)
    data = sc.model_dump(mode="json", exclude_none=True)
    if runtime is not None:
        data["runtime"] = runtime
    if algorithm is not None and algorithm != sc.algorithm.name:
        data["algorithm"] = {"name": algorithm, "params": {}}  # the scenario's params were another algorithm's
    for item in param:
        name, sep, value = item.partition("=")
        if not sep or not name:
            _fail(f"error: --param {item!r}: expected NAME=VALUE")
        data["algorithm"].setdefault("params", {})[name.strip()] = yaml.safe_load(value)
    if verify_links:
        data.setdefault("network", {})["verify_links"] = True
    if runtime is not None or algorithm is not None or param or verify_links:
        sc = _checked(lambda: parse_scenario(data))
    run_dir = out or default_run_dir(sc)
    say = (lambda s: None) if quiet else (lambda s: typer.echo(s))
    try:
        summary = api.run(sc, run_dir, say=say, scenario_path=str(scenario), tensorboard=tensorboard).summary
    except RuntimeUnavailable as e:
        _fail(f"error: {e}")
    except FileExistsError as e:
        _fail(f"error: {e}")
    except Exception as e:  # already torn down by the runner; records and summary.json are written
        if os.environ.get("EDGEBED_DEBUG"):
            raise
        _fail(f"error: the run failed: {type(e).__name__}: {e} (EDGEBED_DEBUG=1 for the traceback)", 1)
    typer.echo(_outcome(summary, sc.stop.target_accuracy))
    typer.echo(summary["run_dir"])
    if summary["status"] == "failed":
        raise typer.Exit(1)
    if summary["status"] == "stopped":  # interrupted, or a condition the scenario set (on_worker_loss: stop)
        raise typer.Exit(130 if "interrupted" in str(summary["reason"]) else EXIT_STOPPED)


def _outcome(summary: dict, target: Optional[float]) -> str:
    """One line: how the run ended, and what it measured."""
    acc, reached, steps = summary.get("final_accuracy"), summary.get("time_to_target_seconds"), summary.get("steps")
    why = summary.get("reason")
    if why == "target_accuracy" and reached is not None:  # the target was met then; the last evaluation may differ
        why = f"target accuracy {target:g} reached at {reached:.1f} s"
    traffic = (f"workers sent {(summary.get('worker_egress_bytes') or 0) / 1e6:.2f} MB" if summary.get("decentralized")
               else f"PS ingress {(summary.get('ps_ingress_bytes') or 0) / 1e6:.2f} MB")
    return (f"{summary.get('status')} ({why}): final evaluation {'-' if acc is None else f'{acc:.4f}'}, "
            f"{'-' if steps is None else steps} steps, {summary.get('wall_seconds') or 0:.1f} s, {traffic}")


@app.command()
def build(source: str = typer.Option("auto", help="auto | offline | registry (auto: registry if python:3.11-slim is "
                                                  "already local, else offline)"),
          mirror: Optional[str] = typer.Option(None, help="Debian mirror for the offline base (default: the host's)")) -> None:
    """Build the docker runtime's node image (offline: debootstrap base + host wheelhouse)."""
    from testbed.runtimes.docker import docker_client
    from testbed.runtimes.images import ImageError, build_node_image

    client = docker_client()
    if client is None:
        _fail("error: no Docker engine answers (start dockerd)")
    try:
        tag = build_node_image(client, source=source, say=typer.echo, mirror=mirror)
    except ImageError as e:
        _fail(f"error: {e}")
    typer.echo(tag)


@app.command()
def plot(run_dir: Path = typer.Argument(..., help="a run directory (with --figure: the experiment's runs folder)"),
         out: Optional[Path] = typer.Option(None, "--out", help="where to write PNGs (default RUN/plots; "
                                                                "with --figure: figures/)"),
         figure: Optional[str] = typer.Option(None, "--figure", help="draw a paper's figure from existing runs "
                                                                     "(edgebed reproduce --list)"),
         scale: str = typer.Option("ci", help="with --figure: ci | paper")) -> None:
    """Draw a run: accuracy vs time and steps, loss, per-node traffic (or a paper's figure)."""
    from testbed.records.plotting import plot_run
    from testbed.records.reader import RunNotFound

    if figure is not None:
        from testbed.reproduce import analyze, get_experiment, runs_of

        try:
            exp = get_experiment(figure)
            runs = runs_of(figure, run_dir, scale)
            if not runs:
                _fail(f"error: no runs of {figure} under {run_dir} "
                      f"(expected {run_dir}/{figure}/{scale}/seed-<S>/<series>)")
            analyze(exp, runs, out or Path("figures"), scale, say=typer.echo)
        except (KeyError, RunNotFound) as e:
            _fail(f"error: {e}")
        return
    try:
        files = plot_run(run_dir, out)
    except RunNotFound as e:
        _fail(f"error: {e}")
    for f in files:
        typer.echo(str(f))


@app.command()
def reproduce(name: Optional[str] = typer.Argument(None, help="a figure or table (fig-adacomp-3, ...), 'all', "
                                                              "or nothing to list them"),
              scale: str = typer.Option("ci", help="ci (minutes on 2 cores) | paper (the paper's setup)"),
              out: Path = typer.Option(Path("figures"), help="PNG, CSV and JSON go here"),
              runs: Path = typer.Option(Path("runs/reproduce"), help="each series' run records go here"),
              rerun: bool = typer.Option(False, "--rerun", help="run series again even if their records exist"),
              seeds: int = typer.Option(3, "--seeds", envvar="SEEDS", help="runs per series: the scenario's seed "
                                                                           "and the ones after it"),
              runtime: Optional[str] = typer.Option(None, "--runtime", help="override the scenarios' runtime")) -> None:
    """Run a paper's experiment (every series of it, at each seed), draw it, and give its verdict."""
    from testbed.reproduce import SCALES, all_experiments, figure_dir, get_experiment, reproduce as run_reproduce
    from testbed.scenario.schema import ScenarioError

    if name is None:
        for exp in all_experiments():
            typer.echo(f"{exp.name:22s} {exp.paper:8s} {exp.title} ({len(exp.series_at('ci'))} runs)")
        return
    if scale not in SCALES:
        _fail(f"error: --scale: '{scale}' is not one of {', '.join(SCALES)}")
    if seeds < 1:
        _fail(f"error: --seeds: {seeds} is not a positive count")
    try:
        names = [e.name for e in all_experiments()] if name == "all" else [get_experiment(name).name]
    except KeyError as e:
        _fail(f"error: {e.args[0]}")
    failed = []
    for n in names:
        try:
            report = run_reproduce(n, scale=scale, seeds=seeds, out_dir=out, runs_dir=runs, reuse=not rerun,
                                   runtime=runtime, say=typer.echo)
        except (ScenarioError, FileNotFoundError, RuntimeError) as e:
            typer.echo(f"error: {n}: {e}", err=True)
            failed.append(n)
            continue
        typer.echo(f"{n}: {report['verdict']} at {scale} scale over {len(report['seeds'])} seed(s) "
                   f"(see {figure_dir(out, scale) / n}.json)")
    if failed:
        raise typer.Exit(1)


@lab_app.command("up")
def lab_up(hosts: int = typer.Option(2, "--hosts", help="how many hosts (dockerds, each in its own namespace)"),
           gpus: int = typer.Option(0, "--gpus", help="GPUs each host advertises to the swarm (for placement "
                                                     "only: no device is behind them)")) -> None:
    """Bring up a Docker Swarm of N hosts on this machine, joined by an underlay network."""
    import os

    from testbed.runtimes import lab

    if os.geteuid() != 0:
        _fail("error: edgebed lab needs root (it starts dockerds in network namespaces)")
    try:
        lab.lab_up(hosts, say=typer.echo, gpus=gpus)
    except (RuntimeError, ValueError) as e:
        _fail(f"error: {e}")


@lab_app.command("down")
def lab_down() -> None:
    """Remove the lab: its engines, their containers and data, its namespaces."""
    from testbed.runtimes import lab

    problems = lab.lab_down(say=typer.echo)
    for p in problems:
        typer.echo(f"problem: {p}", err=True)
    if problems:
        raise typer.Exit(1)


@app.command()
def hosts(as_yaml: bool = typer.Option(False, "--yaml", help="as YAML, the format `edgebed place --hosts` reads"),
          docker_host: Optional[str] = _DOCKER_HOST) -> None:
    """The hosts of the Docker Swarm that runtime swarm would use: CPUs, memory, GPUs, labels."""
    _use_docker_host(docker_host)
    from testbed.runtimes.hosts import describe_hosts, hosts_to_yaml, swarm_client, swarm_hosts

    try:
        client = swarm_client()
    except RuntimeError as e:
        _fail(f"error: {e}")
    found = swarm_hosts(client)
    for line in (hosts_to_yaml(found).splitlines() if as_yaml else describe_hosts(found)):
        typer.echo(line)


@app.command()
def place(scenario: Path = typer.Argument(..., help="scenario YAML file"),
          hosts_file: Optional[Path] = typer.Option(None, "--hosts", help="plan for these hosts (YAML, as "
                                                    "`edgebed hosts --yaml` writes) instead of the swarm's"),
          trace_dirs: list[Path] = _TRACE_DIRS, docker_host: Optional[str] = _DOCKER_HOST) -> None:
    """Where runtime swarm would put each node: on the swarm's hosts, or on a cluster described in
    a file (plan a paper-scale run before you have the machines). Starts nothing."""
    _use_docker_host(docker_host)
    from testbed.plan.cluster import build_cluster
    from testbed.plan.placement import place as place_nodes
    from testbed.runtimes.hosts import SwarmPlacer, describe_placement, hosts_from_yaml, swarm_client, swarm_hosts

    sc = _load(scenario, trace_dirs)
    try:
        found = hosts_from_yaml(hosts_file.read_text()) if hosts_file else swarm_hosts(swarm_client())
        placer = SwarmPlacer(found, sc)
        spec = place_nodes(build_cluster(sc, "place"), placer)
        routers = placer.router_hosts(spec)
    except (OSError, RuntimeError, ValueError) as e:
        _fail(f"error: {e}")
    for line in describe_placement(spec, found, routers):
        typer.echo(line)


@app.command()
def status() -> None:
    """What edgebed has running or left on this machine."""
    from testbed.runtimes import load_backends
    from testbed.runtimes.state import StateDirError, leftovers

    load_backends()
    try:
        lines = leftovers()
    except StateDirError as e:
        _fail(f"error: {e}")
    if not lines:
        typer.echo("nothing of edgebed is up")
    for line in lines:
        typer.echo(line)


def _runs_to_remove(runs: dict, labelled: dict, named: bool, all_runs: bool) -> dict:
    """Of `runs`, those `down` may remove: another owner's (by its labels) only with --all, and a
    live or unknown run only by its id or with --all; each one left is named in one line."""
    from testbed.runtimes.state import foreign_owner, why_left_alone

    keep = {}
    for rid, st in sorted(runs.items()):
        owner = foreign_owner(labelled.get(rid))
        if owner is not None:
            typer.echo(f"run {rid} belongs to {owner}; " + ("removing it (--all)" if all_runs else "use --all"))
            if not all_runs:
                continue
        why = None if named or all_runs else why_left_alone(rid, st, labelled.get(rid))
        if why:  # a live run is someone's experiment: only by its id or with --all
            typer.echo(f"{rid}: {why}; left alone (`edgebed down {rid}` or `edgebed down --all` removes it)")
            continue
        keep[rid] = st
    return keep


@app.command()
def down(run_id: Optional[str] = typer.Argument(None, help="one run id (default: every run of yours whose runner is gone)"),
         all_runs: bool = typer.Option(False, "--all", help="also stop the runs that are still going, and others' runs"),
         docker_host: Optional[str] = _DOCKER_HOST) -> None:
    """Remove everything edgebed made: processes, namespaces, links, cgroups (also after a crash).
    Only names of edgebed's own shapes are touched; another owner's run (uid@host) needs --all."""
    _use_docker_host(docker_host)

    from testbed.runtimes import load_backends
    from testbed.runtimes.state import StateDirError, cleanup_run, engine_runs, known_runs, labelled_runs

    load_backends()
    try:
        labelled = labelled_runs()
        runs = known_runs(labelled)
    except StateDirError as e:
        _fail(f"error: {e}")
    if os.geteuid() != 0:  # a user's runs are swarm runs; namespaces and cgroups are root's to remove
        runs = engine_runs(runs, labelled)
    if run_id is not None:
        if run_id not in runs:
            typer.echo(f"no run {ascii(run_id)[1:-1][:40]} on this machine")
            return
        runs = {run_id: runs[run_id]}
    runs = _runs_to_remove(runs, labelled, run_id is not None, all_runs)
    problems = []
    for rid, st in runs.items():
        p = cleanup_run(rid, st)
        problems += p
        typer.echo(f"{rid}: {'removed' if not p else 'problems: ' + '; '.join(p)}")
    if not runs:
        typer.echo("nothing to remove")
    if problems:
        raise typer.Exit(1)


@app.command()
def algorithms() -> None:
    """List training algorithms (plugins' too) and their parameters."""
    from testbed import plugins
    from testbed.strategies import StrategyError, get_strategy_class

    for name, ep in sorted(plugins.registered("algorithm").items()):
        try:
            cls = get_strategy_class(name)
        except StrategyError as e:
            typer.echo(f"{name:10s} {e}")
            continue
        origin = "" if ep.value.startswith("testbed.") else f"  [{ep.value}]"
        typer.echo(f"{name:10s} {cls.summary}{origin}")
        for field, info in cls.Params.model_fields.items():
            typer.echo(f"    {field} = {info.default!r}  {info.description or ''}")


@app.command("tensorboard")
def tensorboard_cmd(run_dir: Path = typer.Argument(..., help="a run's folder"),
                    out: Optional[Path] = typer.Option(None, "--out", help="default RUN/tensorboard")) -> None:
    """A finished run's records as TensorBoard scalars (`tensorboard --logdir OUT`)."""
    from testbed.records.tensorboard import write_run

    if not (run_dir / "meta.json").is_file():
        _fail(f"error: {run_dir}: not an edgebed run directory (no meta.json)")
    try:
        n = write_run(run_dir, out or run_dir / "tensorboard")
    except RuntimeError as e:
        _fail(f"error: {e}")
    typer.echo(f"{n} rows -> {out or run_dir / 'tensorboard'}")


@app.command()
def models() -> None:
    """List models (plugins' too)."""
    from testbed.data.models import model_names

    for name, desc in model_names().items():
        typer.echo(f"{name:14s} {desc}")


@app.command()
def datasets() -> None:
    """List datasets (plugins' too)."""
    from testbed.data.datasets import dataset_names

    for name, desc in dataset_names().items():
        typer.echo(f"{name:18s} {desc}")


@app.command()
def kernel() -> None:
    """Which shaping features this kernel has (netem, htb, tbf, ifb) and the cgroup version."""
    from testbed.kernel import cgroups
    from testbed.kernel.shaping import probe_kernel

    caps = probe_kernel()
    typer.echo(json.dumps({**caps.__dict__, "cgroup_version": 2 if cgroups.is_v2() else 1}))
    if not caps.netem:
        loss = "an eBPF drop filter" if caps.bpf_loss else "nothing (loss is not applied)"
        typer.echo(f"no sch_netem: latency/jitter fall back to edgebed's transport; loss to {loss}", err=True)


@bench_app.command("link")
def bench_link(rate: str = typer.Option("10mbit", help="configured rate"),
               seconds: float = typer.Option(0.0, help="seconds per direction (default 8, 20 below 2 Mbit/s)"),
               flows: int = typer.Option(1, help="parallel TCP flows"),
               runtime: str = typer.Option("netns", help="netns | docker | swarm"),
               encrypt: bool = typer.Option(False, "--encrypt", help="runtime swarm: on an encrypted overlay "
                                                                     "(network.encrypt)"),
               out: Path = typer.Option(Path("benchmarks/results"), help="where to write JSON")) -> None:
    """Achieved vs configured throughput of a shaped access link, both directions."""
    from testbed.bench.fidelity import link_benchmark
    from testbed.scenario import units
    from testbed.scenario.schema import ScenarioError

    if seconds <= 0:
        # TCP needs longer to fill and settle a slow link's queue.
        seconds = 20.0 if units.parse_rate(rate) < 2e6 else 8.0
    try:
        res = link_benchmark(rate, seconds=seconds, flows=flows, out_dir=out, say=typer.echo, runtime=runtime,
                             encrypt=encrypt)
    except (ScenarioError, RuntimeError) as e:  # refused (network.encrypt off swarm, or a host's kernel)
        _fail(f"error: {e}")
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("loss")
def bench_loss(loss: str = typer.Option("1%", help="configured loss (uplink of w0)"),
               packets: int = typer.Option(20000, help="UDP datagrams to send"),
               runtime: str = typer.Option("netns", help="netns | docker"),
               out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Measured vs configured packet loss (netem, or the eBPF fallback)."""
    from testbed.bench.fidelity import loss_benchmark

    res = loss_benchmark(loss, packets=packets, out_dir=out, say=typer.echo, runtime=runtime)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("delay")
def bench_delay(latency: str = typer.Option("20ms", help="one-way latency of w0's link, each direction"),
                jitter: str = typer.Option("0ms"),
                count: int = typer.Option(50),
                runtime: str = typer.Option("netns", help="netns | docker"),
                out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Round-trip time of training messages vs configured latency (netem, or the transport fallback)."""
    from testbed.bench.fidelity import delay_benchmark

    res = delay_benchmark(latency, jitter=jitter, count=count, out_dir=out, say=typer.echo, runtime=runtime)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("startup")
def bench_startup(workers: int = typer.Option(4, help="number of workers"),
                  runtime: str = typer.Option("netns", help="netns | docker | swarm"),
                  cpus: float = typer.Option(0.5, help="each worker's CPU quota, 0 for none (a swarm's hosts must hold all quotas)"),
                  window: float = typer.Option(0.0, help="seconds of training (default 10 + 0.3 a worker)"),
                  out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Seconds from `up` to the first training step (and teardown) for N workers."""
    from testbed.bench.fidelity import startup_benchmark

    res = startup_benchmark(workers, runtime=runtime, out_dir=out, say=typer.echo, cpus=cpus, window=window)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("ddp")
def bench_ddp(rates: str = typer.Option("10mbit,50mbit,100mbit", help="link rates, comma-separated"),
              workers: int = typer.Option(2, help="DDP ranks, one a worker node"),
              steps: int = typer.Option(20, help="training steps a run (the first 3 are warm-up)"),
              out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """An unmodified DDP program (torchrun, gloo): its all-reduce time against the ring bound."""
    from testbed.bench.ddp import ddp_benchmark

    if workers < 2:
        _fail("error: --workers: an all-reduce needs at least 2")
    res = ddp_benchmark([r.strip() for r in rates.split(",") if r.strip()], workers=workers, steps=steps,
                        out_dir=out, say=typer.echo)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("flower-app")
def bench_flower_app(rates: str = typer.Option("5mbit,20mbit,100mbit", help="link rates, comma-separated"),
                     rounds: int = typer.Option(4, help="FedAvg rounds a run (round 1 is warm-up)"),
                     out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """An unmodified Flower app (SuperLink, 2 SuperNodes): round time against the bytes it moves."""
    from testbed.bench.flower_app import FLOWER_PYTHON, flower_app_benchmark

    if rounds < 3:
        _fail("error: --rounds: at least 3 (round 1 is warm-up, a round's time is the gap between two ends)")
    if not FLOWER_PYTHON.exists():
        _fail(f"error: no {FLOWER_PYTHON.parent.parent.name} (make flower-venv installs PyPI's flwr)")
    res = flower_app_benchmark([r.strip() for r in rates.split(",") if r.strip()], rounds=rounds, out_dir=out,
                               say=typer.echo)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("stream")
def bench_stream(topics: int = typer.Option(4, help="topics = devices, one producer process each"),
                 rate: float = typer.Option(100.0, help="samples/s per topic"),
                 seconds: float = typer.Option(12.0),
                 sample_bytes: int = typer.Option(3072, help="bytes per sample (3072 = a CIFAR image)"),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Sustained samples/s of the embedded broker with one producer per topic (ScaDLES Fig. 5)."""
    from testbed.bench.fidelity import stream_benchmark

    stream_benchmark(topics, rate, seconds=seconds, sample_bytes=sample_bytes, out_dir=out, say=typer.echo)


@bench_app.command("topology")
def bench_topology(lan: str = typer.Option("1gbit", help="LAN rate of both sites"),
                   wan: str = typer.Option("100mbit", help="WAN rate between them"),
                   seconds: float = typer.Option(6.0, help="seconds per transfer"),
                   runtime: str = typer.Option("netns", help="netns | docker"),
                   out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Two sites: a transfer inside a site runs at the LAN rate, across sites at the WAN rate."""
    from testbed.bench.fidelity import topology_benchmark

    res = topology_benchmark(lan=lan, wan=wan, seconds=seconds, out_dir=out, say=typer.echo, runtime=runtime)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("cpu")
def bench_cpu(cpus: float = typer.Option(0.25, help="CPU quota in cores"),
              seconds: float = typer.Option(5.0),
              runtime: str = typer.Option("netns", help="netns | docker"),
              others_busy: bool = typer.Option(False, "--others-busy", help="another node busy-loops on every core"),
              period: Optional[str] = typer.Option(None, help="the node's CFS period, e.g. 10ms (default 100ms)"),
              out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Achieved vs configured CPU share of a node's cgroup under a busy loop."""
    from testbed.bench.fidelity import cpu_benchmark

    period_s = None
    if period is not None:
        from testbed.plan import parse_scenario
        from testbed.scenario.schema import ScenarioError

        try:  # the scenario's own checks: units, the kernel's 1ms-1s, a quota of at least 1 ms
            period_s = parse_scenario({"name": "bench", "profiles": {"p": {"cpus": cpus, "cpu_period": period}},
                                       "workers": [{"count": 1, "profile": "p"}]}).profiles["p"].cpu_period
        except ScenarioError as e:
            _fail("error: --period: " + "; ".join(e.lines))
    res = cpu_benchmark(cpus, seconds=seconds, out_dir=out, say=typer.echo, runtime=runtime, others_busy=others_busy,
                        cpu_period=period_s)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("update")
def bench_update(params: int = typer.Option(1_000_000, help="parameters in the update (float32)"),
                 rate: str = typer.Option("100mbit", help="w0's link rate"),
                 repeats: int = typer.Option(3),
                 runtime: str = typer.Option("netns", help="netns | docker"),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Time for the PS to receive one full update over a shaped link vs the ideal 32P/B + RTT."""
    from testbed.bench.suite import update_benchmark

    if params <= 0 or repeats <= 0:
        _fail("error: --params and --repeats must be positive")
    res = update_benchmark(params, rate, repeats=repeats, out_dir=out, say=typer.echo, runtime=runtime)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("overhead")
def bench_overhead(cpus: float = typer.Option(1.0, help="the worker's CPU quota"),
                   model: str = typer.Option("adacomp_cnn"),
                   batch_size: int = typer.Option(32),
                   steps: int = typer.Option(60),
                   repeats: int = typer.Option(3, help="alternating runs of each (single runs differ by up to 15%)"),
                   out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A worker's compute step inside edgebed vs a bare PyTorch loop on the same CPU quota."""
    from testbed.bench.suite import overhead_benchmark

    if steps <= 15 or repeats < 1:
        _fail("error: --steps must be above 15 (the first 10 are warm-up), --repeats at least 1")
    res = overhead_benchmark(cpus=cpus, model=model, batch_size=batch_size, steps=steps, repeats=repeats, out_dir=out,
                             say=typer.echo)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("mininet")
def bench_mininet(hosts: int = typer.Option(8, help="hosts on one switch (edgebed: ps, evaluator, workers)"),
                  rate: str = typer.Option("10mbit", help="every host's link"),
                  cpus: float = typer.Option(0.25, help="every host's CPU cap (cores)"),
                  out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Side by side with Mininet (Debian's package): start-up, stop, memory, link goodput."""
    from testbed.bench.suite import mininet_benchmark

    if hosts < 2:
        _fail("error: --hosts must be at least 2")
    try:
        res = mininet_benchmark(hosts, rate=rate, cpus=cpus, out_dir=out, say=typer.echo)
    except RuntimeError as e:
        _fail(f"error: {e}")
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("flower")
def bench_flower(clients: int = typer.Option(4, help="FedAvg clients (edgebed: workers)"),
                 rounds: int = typer.Option(11, help="rounds; the first is not averaged in (start-up)"),
                 local_steps: int = typer.Option(10, help="local steps a client takes a round"),
                 batch_size: int = typer.Option(32),
                 venv: Optional[Path] = typer.Option(None, help="the venv with flwr[simulation] (default: the "
                                                     "checkout's .venv-flower, made by make flower-venv)"),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Side by side with Flower's simulation engine: the same FedAvg rounds, per-round overhead."""
    from testbed.bench.suite import FLOWER_VENV, flower_benchmark

    if clients < 1 or rounds < 2 or local_steps < 1 or batch_size < 1:
        _fail("error: --clients, --local-steps and --batch-size must be at least 1, --rounds at least 2")
    try:
        res = flower_benchmark(clients, rounds=rounds, local_steps=local_steps, batch_size=batch_size,
                               venv=venv or FLOWER_VENV, out_dir=out, say=typer.echo)
    except RuntimeError as e:
        _fail(f"error: {e}")
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("stress")
def bench_stress(cpus: float = typer.Option(1.0, help="the worker's CPU quota"),
                 stress: float = typer.Option(0.5, help="cores of background busy-looping in its cgroup"),
                 steps: int = typer.Option(60),
                 out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A profile's background stress: a worker's compute step with and without it."""
    from testbed.bench.suite import stress_benchmark

    if not 0 < stress < cpus:
        _fail("error: --stress must be above 0 and below --cpus")
    res = stress_benchmark(cpus=cpus, stress=stress, steps=steps, out_dir=out, say=typer.echo)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("wire")
def bench_wire(algorithm: str = typer.Option("all", help="a strategy (edgebed algorithms), or all"),
               workers: int = typer.Option(4),
               seconds: float = typer.Option(20.0, help="length of each run"),
               rate: str = typer.Option("100mbit", help="every worker's link"),
               out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """Each strategy's wire bytes (its workers' link counters) against the payload its records count."""
    from testbed.bench.suite import wire_benchmark
    from testbed.strategies import strategies

    known = strategies()
    names = sorted(known) if algorithm == "all" else [algorithm]
    unknown = [n for n in names if n not in known]
    if unknown:
        _fail(f"error: --algorithm: '{unknown[0]}' is not one of {', '.join(sorted(known))}, all")
    if workers < 1 or seconds <= 0:
        _fail("error: --workers must be at least 1, --seconds positive")
    from testbed.scenario import units

    try:
        units.parse_rate(rate)
    except units.UnitError as e:
        _fail(f"error: --rate: {e}")
    results = [wire_benchmark(n, workers=workers, seconds=seconds, rate=rate, out_dir=out, say=typer.echo)
               for n in names]
    if not all(r["ok"] for r in results):
        raise typer.Exit(1)


@bench_app.command("all")
def bench_all(quick: bool = typer.Option(False, "--quick", help="a few minutes, generous bounds (what CI runs)"),
              out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """The whole suite (BENCHMARKS.md's tables), or --quick; exits 1 if a number is out of bounds."""
    from testbed.bench.suite import run_suite

    if not quick:
        typer.echo("the full suite takes about 40 minutes on 2 cores (docker included when an engine answers)")
    res = run_suite(quick, out, say=typer.echo)
    if not res["ok"]:
        raise typer.Exit(1)


@bench_app.command("soak")
def bench_soak(minutes: int = typer.Option(30, help="length of the run; one fault per minute from minute 1"),
               workers: int = typer.Option(4),
               seed: int = typer.Option(1, help="draws the faults, their targets and times"),
               runtime: str = typer.Option("netns", help="netns | docker"),
               algorithm: str = typer.Option("bsp", help="the synchronization model under the faults"),
               run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="records (default runs/soak-DATE)"),
               out: Path = typer.Option(Path("benchmarks/results"))) -> None:
    """A long run with a random fault every minute, then a check of its records and of leftovers."""
    from testbed.bench.soak import soak_benchmark

    res = soak_benchmark(minutes=minutes, workers=workers, seed=seed, runtime=runtime, algorithm=algorithm,
                         out_dir=out, run_dir=run_dir, say=typer.echo)
    if not res["ok"]:
        raise typer.Exit(1)


def main() -> None:
    from testbed.runtimes.engines import EngineAddressError

    try:
        app()
    except EngineAddressError as e:  # DOCKER_HOST of a shape not used, wherever an engine is first asked
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()


# --- changing a running cluster (the same path as the scenario's timeline) ----------------------

def _control(target: str, action: str, fields: dict, run: Optional[str]) -> None:
    from testbed.run.control import ControlError, request

    try:
        for line in request(target, action, fields, run):
            typer.echo(line)
    except ControlError as e:
        _fail(f"error: {e}")


_RUN = typer.Option(None, "--run", help="run id (default: the only run that is up)")


@app.command()
def link(target: str = typer.Argument(..., help="node, worker group or 'workers'"),
         direction: str = typer.Option("both", "--direction", help="up | down | both"),
         rate: Optional[str] = typer.Option(None, "--rate", help="e.g. 5mbit"),
         latency: Optional[str] = typer.Option(None, "--latency", help="one-way, e.g. 20ms"),
         jitter: Optional[str] = typer.Option(None, "--jitter"),
         loss: Optional[str] = typer.Option(None, "--loss", help="e.g. 1%"),
         run: Optional[str] = _RUN) -> None:
    """Change a node's access link now."""
    _control(target, "link", {"direction": direction, "rate": rate, "latency": latency, "jitter": jitter,
                              "loss": loss}, run)


@app.command()
def cpu(target: str = typer.Argument(...), cpus: float = typer.Argument(..., help="new CPU quota in cores"),
        run: Optional[str] = _RUN) -> None:
    """Change a node's CPU quota now."""
    _control(target, "cpu", {"cpus": cpus}, run)


@app.command()
def stress(target: str = typer.Argument(...), load: float = typer.Argument(..., help="cores of busy loop (0 stops)"),
           run: Optional[str] = _RUN) -> None:
    """Start, change or stop background CPU stress in a node now."""
    _control(target, "stress", {"load": load}, run)


@app.command()
def kill(target: str = typer.Argument(...), run: Optional[str] = _RUN) -> None:
    """SIGKILL a node's processes now (a crash)."""
    _control(target, "kill", {}, run)


@app.command()
def restart(target: str = typer.Argument(...), run: Optional[str] = _RUN) -> None:
    """Start a node's role again (a worker rejoins and pulls the current model)."""
    _control(target, "restart", {}, run)


@app.command()
def pause(target: str = typer.Argument(...), run: Optional[str] = _RUN) -> None:
    """Freeze a node now (cgroup freezer / docker pause)."""
    _control(target, "pause", {}, run)


@app.command()
def partition(target: str = typer.Argument(...),
              peers: list[str] = typer.Option(..., "--from", help="node or group to cut it off from (repeatable)"),
              run: Optional[str] = _RUN) -> None:
    """Cut a node off from other nodes now (all their traffic is dropped)."""
    _control(target, "partition", {"peers": peers}, run)


@app.command()
def heal(target: str = typer.Argument(...),
         peers: list[str] = typer.Option([], "--from", help="only these (default: every cut of the node)"),
         run: Optional[str] = _RUN) -> None:
    """Undo partitions of a node."""
    _control(target, "heal", {"peers": peers}, run)


@app.command()
def resume(target: str = typer.Argument(...), run: Optional[str] = _RUN) -> None:
    """Thaw a paused node."""
    _control(target, "resume", {}, run)
