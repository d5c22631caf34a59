"""edgebed for scripts and notebooks: `import edgebed`.

    base = edgebed.scenario("scenarios/smoke.yaml", {"stop.seconds": 30})
    result = edgebed.run(edgebed.vary(base, {"algorithm.name": "asgd"}))
    result.steps, result.evals, result.traffic          # pandas DataFrames
    table = edgebed.sweep(base, "workload.lr", [0.01, 0.05])    # a row per run: value, run_dir, summary
    records = edgebed.load("runs/...")                           # any run's records, as `edgebed plot` reads them

The implementation is testbed.run.api (the package is `testbed/`; this name is what users type).
"""

from testbed.records.reader import load_run as load
from testbed.run.api import RunResult, run, scenario, sweep, vary
from testbed.scenario.schema import Scenario, ScenarioError

__all__ = ["RunResult", "Scenario", "ScenarioError", "load", "run", "scenario", "sweep", "vary"]
