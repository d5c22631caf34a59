"""What the command line's apps share: failing with one line, loading a checked scenario, and
the options several commands take (each defined once)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

import typer

from testbed.runtimes import runtime_names

if TYPE_CHECKING:
    from testbed.scenario.document import Scenario


def fail(msg: str, code: int = 2) -> NoReturn:
    typer.echo(msg, err=True)
    raise typer.Exit(code)


def exit_unless_ok(*results: dict) -> None:
    """Exit 1 unless every benchmark result is within its bounds (`ok`)."""
    if not all(r["ok"] for r in results):
        raise typer.Exit(1)


def load_checked(path: Path, trace_dirs: list[Path]) -> Scenario:
    from testbed.plan import load_scenario

    return checked(lambda: load_scenario(path, trace_dirs))


def checked(make: Callable[[], Scenario]) -> Scenario:
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


def use_docker_host(url: Optional[str]) -> None:
    if url:
        os.environ["DOCKER_HOST"] = url  # for this process and the nodes' tools alike


TRACE_DIRS = typer.Option([], "--trace-dir", help="also read link and rate traces from this folder "
                                                  "(default: the scenario file's folder only), repeatable")
DOCKER_HOST = typer.Option(None, "--docker-host", help="the Docker engine (runtime swarm: a manager's), as "
                                                      "DOCKER_HOST: unix://, tcp://, ssh://user@host")
RUN = typer.Option(None, "--run", help="run id (default: the only run that is up)")

# What `--runtime` offers, from the registry: a scenario's choices, and a benchmark's.
SCENARIO_RUNTIMES = ", ".join(["auto", *runtime_names()])
EVERY_RUNTIME = " | ".join(runtime_names())


def runtime_option(default: Optional[str], help: str) -> Any:
    """The `--runtime` option, with its default and what it offers there."""
    return typer.Option(default, "--runtime", help=help)
