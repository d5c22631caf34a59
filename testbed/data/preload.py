"""Imported by the netns runtime's forkserver (runner.PRELOAD) before any node forks from it: loads
the run's dataset once, named by EDGEBED_PRELOAD_DATASET, into datasets.shared_dataset's cache.
Every node then finds it there, in pages the forks share copy-on-write, instead of reading and
decoding a copy of its own under its CPU quota. Full MNIST costs a node about 1 GB while it
decodes: 32 workers loading it each ran this 24 GiB machine out of memory.

The run's initial model is built here too when the model is edgebed's own (a user's plugin runs
in the nodes only: the forkserver keeps the runtime's powers), so a node copies it instead of
building it (models.initial_model).
"""

import json
import os

from testbed.data.datasets import shared_dataset

ENV = "EDGEBED_PRELOAD_DATASET"


def request(spec: str, seed: int, test_size, model: str = "") -> None:
    """Name the dataset the next forkserver loads, and the model it builds (the runner, before its
    first node starts)."""
    os.environ[ENV] = json.dumps({"spec": spec, "seed": seed, "test_size": test_size, "model": model})


def _preload() -> None:
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    try:
        d = json.loads(wanted)
        ds = shared_dataset(d["spec"], seed=d["seed"], test_size=d["test_size"])
        if _own_model(d.get("model", "")):
            _keep_model(d["model"], tuple(ds.input_shape), ds.num_classes, d["seed"])
    except Exception:  # never break the forkserver: the nodes load the data themselves and report errors
        pass


def _own_model(name: str) -> bool:
    """A model registered by edgebed itself (not a plugin's, not a module:function reference)."""
    from testbed import plugins

    entry = plugins.registered("model").get(name) if name else None
    return entry is not None and entry.module.split(".")[0] == "testbed"


def _keep_model(name: str, input_shape: tuple, num_classes: int, seed: int) -> None:
    import torch

    from testbed.data.models import keep_initial_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no OpenMP pool in a process that forks
    try:
        keep_initial_model(name, input_shape, num_classes, seed)
    finally:
        torch.set_num_threads(threads)


_preload()
