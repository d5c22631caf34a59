"""Changing a running cluster: the same path as the scenario's timeline (a request over the
run's control channel)."""

from __future__ import annotations

from typing import Optional

import typer

from testbed.cli.common import RUN


def _control(target: str, action: str, fields: dict, run: Optional[str]) -> None:
    from testbed.run.live import request

    for line in request(target, action, fields, run):
        typer.echo(line)


def link(target: str = typer.Argument(..., help="node, worker group or 'workers'"),
         direction: str = typer.Option("both", "--direction", help="up | down | both"),
         rate: Optional[str] = typer.Option(None, "--rate", help="e.g. 5mbit"),
         latency: Optional[str] = typer.Option(None, "--latency", help="one-way, e.g. 20ms"),
         jitter: Optional[str] = typer.Option(None, "--jitter"),
         loss: Optional[str] = typer.Option(None, "--loss", help="e.g. 1%"),
         run: Optional[str] = RUN) -> None:
    """Change a node's access link now."""
    _control(target, "link", {"direction": direction, "rate": rate, "latency": latency, "jitter": jitter,
                              "loss": loss}, run)


def cpu(target: str = typer.Argument(...), cpus: float = typer.Argument(..., help="new CPU quota in cores"),
        run: Optional[str] = RUN) -> None:
    """Change a node's CPU quota now."""
    _control(target, "cpu", {"cpus": cpus}, run)


def stress(target: str = typer.Argument(...), load: float = typer.Argument(..., help="cores of busy loop (0 stops)"),
           run: Optional[str] = RUN) -> None:
    """Start, change or stop background CPU stress in a node now."""
    _control(target, "stress", {"load": load}, run)


def kill(target: str = typer.Argument(...), run: Optional[str] = RUN) -> None:
    """SIGKILL a node's processes now (a crash)."""
    _control(target, "kill", {}, run)


def restart(target: str = typer.Argument(...), run: Optional[str] = RUN) -> None:
    """Start a node's role again (a worker rejoins and pulls the current model)."""
    _control(target, "restart", {}, run)


def pause(target: str = typer.Argument(...), run: Optional[str] = RUN) -> None:
    """Freeze a node now (cgroup freezer / docker pause)."""
    _control(target, "pause", {}, run)


def partition(target: str = typer.Argument(...),
              peers: list[str] = typer.Option(..., "--from", help="node or group to cut it off from (repeatable)"),
              run: Optional[str] = RUN) -> None:
    """Cut a node off from other nodes now (all their traffic is dropped)."""
    _control(target, "partition", {"peers": peers}, run)


def heal(target: str = typer.Argument(...),
         peers: list[str] = typer.Option([], "--from", help="only these (default: every cut of the node)"),
         run: Optional[str] = RUN) -> None:
    """Undo partitions of a node."""
    _control(target, "heal", {"peers": peers}, run)


def resume(target: str = typer.Argument(...), run: Optional[str] = RUN) -> None:
    """Thaw a paused node."""
    _control(target, "resume", {}, run)
