"""The `edgebed` command line, one module per app: core (run, draw, list, clean up), bench,
live (change a running cluster) and lab (runtime swarm's hosts); `common` holds what they share."""

from __future__ import annotations

import typer

from testbed.cli import bench, core, lab, live
from testbed.cli.common import one_line_errors
from testbed.cli.live import link  # noqa: F401  (its parameters are the link properties: tests read them)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="edgebed: emulate an edge cluster on this machine and train on it.")
app.add_typer(bench.bench_app, name="bench")
app.add_typer(lab.lab_app, name="lab")

# The top-level commands, in the order `edgebed --help` lists them.
for _command in (core.validate, core.up, core.build, core.plot, core.reproduce, lab.hosts, lab.place, core.status,
                 core.down, core.algorithms, core.tensorboard, core.models, core.datasets, core.devices, core.kernel,
                 live.link, live.cpu, live.stress, live.kill, live.restart, live.pause, live.partition, live.heal,
                 live.resume):
    app.command()(_command)

# edgebed's errors are caught in one place: around every command, of every app.
for _info in (*app.registered_commands, *bench.bench_app.registered_commands, *lab.lab_app.registered_commands):
    _info.callback = one_line_errors(_info.callback) if _info.callback else None


def main() -> None:
    from testbed.errors import EXIT_INTERRUPTED
    from testbed.run.interrupts import Interrupted

    try:
        app()
    except Interrupted as e:  # SIGTERM/SIGHUP in a command that tore down on the way out (a benchmark)
        typer.echo(f"interrupted ({e}): stopped and torn down", err=True)
        raise SystemExit(EXIT_INTERRUPTED) from None
