"""Imported first by the netns runtime's forkserver (its preload): the forkserver dies when the
runner dies, even by `kill -9`, and every node process forked from it dies with it (each sets
PR_SET_PDEATHSIG as it starts, runtimes/netns/runtime.py). Without this the forkserver could outlive a
killed runner and the cluster went on training until `edgebed down`. From here on each process
it forks starts a PID namespace of its own (kernel.pid_namespace), unless the runner said not.

It acts only in a direct child of the runner that named itself in EDGEBED_RUNNER_PID: imported
anywhere else (a test, a tool), it does nothing."""

import json
import os
import signal

from testbed.kernel import pid_namespace
from testbed.kernel.parent_death import die_with_parent

RUNNER_ENV = "EDGEBED_RUNNER_PID"
PID_NAMESPACES_ENV = "EDGEBED_NODE_PID_NAMESPACES"  # "0": the nodes share the host's (an MPS daemon's clients)
MAIN_ENV = "EDGEBED_FORKSERVER_MAIN"  # the runner's main module, for forkserver_main.py
MAIN_KEYS = ("init_main_from_path", "init_main_from_name")


def request_main() -> None:
    """Name this process's main module for its next forkserver (forkserver_main.py)."""
    from multiprocessing import spawn

    data = spawn.get_preparation_data("edgebed")
    os.environ[MAIN_ENV] = json.dumps({k: data[k] for k in MAIN_KEYS if k in data})


def _guard() -> None:
    if os.environ.get(RUNNER_ENV) != str(os.getppid()):
        return
    die_with_parent(signal.SIGKILL)
    if os.environ.get(RUNNER_ENV) != str(os.getppid()):  # the runner died before prctl took hold
        os._exit(1)
    pid_namespace.fork_children_apart(os.environ.get(PID_NAMESPACES_ENV) != "0")


_guard()
