"""Imported by the netns runtime's forkserver (its preload, after forkserver_guard) and nowhere
else: the runner's main module (the `edgebed` script, `python -m testbed.cli`, a user's script),
imported there once so that each node forked from it finds it and does not import it again as
it starts. A node did that before its first line, before it joins its cgroup (with this
runtime's modules, 1.2 s of a per-round trainer's start on a loaded machine, the host's CPU
meanwhile: benchmarks/node_start.py).

multiprocessing's own "__main__" preload cannot do it: the forkserver is asked for `main_path`,
a key spawn.get_preparation_data does not give (CPython 3.11-3.13), so it imports nothing. The
runner names its main (forkserver_guard.request_main) in the keys spawn.prepare reads in every
child. Like the guard, it acts only in a forkserver of the runner that named itself."""

import json
import os
import sys
from multiprocessing import process, spawn

from testbed.runtimes.netns.forkserver_guard import MAIN_ENV, MAIN_KEYS, RUNNER_ENV


def _import_main() -> None:
    wanted = os.environ.get(MAIN_ENV)
    if not wanted or os.environ.get(RUNNER_ENV) != str(os.getppid()) or sys.argv[:1] != ["-c"]:
        return  # not a forkserver (`python -c`) of the runner that asked
    me = process.current_process()
    # As multiprocessing does while a child prepares: the main module's own start of a process
    # (unguarded) fails instead of forking from here. setattr: BaseProcess declares no _inheriting.
    setattr(me, "_inheriting", True)  # noqa: B010
    try:
        spawn.prepare({k: v for k, v in json.loads(wanted).items() if k in MAIN_KEYS})
    except BaseException:  # never break the forkserver (a script's sys.exit included): each node
        pass  # then imports the main module itself as it starts
    finally:
        delattr(me, "_inheriting")


_import_main()
