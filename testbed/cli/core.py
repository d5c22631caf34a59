"""The core commands: check and run a scenario, draw and reproduce results, list what edgebed
offers, and see or remove what it left on this machine."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from testbed.cli.common import (
    DOCKER_HOST,
    SCENARIO_RUNTIMES,
    TRACE_DIRS,
    checked,
    fail,
    load_checked,
    runtime_option,
    use_docker_host,
)
from testbed.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STOPPED

if TYPE_CHECKING:
    from testbed.scenario.document import Scenario


def validate(scenario: Path = typer.Argument(..., help="scenario YAML file"),
             trace_dir: list[Path] = TRACE_DIRS) -> None:
    """Check a scenario file; errors name the field."""
    sc = load_checked(scenario, trace_dir)
    typer.echo(f"ok: {sc.name}: {sc.n_workers} workers, algorithm {sc.algorithm.name}, "
               f"model {sc.workload.model}, dataset {sc.workload.dataset}, runtime {sc.runtime}")


def up(scenario: Path = typer.Argument(..., help="scenario YAML file"),
       out: Optional[Path] = typer.Option(None, "--out", "-o", help="run directory (default runs/<name>-<time>)"),
       quiet: bool = typer.Option(False, "--quiet", "-q", help="no live progress"),
       runtime: Optional[str] = runtime_option(None, f"override the scenario's runtime ({SCENARIO_RUNTIMES})"),
       algorithm: Optional[str] = typer.Option(None, "--algorithm", help="run another algorithm (its params: --param)"),
       param: list[str] = typer.Option([], "--param", help="algorithm parameter NAME=VALUE (YAML value), repeatable"),
       verify_links: bool = typer.Option(False, "--verify-links", help="measure each worker's link (rate, RTT) "
                                                                      "after bring-up: RUN/link_check.csv"),
       trace_dir: list[Path] = TRACE_DIRS, docker_host: Optional[str] = DOCKER_HOST,
       tensorboard: Optional[Path] = typer.Option(None, "--tensorboard", help="write the records as TensorBoard "
                                                   "scalars to this folder while the run goes"),
       dilation: Optional[str] = typer.Option(None, "--dilation", help="virtual time: K (the world K times slower "
                                              "than the wall, records in its seconds) or auto (K from the plan "
                                              "and this host); overrides the scenario's")) -> None:
    """Bring up the cluster, train, record, tear everything down."""
    from testbed.run import api
    from testbed.run.runner import default_run_dir
    from testbed.runtimes import RuntimeUnavailable

    use_docker_host(docker_host)
    if tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        fail("error: --tensorboard: needs the tensorboard package (pip install tensorboard)")
    sc = _overridden(load_checked(scenario, trace_dir), runtime, algorithm, param, verify_links, dilation)
    run_dir = out or default_run_dir(sc)
    say = (lambda s: None) if quiet else (lambda s: typer.echo(s))
    try:
        summary = api.run(sc, run_dir, say=say, scenario_path=str(scenario), tensorboard=tensorboard,
                          bars=not quiet and sys.stdout.isatty()).summary
    except RuntimeUnavailable:
        raise  # refused before anything ran: one line, exit 2 (cli.common.one_line_errors)
    except FileExistsError as e:
        fail(f"error: {e}")
    except Exception as e:  # already torn down by the runner; records and summary.json are written
        if os.environ.get("EDGEBED_DEBUG"):
            raise
        fail(f"error: the run failed: {type(e).__name__}: {e} (EDGEBED_DEBUG=1 for the traceback)", EXIT_FAILED)
    typer.echo(_outcome(summary, sc.stop.target_accuracy))
    if summary.get("fidelity"):
        from testbed.records.fidelity import one_line

        typer.echo(one_line(summary["fidelity"]))
    typer.echo(summary["run_dir"])
    if summary["status"] == "failed":
        raise typer.Exit(EXIT_FAILED)
    if summary["status"] == "stopped":  # interrupted, or a condition the scenario set (on_worker_loss: stop)
        raise typer.Exit(EXIT_INTERRUPTED if "interrupted" in str(summary["reason"]) else EXIT_STOPPED)


def _overridden(sc: Scenario, runtime: Optional[str], algorithm: Optional[str], param: list[str],
                verify_links: bool, dilation: Optional[str] = None) -> Scenario:
    """The scenario with `up`'s overrides applied, checked again (or `sc` itself if none is given)."""
    import yaml

    from testbed.plan import parse_scenario
    from testbed.scenario.scenario_file import scenario_data

    data = scenario_data(sc)
    if runtime is not None:
        data["runtime"] = runtime
    if algorithm is not None and algorithm != sc.algorithm.name:
        data["algorithm"] = {"name": algorithm, "params": {}}  # the scenario's params were another algorithm's
    for item in param:
        name, sep, value = item.partition("=")
        if not sep or not name:
            fail(f"error: --param {item!r}: expected NAME=VALUE")
        data["algorithm"].setdefault("params", {})[name.strip()] = yaml.safe_load(value)
    if verify_links:
        data.setdefault("network", {})["verify_links"] = True
    if dilation is not None:
        data["dilation"] = dilation if dilation == "auto" else yaml.safe_load(dilation)
    if runtime is not None or algorithm is not None or param or verify_links or dilation is not None:
        sc = checked(lambda: parse_scenario(data))
    return sc


def _outcome(summary: dict, target: Optional[float]) -> str:
    """One line: how the run ended, and what it measured."""
    acc, reached, steps = summary.get("final_accuracy"), summary.get("time_to_target_seconds"), summary.get("steps")
    why = summary.get("reason")
    if why == "target_accuracy" and reached is not None:  # the target was met then; the last evaluation may differ
        why = f"target accuracy {target:g} reached at {reached:.1f} s"
    traffic = (f"workers sent {(summary.get('worker_egress_bytes') or 0) / 1e6:.2f} MB" if summary.get("decentralized")
               else f"PS ingress {(summary.get('ps_ingress_bytes') or 0) / 1e6:.2f} MB")
    k = summary.get("dilation") or 1
    took = f"{summary.get('wall_seconds') or 0:.1f} s" if k == 1 else \
        f"{summary.get('seconds') or 0:.1f} s of the world ({summary.get('wall_seconds') or 0:.1f} s wall, k {k:g})"
    return (f"{summary.get('status')} ({why}): final evaluation {'-' if acc is None else f'{acc:.4f}'}, "
            f"{'-' if steps is None else steps} steps, {took}, {traffic}")


def build(source: str = typer.Option("auto", help="auto | offline | registry (auto: registry if python:3.11-slim is "
                                                  "already local, else offline)"),
          mirror: Optional[str] = typer.Option(None, help="Debian mirror for the offline base "
                                                          "(default: the host's)")) -> None:
    """Build the docker runtime's node image (offline: debootstrap base + host wheelhouse)."""
    from testbed.runtimes.engine.client import docker_client
    from testbed.runtimes.engine.images import build_node_image

    client = docker_client()
    if client is None:
        fail("error: no Docker engine answers (start dockerd)")
    typer.echo(build_node_image(client, source=source, say=typer.echo, mirror=mirror))


def plot(run_dir: Path = typer.Argument(..., help="a run directory (with --figure: the experiment's runs folder)"),
         out: Optional[Path] = typer.Option(None, "--out", help="where to write PNGs (default RUN/plots; "
                                                                "with --figure: figures/)"),
         figure: Optional[str] = typer.Option(None, "--figure", help="draw a paper's figure from existing runs "
                                                                     "(edgebed reproduce --list)"),
         scale: str = typer.Option("ci", help="with --figure: ci | paper")) -> None:
    """Draw a run: accuracy vs time and steps, loss, per-node traffic (or a paper's figure)."""
    from testbed.records.plotting import plot_run

    if figure is not None:
        from testbed.reproduce import analyze, get_experiment, runs_of

        try:
            exp = get_experiment(figure)
            runs = runs_of(figure, run_dir, scale)
            if not runs:
                fail(f"error: no runs of {figure} under {run_dir} "
                     f"(expected {run_dir}/{figure}/{scale}/seed-<S>/<series>)")
            analyze(exp, runs, out or Path("figures"), scale, say=typer.echo)
        except KeyError as e:
            fail(f"error: {e}")
        return
    for f in plot_run(run_dir, out):
        typer.echo(str(f))


def reproduce(name: Optional[str] = typer.Argument(None, help="a figure or table (fig-adacomp-3, ...), 'all', "
                                                              "or nothing to list them"),
              scale: str = typer.Option("ci", help="ci (minutes on 2 cores) | paper (the paper's setup)"),
              out: Path = typer.Option(Path("figures"), help="PNG, CSV and JSON go here"),
              runs: Path = typer.Option(Path("runs/reproduce"), help="each series' run records go here"),
              rerun: bool = typer.Option(False, "--rerun", help="run series again even if their records exist"),
              reuse: bool = typer.Option(False, "--reuse", help="keep records that other code made (a strategy, a "
                                                               "node role or the reproduction module changed since "
                                                               "they ran; without it they run again); the figure's "
                                                               "JSON lists them"),
              seeds: Optional[int] = typer.Option(None, "--seeds", envvar="SEEDS",
                                                  help="runs per series: the scenario's seed and the ones after "
                                                       "it (default: the experiment's own, 3 for most)"),
              runtime: Optional[str] = runtime_option(None, "override the scenarios' runtime")) -> None:
    """Run a paper's experiment (every series of it, at each seed), draw it, and give its verdict."""
    from testbed.reproduce import SCALES, all_experiments, figure_dir, get_experiment, reproduce as run_reproduce
    from testbed.scenario.schema import ScenarioError

    if name is None:
        for exp in all_experiments():
            typer.echo(f"{exp.name:22s} {exp.paper:8s} {exp.title} ({len(exp.series_at('ci'))} runs)")
        return
    if scale not in SCALES:
        fail(f"error: --scale: '{scale}' is not one of {', '.join(SCALES)}")
    if seeds is not None and seeds < 1:
        fail(f"error: --seeds: {seeds} is not a positive count")
    if rerun and reuse:
        fail("error: --rerun and --reuse: one runs every series again, the other keeps old records; pick one")
    try:
        names = [e.name for e in all_experiments()] if name == "all" else [get_experiment(name).name]
    except KeyError as e:
        fail(f"error: {e.args[0]}")
    failed = []
    for n in names:
        try:
            report = run_reproduce(n, scale=scale, seeds=seeds, out_dir=out, runs_dir=runs, reuse=not rerun,
                                   runtime=runtime, say=typer.echo, keep_other_code=reuse)
        except (ScenarioError, FileNotFoundError, RuntimeError) as e:
            typer.echo(f"error: {n}: {e}", err=True)
            failed.append(n)
            continue
        typer.echo(f"{n}: {report['verdict']} at {scale} scale over {len(report['seeds'])} seed(s) "
                   f"(see {figure_dir(out, scale) / n}.json)")
    if failed:
        raise typer.Exit(EXIT_FAILED)

def status() -> None:
    """What edgebed has running or left on this machine."""
    from testbed.runtimes import load_backends
    from testbed.runtimes.state import leftovers

    load_backends()
    lines = leftovers()
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


def down(run_id: Optional[str] = typer.Argument(None, help="one run id (default: every run of yours whose runner "
                                                            "is gone)"),
         all_runs: bool = typer.Option(False, "--all", help="also stop the runs that are still going, and "
                                                             "others' runs"),
         docker_host: Optional[str] = DOCKER_HOST) -> None:
    """Remove everything edgebed made: processes, namespaces, links, cgroups (also after a crash).
    Only names of edgebed's own shapes are touched; another owner's run (uid@host) needs --all."""
    use_docker_host(docker_host)

    from testbed.runtimes import load_backends
    from testbed.runtimes.state import engine_runs, known_runs, labelled_runs

    load_backends()
    labelled = labelled_runs()
    runs = known_runs(labelled)
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
        p = _remove_run(rid, st)
        problems += p
        typer.echo(f"{rid}: {'removed' if not p else 'problems: ' + '; '.join(p)}")
    if not runs:
        typer.echo("nothing to remove")
    if problems:
        raise typer.Exit(EXIT_FAILED)


def _remove_run(run_id: str, st) -> list[str]:
    """cleanup_run, showing how far it has got where the run was a fleet."""
    from testbed.run.progress import FleetProgress
    from testbed.run.runner import FLEET_NODES
    from testbed.runtimes.state import cleanup_run

    if st is None or len(st.netns) < FLEET_NODES:
        return cleanup_run(run_id, st)
    progress = FleetProgress(typer.echo, sys.stdout.isatty())
    try:
        return cleanup_run(run_id, st, progress=progress)
    finally:
        progress.close()


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


def tensorboard(run_dir: Path = typer.Argument(..., help="a run's folder"),
                out: Optional[Path] = typer.Option(None, "--out", help="default RUN/tensorboard")) -> None:
    """A finished run's records as TensorBoard scalars (`tensorboard --logdir OUT`)."""
    from testbed.records.tensorboard import write_run

    if not (run_dir / "meta.json").is_file():
        fail(f"error: {run_dir}: not an edgebed run directory (no meta.json)")
    n = write_run(run_dir, out or run_dir / "tensorboard")
    typer.echo(f"{n} rows -> {out or run_dir / 'tensorboard'}")


def models() -> None:
    """List models (plugins' too)."""
    from testbed.data.models import model_names

    for name, desc in model_names().items():
        typer.echo(f"{name:14s} {desc}")


def datasets() -> None:
    """List datasets (plugins' too)."""
    from testbed.data.datasets import dataset_names

    for name, desc in dataset_names().items():
        typer.echo(f"{name:18s} {desc}")


def devices() -> None:
    """List the device catalog (plugins' too): speed, step model, power, and whether it is an estimate."""
    from testbed.scenario.devices.catalog import catalog

    for name, d in catalog().items():
        acc, power = d.accelerator, d.power
        model = (f"roofline {acc.peak_tflops:g} TFLOP/s x {acc.efficiency:g}, {acc.memory_gbps:g} GB/s, "
                 f"+{acc.overhead_ms:g} ms/step" if acc is not None else f"{d.gflops:g} GFLOP/s x {d.cores} cores")
        watts = f"{power.idle_w:g}-{power.active_w:g} W" if power is not None else "power not stated"
        typer.echo(f"{name:22s} {model:58s} {watts:14s}{' (estimate)' if d.estimate else ''}")


def kernel() -> None:
    """Which shaping features this kernel has (netem, htb, tbf, ifb) and the cgroup version."""
    from testbed.kernel import cgroups
    from testbed.kernel.shaping import probe_kernel

    caps = probe_kernel()
    typer.echo(json.dumps({**caps.__dict__, "cgroup_version": 2 if cgroups.is_v2() else 1}))
    if not caps.netem:
        loss = "an eBPF drop filter" if caps.bpf_loss else "nothing (loss is not applied)"
        typer.echo(f"no sch_netem: latency/jitter fall back to edgebed's transport; loss to {loss}", err=True)

