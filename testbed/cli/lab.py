"""Runtime swarm's hosts: a lab of emulated hosts on this machine (`edgebed lab`), the swarm's
hosts (`edgebed hosts`) and where a scenario's nodes would go on them (`edgebed place`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from testbed.cli.common import DOCKER_HOST, TRACE_DIRS, fail, load_checked, use_docker_host
from testbed.errors import EXIT_FAILED

lab_app = typer.Typer(no_args_is_help=True, help="A swarm of N emulated hosts on this machine (for runtime swarm).")


@lab_app.command("up")
def lab_up(hosts: int = typer.Option(2, "--hosts", help="how many hosts (dockerds, each in its own namespace)"),
           gpus: int = typer.Option(0, "--gpus", help="GPUs each host advertises to the swarm (for placement "
                                                     "only: no device is behind them)")) -> None:
    """Bring up a Docker Swarm of N hosts on this machine, joined by an underlay network."""
    import os

    from testbed.runtimes.swarm import lab

    if os.geteuid() != 0:
        fail("error: edgebed lab needs root (it starts dockerds in network namespaces)")
    lab.lab_up(hosts, say=typer.echo, gpus=gpus)


@lab_app.command("down")
def lab_down() -> None:
    """Remove the lab: its engines, their containers and data, its namespaces."""
    from testbed.runtimes.swarm import lab

    problems = lab.lab_down(say=typer.echo)
    for p in problems:
        typer.echo(f"problem: {p}", err=True)
    if problems:
        raise typer.Exit(EXIT_FAILED)


def hosts(as_yaml: bool = typer.Option(False, "--yaml", help="as YAML, the format `edgebed place --hosts` reads"),
          docker_host: Optional[str] = DOCKER_HOST) -> None:
    """The hosts of the Docker Swarm that runtime swarm would use: CPUs, memory, GPUs, labels."""
    use_docker_host(docker_host)
    from testbed.runtimes.swarm.hosts import describe_hosts, hosts_to_yaml, swarm_client, swarm_hosts

    found = swarm_hosts(swarm_client())
    for line in (hosts_to_yaml(found).splitlines() if as_yaml else describe_hosts(found)):
        typer.echo(line)


def place(scenario: Path = typer.Argument(..., help="scenario YAML file"),
          hosts_file: Optional[Path] = typer.Option(None, "--hosts", help="plan for these hosts (YAML, as "
                                                    "`edgebed hosts --yaml` writes) instead of the swarm's"),
          trace_dirs: list[Path] = TRACE_DIRS, docker_host: Optional[str] = DOCKER_HOST) -> None:
    """Where runtime swarm would put each node: on the swarm's hosts, or on a cluster described in
    a file (plan a paper-scale run before you have the machines). Starts nothing."""
    use_docker_host(docker_host)
    from testbed.plan.cluster import build_cluster
    from testbed.plan.placement import place as place_nodes
    from testbed.runtimes.swarm.hosts import SwarmPlacer, describe_placement, hosts_from_yaml, swarm_client, swarm_hosts

    sc = load_checked(scenario, trace_dirs)
    try:
        found = hosts_from_yaml(hosts_file.read_text()) if hosts_file else swarm_hosts(swarm_client())
        placer = SwarmPlacer(found, sc)
        spec = place_nodes(build_cluster(sc, "place"), placer)
        routers = placer.router_hosts(spec)
    except OSError as e:  # the --hosts file
        fail(f"error: {e}")
    for line in describe_placement(spec, found, routers):
        typer.echo(line)

