"""ScaDLES (Tyagi & Sharma, scadles.txt): training on streams of heterogeneous rates.

Each device trains on a batch that follows its stream (b_i = S_i clipped to [b_min, b_max]:
the streaming data plane's `batch: stream`, ScaDLES Sec. IV). This strategy is the
synchronous aggregation around it:

* weighted aggregation (Eq. 4a, 4b): r_i = S_i / sum_j S_j, g~ = sum_i r_i g_i, with S_i
  the samples device i trained on this step (its batch, = its rate under stream batches);
* linear lr scaling (Eq. 4c): w <- w - eta_scaled g~, eta_scaled = eta * sum_j S_j / B with
  B = base_batch * N (NOTES.md: the paper's code uses B = 64 N), per iteration;
* adaptive Top-k compression (Sec. IV): a device sends Topk(g), the fraction `cr` largest
  entries of its update, when | |g|^2 - |Topk(g)|^2 | / |g|^2 <= delta, else the dense g;
  the CNC ratio (compressed / all iterations) is read from steps.csv's `compressed` column.

Data injection (Sec. IV-D, alpha of the devices send beta of their streamed batch to the
others) is a workload setting, `workload.injection` (testbed/node/roles/injection.py): the samples travel
between the devices for real. Not implemented from the authors' code (NOTES.md): plain-norm
compression decisions, error-feedback residuals for Top-k, the N/2 vote on compressing.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from testbed.strategies import sparse
from testbed.strategies.base import ServerState, StrategyParams, Tensors
from testbed.strategies.bsp import BSP, average
from testbed.strategies.compressors import AdaptiveTopC, compression_loss

__all__ = ["ScaDLES", "ScaDLESParams", "compression_loss"]


class ScaDLESParams(StrategyParams):
    weighted: bool = Field(True, description="weight each device's gradient by its samples (Eq. 4a-4b)")
    lr_scaling: bool = Field(True, description="scale lr by sum of the devices' samples / B (Eq. 4c)")
    base_batch: int = Field(64, ge=1, description="per-device batch of the lr rule's B = base_batch * N")
    cr: Optional[float] = Field(None, gt=0, le=1, description="Top-k fraction for adaptive compression (None: off)")
    delta: float = Field(0.3, ge=0, description="send Top-k when the relative squared-norm loss is <= delta")


class ScaDLES(BSP):
    name = "scadles"
    summary = "synchronous, gradients weighted by each device's streamed samples, lr scaled, adaptive Top-k"
    paper = "ScaDLES Eq. 4a-4c, Sec. IV"
    synchronous = True
    Params = ScaDLESParams

    def __init__(self, params=None):
        super().__init__(params)
        self._samples: dict[str, int] = {}

    def make_compressor(self) -> Optional[AdaptiveTopC]:
        """Sec. IV's adaptive Top-k on the worker (compressors.AdaptiveTopC); None: dense pushes."""
        return None if self.params.cr is None else AdaptiveTopC(self.params.cr, self.params.delta)

    def server_on_push(self, server: ServerState, worker: str, payload: Tensors, base_version: int) -> list[str]:
        self._samples[worker] = server.push_meta.batch_size or 1
        # a compressed push may leave whole tensors out: they count as zero in the weighted sum
        return super().server_on_push(server, worker, sparse.densify(payload, server.shapes(), fill_missing=True),
                                      base_version)

    def aggregate(self, server: ServerState) -> tuple[Tensors, float]:
        workers = sorted(self._pending)
        samples = {w: self._samples.get(w, 1) for w in workers}
        total = sum(samples.values())
        weights = [samples[w] / total if self.params.weighted else 1 / len(workers) for w in workers]  # Eq. 4a
        out = average([self._pending[w] for w in workers], weights)  # Eq. 4b
        lr = server.lr
        if self.params.lr_scaling:  # Eq. 4c
            lr = server.lr * total / (self.params.base_batch * server.n_workers)
        return out, lr
