"""What the command line's apps share: failing with one line (and every command's one catch of
edgebed's errors), loading a checked scenario, and the options several commands take (each
defined once)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional

import typer

from testbed.errors import EXIT_FAILED, EXIT_REFUSED, EdgebedError, error_lines, exit_code
from testbed.runtimes import runtime_names

if TYPE_CHECKING:
    from testbed.scenario.document import Scenario


def fail(msg: str, code: int = EXIT_REFUSED) -> NoReturn:
    typer.echo(msg, err=True)
    raise typer.Exit(code)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command, with edgebed's errors caught once: each of their lines printed as `error: ...`
    and the family's exit code (testbed.errors). EDGEBED_DEBUG=1 lets the traceback through."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except EdgebedError as e:
            if os.environ.get("EDGEBED_DEBUG"):
                raise
            for line in error_lines(e):
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(exit_code(e)) from None
    return run


def exit_unless_ok(*results: dict) -> None:
    """Exit 1 unless every benchmark result is within its bounds (`ok`)."""
    if not all(r["ok"] for r in results):
        raise typer.Exit(EXIT_FAILED)


def load_checked(path: Path, trace_dirs: list[Path]) -> Scenario:
    from testbed.plan import load_scenario

    return checked(lambda: load_scenario(path, trace_dirs))


def checked(make: Callable[[], Scenario]) -> Scenario:
    """The scenario `make()` returns, validated and checked against this machine's engines (a
    ScenarioError's lines reach the user through one_line_errors)."""
    from testbed.runtimes.preflight import preflight

    sc = make()
    preflight(sc)
    return sc


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
