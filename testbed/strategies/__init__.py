"""Training algorithms as pluggable strategies, one file each (see base.py)."""

from __future__ import annotations

from .adacomp import AdaComp
from .adsp import ADSP
from .ako import Ako
from .asgd import ASGD
from .base import ServerState, Strategy, StrategyError, WorkerContext
from .bsp import BSP
from .comp_asgd import CompASGD
from .dlion import DLion
from .gaia import Gaia
from .local_sgd import LocalSGD
from .scadles import ScaDLES
from .selsync import SelSync
from .ssp import SSP

STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (BSP, ASGD, SSP, LocalSGD, CompASGD, AdaComp, ScaDLES, SelSync, ADSP,
                                                          DLion, Gaia, Ako)}


def get_strategy_class(name: str) -> type[Strategy]:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise StrategyError(f"unknown algorithm '{name}' (known: {', '.join(sorted(STRATEGIES))})") from None


def make_strategy(name: str, params: dict | None = None, seed: int = 0) -> Strategy:
    strategy = get_strategy_class(name)(params)
    strategy.seed = seed  # the run's seed, for strategies that draw at random (PS and workers alike)
    return strategy


__all__ = ["STRATEGIES", "Strategy", "StrategyError", "ServerState", "WorkerContext", "get_strategy_class", "make_strategy"]
