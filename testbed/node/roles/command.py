"""A command workload's role: an unmodified program runs in the node instead of edgebed's trainer
(`workload.command: {worker: "...", ps: "..."}`), under the node's profile, link, timeline and
faults like any role. The node's addresses reach the program as placeholders in its command and
as the environment torch.distributed and torchrun read; `edgebed.report(...)` in the program sends
metrics to the run's records (the EDGEBED_* variables say where).

    worker w<rank>  the worker command, RANK=<rank> WORLD_SIZE=<workers> MASTER_ADDR=<w0's address>
    ps              the ps command if any (e.g. a Flower SuperLink), else it waits; it ends the run
                    when stop.seconds pass or the runner says every worker's command has finished
    evaluator       waits (a program evaluates itself, and reports)

The program's output goes to RUN/logs/<node>.log (netns: written here; docker and swarm: the
container's log, saved at teardown); it is stopped (SIGTERM, then SIGKILL) when the run stops.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from testbed.node import channel
from testbed.node.roles.common import RoleConfig

MASTER_PORT = 29500
STOP_GRACE = 5.0  # s between SIGTERM and SIGKILL at the run's stop


def placeholders(cfg: RoleConfig) -> dict:
    workers = cfg.workers
    master = cfg.addresses.get(workers[0], "") if workers else ""
    return {"rank": max(cfg.rank, 0), "world_size": len(workers), "node": cfg.node,
            "address": cfg.addresses.get(cfg.node, ""), "master_addr": master, "master_port": MASTER_PORT,
            "ps_addr": cfg.ps_address, "python": sys.executable}


def environment(cfg: RoleConfig) -> dict:
    v = placeholders(cfg)
    return {**os.environ, "MASTER_ADDR": str(v["master_addr"]), "MASTER_PORT": str(MASTER_PORT),
            "RANK": str(v["rank"]), "WORLD_SIZE": str(v["world_size"]), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": str(cfg.threads),
            "GLOO_SOCKET_IFNAME": _iface(v["address"]), "EDGEBED_NODE": cfg.node, "EDGEBED_RECORDS": cfg.records,
            "EDGEBED_RUN_DIR": cfg.run_dir,
            "EDGEBED_T0": repr(cfg.t0), "EDGEBED_PS_ADDR": cfg.ps_address}


def _iface(address: str) -> str:
    """The interface holding the node's address: gloo would otherwise take the address its
    hostname resolves to, which is the host's in a network namespace of the netns runtime."""
    from pyroute2 import IPRoute

    from testbed.node.own_link import iface_with

    with IPRoute() as ipr:
        try:
            return ipr.get_links(iface_with(ipr, address))[0].get_attr("IFLA_IFNAME")
        except RuntimeError:  # no interface holds it (outside a run)
            return ""


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def run_command(cfg: RoleConfig, stop_event) -> None:
    sc = cfg.scenario_model()
    role = "worker" if cfg.role == "worker" else "ps" if cfg.role == "ps" else ""
    template = (sc.workload.command or {}).get(role) if role else None
    proc = None
    if template:
        env = {k: v for k, v in environment(cfg).items() if v != "" or k == "EDGEBED_RECORDS"}
        out = open(cfg.log_path, "ab") if cfg.log_path else None  # else the node's own output
        proc = subprocess.Popen(shlex.split(template.format(**placeholders(cfg))), env=env, stdout=out,
                                stderr=subprocess.STDOUT if out else None)
    deadline = None if cfg.role != "ps" or sc.stop.seconds is None else cfg.t0 + sc.stop.seconds
    reason = None
    while reason is None:
        if proc is not None and proc.poll() is not None:
            break  # the program ended on its own
        if stop_event.is_set():
            reason = "commands"  # the runner: every worker's command has finished (or the run stops)
        elif deadline is not None and time.time() >= deadline:
            reason = "seconds"
        else:
            time.sleep(0.1)
    code = _stop(proc) if proc is not None else 0
    if cfg.role == "ps":
        channel.report(cfg, "ps.json", {"stop_reason": reason or "command", "command_exit": code})
        channel.flush()
    if code != 0 and reason is None:
        raise SystemExit(code if 0 < code < 256 else 1)  # the node's exit code: the runner names it
