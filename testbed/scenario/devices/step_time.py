"""A device's training-step time as a function of the batch, and the roofline that gives an
accelerator's.

A CPU entry's step time is proportional to its FLOPs, so to its batch. An accelerator's is not:
a small model's step on a GPU is mostly a fixed cost (kernel launches, the optimizer's pass over
the parameters), and the rest is bounded by whichever of compute and memory traffic is slower
(the roofline: Williams, Waterman and Patterson, "Roofline: an insightful visual performance
model for multicore architectures", CACM 2009):

    step(s) = overhead + max(FLOPs(s) / (peak * efficiency), bytes(s) / bandwidth)

with FLOPs(s) = flops_per_sample * s (FlopCounterMode's count grows with the batch) and bytes(s)
the parameters' traffic, whatever the batch, plus the activations' traffic per sample.

`StepTime` is that function as plain numbers, so it crosses to a node as JSON and a paced node
(node/pacing.py) times a step of any batch. Stdlib only: the node imports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

FP32_BYTES = 4
# Passes over each parameter in a step: read in forward, read in backward (input gradient), its
# gradient written, then SGD reads weight and gradient and writes the weight.
PARAM_PASSES = 6
# Passes over each activation: written in forward, read in backward (saved for it), its gradient
# written and read.
ACTIVATION_PASSES = 4


@dataclass(frozen=True)
class StepCost:
    """What a training step of a model costs, per the calibration (node/calibrate.py) at `batch`."""

    flops: float  # forward + backward, FlopCounterMode's count
    batch: int
    params: int = 0  # trainable parameters
    activations: int = 0  # elements of every leaf module's output in the forward pass, whole batch

    def bytes_moved(self, samples: float) -> float:
        """Bytes a step of `samples` reads and writes at least (fp32, no cache reuse counted)."""
        per_sample = self.activations / self.batch if self.batch else 0.0
        return FP32_BYTES * (PARAM_PASSES * self.params + ACTIVATION_PASSES * per_sample * samples)


@dataclass(frozen=True)
class StepTime:
    """seconds(s) = overhead_s + max(compute_s_per_sample * s, memory_s + memory_s_per_sample * s)."""

    compute_s_per_sample: float
    overhead_s: float = 0.0
    memory_s: float = 0.0
    memory_s_per_sample: float = 0.0

    def seconds(self, samples: float) -> float:
        s = max(0.0, float(samples))
        return self.overhead_s + max(self.compute_s_per_sample * s, self.memory_s + self.memory_s_per_sample * s)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> Optional["StepTime"]:
        """Built again from `as_dict`; None for an empty or missing mapping."""
        if not d:
            return None
        return cls(**{k: float(d[k]) for k in ("compute_s_per_sample", "overhead_s", "memory_s",
                                                "memory_s_per_sample") if k in d})


def proportional(flops_per_sample: float, flops_per_second: float) -> StepTime:
    """A CPU entry's step: its FLOPs at its rate, nothing fixed."""
    return StepTime(compute_s_per_sample=flops_per_sample / flops_per_second)


def roofline(cost: StepCost, peak_flops: float, efficiency: float, bandwidth_bytes: float,
             overhead_s: float) -> StepTime:
    """An accelerator's step (the module's docstring): peak in FLOP/s, bandwidth in bytes/s."""
    per_sample = cost.flops / cost.batch
    return StepTime(compute_s_per_sample=per_sample / (peak_flops * efficiency), overhead_s=overhead_s,
                    memory_s=cost.bytes_moved(0) / bandwidth_bytes,
                    memory_s_per_sample=(cost.bytes_moved(1) - cost.bytes_moved(0)) / bandwidth_bytes)
