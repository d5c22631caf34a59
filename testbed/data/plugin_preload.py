"""Imported by the netns runtime's forkserver (runner.PRELOAD) before any node forks from it: the
plugin registries read once (every installed distribution's entry points) and the run's own
algorithm, model and dataset loaded there when they are edgebed's own, so a per-round trainer
forked from it does neither as it starts: those lookups are a sizeable share of each start's CPU
(BENCHMARKS.md, "Where a fleet's round goes").

A plugin of a user's package is not imported here: the forkserver keeps the runtime's powers,
and a user's code runs in the nodes only (each node imports it as it starts).
"""

import json
import os

from testbed import plugins

ENV = "EDGEBED_PRELOAD_PLUGINS"


def request(refs: dict[str, str]) -> None:
    """Name the run's plugins ({kind: name}) for the next forkserver (the runner, before its first
    node starts)."""
    os.environ[ENV] = json.dumps(refs)


def _preload() -> None:
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    try:
        for kind in plugins.GROUPS:
            plugins.registered(kind)  # cached: every fork finds it read
        for kind, ref in json.loads(wanted).items():
            entry = plugins.registered(kind).get(ref)
            if entry is not None and entry.module.split(".")[0] == "testbed":
                entry.load()
    except Exception:  # never break the forkserver: the nodes look their plugins up themselves
        pass


_preload()
