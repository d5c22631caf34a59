"""A command workload's role: an unmodified program runs in the node instead of edgebed's trainer
(`workload.command: {worker: "...", ps: "...", evaluator: "..."}`), under the node's profile, link,
timeline and faults like any role. The node's addresses reach the program as placeholders in its
command and as the environment torch.distributed and torchrun read; `edgebed.report(...)` in the
program sends metrics to the run's records (the EDGEBED_* variables say where).

    worker w<rank>  the worker command, RANK=<rank> WORLD_SIZE=<workers> MASTER_ADDR=<w0's address>
    ps              the ps command if any (e.g. a Flower SuperLink), else it waits; it ends the run
                    when stop.seconds pass or the runner says the commands are done
    evaluator       the evaluator command if any: a driver (e.g. `flwr run`); else it waits

The run completes when the evaluator's program ends well or, without one, when every worker's
has (the runner watches the roles' exit codes); a program that fails fails the run, naming its node.

Each program gets a folder of its own as HOME (`{home}`): on the netns runtime the nodes share
the host's files, and devices do not share a home (Flower keeps its state in ~/.flwr). A program
started from a venv's bin/ finds that venv's other programs on PATH, as if it were activated
(Flower's SuperLink starts `flower-superexec` by name). The program runs in a process group of
its own, stopped as a whole when the run stops (SIGTERM, then SIGKILL): what it started goes with
it (what detaches into a session of its own, as Flower's SuperExec does, goes with the node's
cgroup or container). Its output goes to RUN/logs/<node>.log (netns: written here; docker and
swarm: the container's log, saved at teardown).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testbed.node import channel, channel_keys
from testbed.node.gpu import program_env
from testbed.node.roles.common import RoleConfig

MASTER_PORT = 29500
STOP_GRACE = 5.0  # s between SIGTERM and SIGKILL at the run's stop


def placeholders(cfg: RoleConfig, home: str = "") -> dict:
    workers = cfg.workers
    master = cfg.addresses.get(workers[0], "") if workers else ""
    return {"rank": max(cfg.rank, 0), "world_size": len(workers), "node": cfg.node,
            "address": cfg.addresses.get(cfg.node, ""), "master_addr": master, "master_port": MASTER_PORT,
            "ps_addr": cfg.ps_address, "python": sys.executable, "home": home}


def venv_path(program: str, path: str) -> str:
    """PATH with the program's venv bin/ first when the program lives in one (bin/activate
    beside it), else PATH as it is."""
    where = Path(program).parent
    if "/" not in program or not (where / "activate").is_file():
        return path
    return os.pathsep.join([str(where.resolve()), *[p for p in path.split(os.pathsep) if p]])


def environment(cfg: RoleConfig, home: str = "", program: str = "") -> dict:
    v = placeholders(cfg, home)
    return {**os.environ, "HOME": home or os.environ.get("HOME", ""),
            "PATH": venv_path(program, os.environ.get("PATH", "")),
            "MASTER_ADDR": str(v["master_addr"]), "MASTER_PORT": str(MASTER_PORT),
            "RANK": str(v["rank"]), "WORLD_SIZE": str(v["world_size"]), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": str(cfg.threads),
            "GLOO_SOCKET_IFNAME": _iface(v["address"]), "EDGEBED_NODE": cfg.node, "EDGEBED_RECORDS": cfg.records,
            "EDGEBED_RUN_DIR": cfg.run_dir,
            "EDGEBED_T0": repr(cfg.t0), "EDGEBED_PS_ADDR": cfg.ps_address,
            channel_keys.ENV: keys.to_text() if (keys := channel_keys.held()) else ""}  # for edgebed.report


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


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _stop(proc: subprocess.Popen) -> int:
    """Stop the program and whatever it started (its process group); its exit code."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)  # the leader may be gone and its children not
    return proc.wait()


# Empty but meant: no records address outside a run; no GPU for a node whose profile has none.
KEEP_EMPTY = ("EDGEBED_RECORDS", "CUDA_VISIBLE_DEVICES")


def _start(cfg: RoleConfig, template: str, home: str) -> subprocess.Popen:
    argv = shlex.split(template.format(**placeholders(cfg, home)))
    env = {k: v for k, v in program_env(environment(cfg, home, argv[0])).items() if v != "" or k in KEEP_EMPTY}
    out = open(cfg.log_path, "ab") if cfg.log_path else None  # else the node's own output
    return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                            start_new_session=True)


def run_command(cfg: RoleConfig, stop_event) -> None:
    sc = cfg.scenario_model()
    template = (sc.workload.command or {}).get(cfg.role)
    home = tempfile.mkdtemp(prefix=f"edgebed-home-{cfg.node}-") if template else ""
    try:
        proc = _start(cfg, template, home) if template else None
        reason, code = _wait(cfg, sc, proc, stop_event)
    finally:
        if home:
            shutil.rmtree(home, ignore_errors=True)
    if cfg.role == "ps":
        channel.report(cfg, "ps.json", {"stop_reason": reason or "command", "command_exit": code})
        channel.flush()
    if code != 0 and reason is None:
        raise SystemExit(code if 0 < code < 256 else 1)  # the node's exit code: the runner names it


def _wait(cfg: RoleConfig, sc, proc, stop_event) -> tuple:
    """Until the program ends on its own (reason None), the runner stops the run, or (the ps)
    stop.seconds pass; then (reason, the program's exit code)."""
    deadline = None if cfg.role != "ps" or sc.stop.seconds is None else cfg.t0 + sc.stop.seconds
    reason = None
    try:
        while reason is None:
            if proc is not None and proc.poll() is not None:
                break  # the program ended on its own
            if stop_event.is_set():
                reason = "commands"  # the runner: the commands are done (or the run stops)
            elif deadline is not None and time.time() >= deadline:
                reason = "seconds"
            else:
                time.sleep(0.1)
    finally:
        code = _stop(proc) if proc is not None else 0
    return reason, code
