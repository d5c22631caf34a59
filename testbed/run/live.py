"""`edgebed link/cpu/stress/kill/restart/pause/resume`: change a running cluster from the shell.

The request goes to the run's runner as a file in RUN/.control/, and the runner applies it by
the same code path as the scenario's timeline (timeline.py), recording it in events.csv.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import yaml

from testbed.errors import BadInput
from testbed.kernel.files import replace_text
from testbed.plan import parse_scenario
from testbed.records.columns import CONTROL_DIR
from testbed.runtimes.state import known_runs, runner_alive
from testbed.scenario.schema import ScenarioError, resolve_target


class ControlError(BadInput, RuntimeError):
    pass


def running_run(run_id: Optional[str]):
    """The RunState of the run to act on: `run_id`, or the only one whose runner is alive."""
    live = {rid: st for rid, st in known_runs().items() if st is not None and runner_alive(st)}
    if run_id is not None:
        if run_id not in live:
            raise ControlError(f"no running run {run_id} (running: {', '.join(sorted(live)) or 'none'})")
        return live[run_id]
    if not live:
        raise ControlError("no edgebed run is up on this machine")
    if len(live) > 1:
        raise ControlError(f"several runs are up ({', '.join(sorted(live))}): say which with --run")
    return next(iter(live.values()))


def request(target: str, action: str, fields: dict, run_id: Optional[str] = None, wait: float = 5.0) -> list[str]:
    """Validate the change against the run's scenario, hand it to the runner, and return the
    events.csv details of its application (one per node of the target)."""
    st = running_run(run_id)
    run_dir = Path(st.run_dir)
    data = yaml.safe_load((run_dir / "scenario.yaml").read_text())
    event = {"at": 0, "target": target, "action": action, **{k: v for k, v in fields.items() if v is not None}}
    try:
        sc = parse_scenario({**data, "events": [event]})
    except ScenarioError as e:
        raise ControlError("\n".join(line.replace("events[0]", action) for line in e.lines)) from None
    ev = sc.events[0]
    nodes = resolve_target(sc, target)
    control = run_dir / CONTROL_DIR
    control.mkdir(exist_ok=True)
    rid = f"{time.time():.6f}-{os.getpid()}"
    for i, node in enumerate(nodes):
        request = {"id": f"{rid}-{i}", "node": node, "action": action, "fields": ev.change_fields()}
        replace_text(control / f"{rid}-{i}.json", json.dumps(request))  # the runner never reads half a request
    deadline = time.time() + wait
    done: list[str] = []
    while time.time() < deadline and len(done) < len(nodes):
        done = [line for line in (run_dir / "events.csv").read_text().splitlines() if rid in line]
        time.sleep(0.05)
    if len(done) < len(nodes):
        raise ControlError(f"the runner of {st.run_id} did not apply it within {wait:g} s")
    return done
