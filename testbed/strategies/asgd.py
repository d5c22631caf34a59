"""ASGD: asynchronous SGD with a staleness-dependent learning rate.

The PS applies each push as it arrives. With i the PS's current model version and j
the version the worker computed on, the staleness is sigma = i - j and the update is
W <- W - (alpha / sigma) * g, with alpha itself when sigma = 0 (AdaComp Sec. II-B and
III, the "ASGD" baseline of Fig. 3; the staleness-aware rule of Zhang et al. [14]).

With a compressor (`compressor: {name: top_c, c: 0.01}`, compressors.py) each push carries
only the entries it keeps and the PS applies the decoded update g~ by the same rule: that is
Comp-ASGD (comp_asgd.py).
"""

from __future__ import annotations

from testbed.strategies.base import ServerState, Strategy, Tensors
from testbed.strategies.compressors import Compressible, Compressing


def staleness_lr(lr: float, staleness: int) -> float:
    return lr if staleness <= 0 else lr / staleness


class ASGD(Compressing, Strategy):
    name = "asgd"
    summary = "asynchronous: PS applies each push at once with lr / staleness, answers that worker"
    synchronous = False
    Params = Compressible

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        staleness = server.version - base_version
        lr = staleness_lr(server.lr, staleness)
        server.apply(self.dense_update(server, payload), lr)
        server.log.append((worker, staleness, lr))
        return [worker]
