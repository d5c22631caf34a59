"""`edgebed.report(step=..., accuracy=..., loss=..., **anything)`: a command workload's program
hands its metrics to the run's records, over the node's channel to the runner (the EDGEBED_*
variables its role set say where, and with which key: node.channel_keys.ENV). Every metric goes
to report.csv; given a `step`, `accuracy` (with its `loss`) also to eval.csv (kept from the
nodes of the role the scenario names, workload.eval_role, alone), and a `loss` without one
(training) to steps.csv, so `edgebed plot` draws the program like a built-in and
`edgebed.load` reads it back. Outside an edgebed run it does nothing (and says so by returning
False)."""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path
from typing import Any, Optional

from testbed.node import channel, channel_keys
from testbed.records import metrics

_tables: dict[str, Any] = {}


def _table(name: str):
    if name not in _tables:
        address = os.environ.get("EDGEBED_RECORDS", "")
        if address:
            if channel_keys.held() is None:  # its node's keys, as its role handed them
                channel_keys.use(channel_keys.from_environment())
            _tables[name] = channel.RemoteTable(address, name)
            if len(_tables) == 1:
                atexit.register(channel.flush)  # the last rows leave before the program does
        else:
            _tables[name] = metrics.open_table(Path(os.environ["EDGEBED_RUN_DIR"]), name)
    return _tables[name]


def report(step: Optional[int] = None, **values: float) -> bool:
    node = os.environ.get("EDGEBED_NODE")
    if not node or not (os.environ.get("EDGEBED_RECORDS") or os.environ.get("EDGEBED_RUN_DIR")):
        return False
    t = time.time() - float(os.environ.get("EDGEBED_T0", "0") or 0)
    for key, value in values.items():
        _table("report.csv").write(time=t, node=node, step=step, key=key, value=value)
    if step is None:  # eval.csv and steps.csv rows need a step (report.csv has the rest)
        return True
    if "accuracy" in values:  # an evaluation: its loss is the evaluation's
        _table("eval.csv").write(time=t, node=node, step=step, accuracy=values["accuracy"], loss=values.get("loss"))
    elif "loss" in values:  # a training step; its step stands for the model version a built-in records
        _table("steps.csv").write(time=t, node=node, step=step, loss=values["loss"], model_version=step)
    return True
