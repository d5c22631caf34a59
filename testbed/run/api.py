"""edgebed's Python API, in Mininet's spirit: build a scenario (the YAML schema's own objects,
validated the same way), run it, read its records as DataFrames, and sweep in a plain loop.
`edgebed up` is this module's `run`.

    from edgebed import scenario, vary, run      # testbed.run.api

    base = scenario("scenarios/smoke.yaml", {"stop.seconds": 30})   # a file, or a dict
    for c in (0.001, 0.01):
        result = run(vary(base, {"algorithm": {"name": "adacomp", "params": {"c": c}}}))
        print(c, result.summary["best_accuracy"], result.steps.payload_bytes.mean())

A run tears down everything it made when it ends, fails or is interrupted, as `edgebed up` does.
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import pandas as pd

from testbed.errors import RunFailed
from testbed.plan import load_scenario, parse_scenario
from testbed.records.reader import RunRecords, load_run
from testbed.scenario.scenario_file import scenario_data
from testbed.scenario.schema import Scenario

Changes = Optional[dict[str, Any]]


def _set(data: dict, key: str, value: Any) -> None:
    """data[a][b][c] = value for key "a.b.c" (dicts made on the way); a dict value merges."""
    *path, last = key.split(".")
    for part in path:
        data = data.setdefault(part, {})
        if not isinstance(data, dict):
            raise ValueError(f"{key}: '{part}' is not a mapping in this scenario")
    if isinstance(value, dict) and isinstance(data.get(last), dict):
        for k, v in value.items():
            _set(data[last], k, v)
    else:
        data[last] = copy.deepcopy(value)


def _apply(data: dict, changes: Changes) -> dict:
    out = copy.deepcopy(data)
    for key, value in (changes or {}).items():
        _set(out, key, value)
    return out


def scenario(source: Union[str, Path, dict, Scenario], changes: Changes = None,
             trace_dirs: Iterable[Path] = ()) -> Scenario:
    """A validated scenario from a YAML file, a dict or another scenario, with `changes` applied
    ({"stop.seconds": 30} or {"stop": {"seconds": 30}}: dotted keys and nested dicts both merge).
    Bad input raises ScenarioError, one line per field, as `edgebed validate` prints them."""
    if isinstance(source, Scenario):
        return vary(source, changes)
    if isinstance(source, dict):
        return parse_scenario(_apply(source, changes))
    base = load_scenario(Path(source), trace_dirs=list(trace_dirs))
    return vary(base, changes) if changes else base


def vary(sc: Scenario, changes: Changes) -> Scenario:
    """`sc` with `changes` applied (see `scenario`), validated again."""
    return parse_scenario(_apply(scenario_data(sc), changes))


@dataclass
class RunResult:
    """A finished run: its folder, its summary, and its records as DataFrames (read when asked)."""

    run_dir: Path
    summary: dict

    @functools.cached_property
    def records(self) -> RunRecords:
        return load_run(self.run_dir)

    def __getattr__(self, name: str):  # steps, evals, traffic, events, meta, scenario: the records'
        if name.startswith("__") or name == "records":
            raise AttributeError(name)
        return getattr(self.records, name)

    def table(self, name: str) -> pd.DataFrame:
        """Any other record of the run by file name (e.g. "buffer.csv", "peers.csv")."""
        path = self.run_dir / name
        return pd.read_csv(path) if path.exists() and path.stat().st_size else pd.DataFrame()


def run(sc: Scenario, out: Union[str, Path, None] = None, *, say: Callable[[str], None] = lambda s: None,
        scenario_path: str = "<api>", progress_every: float = 2.0,
        tensorboard: Union[str, Path, None] = None, isolated: Optional[bool] = None, bars: bool = False) -> RunResult:
    """Run `sc` end to end (bring-up, training, teardown) into `out` (default runs/<name>-<time>);
    its summary and records. A failed run raises, after its teardown (its records stay in `out`).
    `tensorboard`: a folder for TensorBoard scalars written while the run goes. `isolated`: in a
    process of its own (`edgebed up`); by default only where an event loop runs in this thread
    (a notebook's kernel), whose loop pyroute2's calls and the runner's signal handlers cannot share.
    `bars`: a fleet's bring-up and teardown drawn as progress bars (on a terminal), else told to `say`."""
    from testbed.run.runner import default_run_dir, run as run_scenario

    run_dir = Path(out) if out is not None else default_run_dir(sc)
    if isolated or (isolated is None and _event_loop_running()):
        return _run_isolated(sc, run_dir, say, tensorboard)
    summary = run_scenario(sc, scenario_path, run_dir, say=say, progress_every=progress_every,
                           tensorboard=Path(tensorboard) if tensorboard is not None else None, bars=bars)
    return RunResult(Path(summary.get("run_dir", run_dir)), summary)


def _event_loop_running() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _run_isolated(sc: Scenario, run_dir: Path, say: Callable[[str], None],
                  tensorboard: Union[str, Path, None]) -> RunResult:
    """`edgebed up` of `sc` in a child process; its output lines go to `say`."""
    import json
    import subprocess
    import sys
    import tempfile

    from testbed.errors import EXIT_STOPPED
    from testbed.scenario.schema import scenario_to_yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"{sc.name}-", delete=False) as f:
        f.write(scenario_to_yaml(sc))
    cmd = [sys.executable, "-m", "testbed.cli", "up", f.name, "--out", str(run_dir)]
    cmd += ["--tensorboard", str(tensorboard)] if tensorboard is not None else []
    try:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
            lines = []
            for line in p.stdout:
                lines.append(line.rstrip())
                say(line.rstrip())
    finally:
        Path(f.name).unlink(missing_ok=True)
    summary_file = run_dir / "summary.json"
    if p.returncode not in (0, EXIT_STOPPED) or not summary_file.exists():
        raise RunFailed(f"edgebed up failed ({p.returncode}): " + "\n".join(lines[-20:]))
    summary = json.loads(summary_file.read_text())
    return RunResult(Path(summary.get("run_dir", run_dir)), summary)


def sweep(sc: Scenario, key: str, values: Iterable[Any], out: Union[str, Path, None] = None,
          say: Callable[[str], None] = lambda s: None) -> pd.DataFrame:
    """One run per value of `key` (dotted, e.g. "algorithm.params.c"), in order: a row each with
    the value, the run's folder and its summary's fields."""
    out_dir = Path(out) if out is not None else Path("runs") / f"{sc.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    rows = []
    for i, value in enumerate(values):
        result = run(vary(sc, {key: value}), out_dir / f"{i:02d}-{key.split('.')[-1]}-{value}", say=say)
        rows.append({key: value, "run_dir": str(result.run_dir), **result.summary})
    return pd.DataFrame(rows)
