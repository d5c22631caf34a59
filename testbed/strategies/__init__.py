"""Training algorithms as pluggable strategies, one file each (see base.py)."""

from __future__ import annotations

from testbed.strategies.adacomp import AdaComp
from testbed.strategies.adsp import ADSP
from testbed.strategies.ako import Ako
from testbed.strategies.asgd import ASGD
from testbed.strategies.base import ServerState, Strategy, StrategyError, WorkerContext
from testbed.strategies.bsp import BSP
from testbed.strategies.comp_asgd import CompASGD
from testbed.strategies.dlion import DLion
from testbed.strategies.gaia import Gaia
from testbed.strategies.local_sgd import LocalSGD
from testbed.strategies.scadles import ScaDLES
from testbed.strategies.selsync import SelSync
from testbed.strategies.ssp import SSP

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
