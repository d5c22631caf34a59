"""Training algorithms as pluggable strategies, one file each (see base.py).

Every algorithm, edgebed's own included, is found through testbed.plugins: a name registered in
the entry point group `edgebed.strategies` (pyproject.toml), or a plugin's import path.
"""

from __future__ import annotations

from testbed.strategies.base import Compressor, PushMeta, ServerState, Strategy, StrategyError, WorkerContext


def get_strategy_class(name: str) -> type[Strategy]:
    from testbed import plugins

    try:
        cls = plugins.load("algorithm", name)
    except plugins.PluginError as e:
        raise StrategyError(str(e)) from None
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise StrategyError(f"'{name}' is not a strategy (a subclass of testbed.strategies.Strategy)")
    return cls


def strategies() -> dict[str, type[Strategy]]:
    """Every registered algorithm by name (plugins' included)."""
    from testbed import plugins

    return {name: get_strategy_class(name) for name in sorted(plugins.registered("algorithm"))}


def make_strategy(name: str, params: dict | None = None, seed: int = 0) -> Strategy:
    strategy = get_strategy_class(name)(params)
    strategy.seed = seed  # the run's seed, for strategies that draw at random (PS and workers alike)
    return strategy


__all__ = ["Compressor", "PushMeta", "Strategy", "StrategyError", "ServerState", "WorkerContext", "get_strategy_class",
           "make_strategy", "strategies"]
