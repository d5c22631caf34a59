"""Imported by the netns runtime's forkserver (runner.PRELOAD) before any node forks from it: loads
the run's dataset once, named by EDGEBED_PRELOAD_DATASET, into datasets.shared_dataset's cache.
Every node then finds it there, in pages the forks share copy-on-write, instead of reading and
decoding a copy of its own under its CPU quota. Full MNIST costs a node about 1 GB while it
decodes: 32 workers loading it each ran this 24 GiB machine out of memory.
"""

import json
import os

from testbed.data.datasets import shared_dataset

ENV = "EDGEBED_PRELOAD_DATASET"


def request(spec: str, seed: int, test_size) -> None:
    """Name the dataset the next forkserver loads (the runner, before its first node starts)."""
    os.environ[ENV] = json.dumps({"spec": spec, "seed": seed, "test_size": test_size})


def _preload() -> None:
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    try:
        d = json.loads(wanted)
        shared_dataset(d["spec"], seed=d["seed"], test_size=d["test_size"])
    except Exception:  # never break the forkserver: the nodes load the data themselves and report errors
        pass


_preload()
