"""edgebed for scripts, notebooks and the programs of command workloads: `import edgebed`.

    base = edgebed.scenario("scenarios/smoke.yaml", {"stop.seconds": 30})
    result = edgebed.run(edgebed.vary(base, {"algorithm.name": "asgd"}))
    result.steps, result.evals, result.traffic          # pandas DataFrames
    table = edgebed.sweep(base, "workload.lr", [0.01, 0.05])    # a row per run: value, run_dir, summary
    records = edgebed.load("runs/...")                           # any run's records, as `edgebed plot` reads them

    edgebed.report(step=i, accuracy=acc, loss=loss)     # inside a command workload's program

The implementation is testbed.run.api and testbed.node.report (the package is `testbed/`; this
name is what users type). Names load when first used: a program that only reports imports little.
"""

from testbed.node.report import report

_LAZY = {"RunResult": "testbed.run.api", "run": "testbed.run.api", "scenario": "testbed.run.api",
         "sweep": "testbed.run.api", "vary": "testbed.run.api", "Scenario": "testbed.scenario.schema",
         "ScenarioError": "testbed.scenario.schema", "load": "testbed.records.reader"}


def __getattr__(name: str):
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module 'edgebed' has no attribute '{name}'")
    return getattr(importlib.import_module(_LAZY[name]), "load_run" if name == "load" else name)


__all__ = ["report", *_LAZY]
