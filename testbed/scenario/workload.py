"""What a scenario trains (model, data, an unmodified command instead), how it is synchronised
(algorithm) and when it stops."""

from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from testbed.scenario import units
from testbed.scenario.fields import MAX_SECONDS, VIRTUAL_TIME, StrictModel


class Injection(StrictModel):
    """Randomized data injection for non-IID data (ScaDLES Sec. IV-D, SelSync Sec. III-C): at
    every step a random ceil(alpha * N) of the workers send a beta fraction of their batch to
    every other worker, which trains on it beside its own."""

    alpha: float = Field(..., gt=0, le=1, description="fraction of the workers that share each step")
    beta: float = Field(..., gt=0, le=1, description="fraction of a sharing worker's batch it sends")
    local_batch: Union[int, Literal["eq3", "same"]] = Field(
        "eq3", description="own samples per step: SelSync Eq. 3's b/(1 + alpha*beta*N), the batch size, or a number")

    @field_validator("local_batch")
    @classmethod
    def _local_batch(cls, v):
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1")
        return v


# What a command workload's template may name (node.roles.command fills them in, and sets the
# environment variables torchrun and torch.distributed read: MASTER_ADDR, MASTER_PORT, RANK, ...).
COMMAND_PLACEHOLDERS = ("rank", "world_size", "node", "address", "master_addr", "master_port", "ps_addr",
                        "python", "home")  # python: the node's interpreter (torch, edgebed); home: its own folder


def command_problem(template: str) -> Optional[str]:
    """Why a command template cannot be filled in (an unknown {placeholder}, bad braces), or None."""
    import shlex

    try:
        filled = template.format(**{k: "x" for k in COMMAND_PLACEHOLDERS})
        if not shlex.split(filled):
            return "an empty command"
    except KeyError as e:
        return f"unknown placeholder {{{e.args[0]}}} (known: {', '.join(COMMAND_PLACEHOLDERS)})"
    except (ValueError, IndexError) as e:
        return f"cannot be filled in: {e}"
    return None


def _accepted_by(check: Callable[[str], Any], error: type[Exception], v: str) -> str:
    """`v` once `check` accepts it; its complaint (an `error`) as the ValueError pydantic reports."""
    try:
        check(v)
    except error as e:
        raise ValueError(str(e)) from None
    return v


class Workload(StrictModel):
    model: str = "adacomp_cnn"
    dataset: str = "mnist5k"
    partition: str = "iid"
    batch_size: int = Field(32, ge=1, le=65536)
    lr: float = Field(0.05, gt=0, le=100)
    momentum: float = Field(0.0, ge=0, lt=1)
    eval_interval: int = Field(20, ge=1, description="evaluate every N model updates at the PS")
    eval_seconds: Annotated[Optional[float], VIRTUAL_TIME] = Field(
        None, gt=0, le=3600, description="evaluate the latest model every T seconds of the run's time instead of "
        "every eval_interval versions")
    eval_samples: Optional[int] = Field(None, ge=1, description="cap on test samples per evaluation")
    test_size: Optional[int] = Field(None, ge=1, description="held-out test samples where edgebed splits the data")
    threads: Optional[int] = Field(None, ge=1, le=256, description="torch threads per node (default: ceil(cpus))")
    command: Optional[dict[Literal["ps", "worker", "evaluator"], str]] = Field(
        None, description="an unmodified program per role instead of edgebed's trainer (a command workload): "
        "placeholders {rank} {world_size} {node} {address} {master_addr} {master_port} {ps_addr} {python} {home}. "
        "The run completes when the evaluator's program ends well (a driver, such as `flwr run`), or without "
        "one, when every worker's has")
    eval_role: Literal["ps", "worker", "evaluator"] = Field(
        "evaluator", description="a command workload: the role whose program's `edgebed.report(step=..., "
        "accuracy=...)` goes to eval.csv (a ServerApp that evaluates on the ps: ps); the other nodes' "
        "evaluations are refused there (report.csv keeps every node's)")
    injection: Optional[Injection] = None
    train_fraction: Optional[float] = Field(None, gt=0, le=1, description="train on this share of the training set "
                                            "(a seeded subset, before partitioning; AdaComp's Table II)")

    @field_validator("command")
    @classmethod
    def _command(cls, v: Optional[dict]) -> Optional[dict]:
        for role, template in (v or {}).items():
            problem = command_problem(template)
            if problem:
                raise ValueError(f"{role}: {problem}")
        if v is not None and not ({"worker", "evaluator"} & set(v)):
            raise ValueError("needs a worker or an evaluator command: the run ends when they do")
        return v

    @model_validator(mode="after")
    def _eval_role(self) -> "Workload":
        if self.eval_role != "evaluator" and self.command is None:
            raise ValueError("eval_role applies to a command workload only (edgebed's evaluator writes eval.csv)")
        return self

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        from testbed.data.models import ModelError, model_factory

        return _accepted_by(model_factory, ModelError, v)

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, v: str) -> str:
        from testbed.data.datasets import DatasetError, validate_dataset_spec

        return _accepted_by(validate_dataset_spec, DatasetError, v)

    @field_validator("eval_seconds", mode="before")
    @classmethod
    def _eval_seconds(cls, v: Any) -> Optional[float]:
        return None if v is None else units.parse_duration(v, allow_zero=False)

    @field_validator("partition")
    @classmethod
    def _partition(cls, v: str) -> str:
        from testbed.data.partition import parse_partition

        parse_partition(v)  # ValueError names the problem
        return v


class Stop(StrictModel):
    steps: Optional[int] = Field(None, ge=1, le=10**9, description="model updates applied at the PS")
    seconds: Annotated[Optional[float], VIRTUAL_TIME] = None
    target_accuracy: Optional[float] = Field(None, gt=0, le=1)

    @field_validator("seconds", mode="before")
    @classmethod
    def _secs(cls, v: Any) -> Optional[float]:
        secs = None if v is None else units.parse_duration(v, allow_zero=False)
        if secs is not None and secs > MAX_SECONDS:
            raise ValueError(f"{secs:g}s is above the most edgebed takes here ({MAX_SECONDS:g}s)")
        return secs

    @model_validator(mode="after")
    def _some(self) -> "Stop":
        if self.steps is None and self.seconds is None and self.target_accuracy is None:
            self.steps = 200  # a file that says nothing still ends
        return self


class Algorithm(StrictModel):
    name: str = "bsp"
    params: dict[str, Any] = Field(default_factory=dict)
