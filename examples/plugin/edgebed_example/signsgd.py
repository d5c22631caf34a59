"""signSGD with majority vote (Bernstein, Wang, Azizzadenesheli, Anandkumar, "signSGD: Compressed
Optimisation for Non-Convex Problems", ICML 2018, Algorithm 3).

Each worker sends only the sign of its gradient, sign(g_m) (1 bit a coordinate; int8 on the wire
here); the server takes the majority vote of the signs and every worker applies the same step:

    x_{k+1} = x_k - lr * sign( sum_m sign(g_m) )

Synchronous, like BSP: the PS waits for every worker's signs each step. A tie (the sum is 0)
leaves that coordinate unchanged.
"""

from __future__ import annotations

import torch
from pydantic import Field

from testbed.strategies.base import StrategyParams, Tensors, WorkerContext
from testbed.strategies.bsp import BSP


class SignSGDParams(StrategyParams):
    lr_scale: float = Field(1.0, gt=0, description="the sign step's learning rate, as a multiple of workload.lr")


class SignSGD(BSP):
    name = "signsgd"
    summary = "signSGD with majority vote: workers send sign(g) as int8, the PS applies lr * sign(sum of signs)"
    paper = "Bernstein et al., ICML 2018, Algorithm 3"
    Params = SignSGDParams

    def worker_payload(self, grads: Tensors, ctx: WorkerContext) -> Tensors:
        return {name: torch.sign(g).to(torch.int8) for name, g in grads.items()}

    def aggregate(self, server) -> tuple[Tensors, float]:
        pushes = list(self._pending.values())
        votes = {name: sum(p[name].to(torch.int32) for p in pushes) for name in pushes[0]}
        return {name: torch.sign(v).to(torch.float32) for name, v in votes.items()}, server.lr * self.params.lr_scale
