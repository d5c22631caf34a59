"""What every fidelity benchmark shares: a small cluster brought up on a runtime (Bench), a
saturating transfer through it, a scenario run end to end for its records, and the JSON result."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from testbed.errors import HostCannot
from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.plan.placement import place
from testbed.run.flows import Flow, measure_flows
from testbed.run.interrupts import interrupting_signals, shielded_teardown
from testbed.runtimes import runtime_class
from testbed.runtimes.state import RunState


def save_result(out: dict, out_dir: Path | None, name: str, say: Callable[[str], None]) -> dict:
    """Write a benchmark's result as JSON (benchmarks/report.py turns these into tables)."""
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / name
        path.write_text(json.dumps(out, indent=1))
        say(f"wrote {path}")
    return out


def run_child(args: list[str], grace: float = 120.0) -> subprocess.CompletedProcess:
    """subprocess.run(args) with its output captured as text, except when the benchmark is
    stopped meanwhile (Ctrl-C, SIGTERM): the child (an `edgebed up`) gets SIGTERM and `grace`
    seconds to tear its run down, where subprocess.run would SIGKILL it and leave the run behind."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            out, err = p.communicate()
        except BaseException:
            with shielded_teardown():
                p.terminate()
                try:
                    p.communicate(timeout=grace)
                except subprocess.TimeoutExpired:
                    p.kill()
            raise
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def run_for_records(sc, label: str, *files: str) -> tuple[dict, dict]:
    """Run scenario `sc` end to end in a scratch directory: its summary and the records named
    (e.g. "steps.csv") as DataFrames; the directory is removed, whatever happens."""
    import shutil
    import tempfile

    import pandas as pd

    from testbed.run.runner import run

    run_dir = Path(tempfile.mkdtemp(prefix=f"edgebed-{label}-")) / "run"
    try:
        summary = run(sc, label, run_dir, say=lambda s: None)
        return summary, {f: pd.read_csv(run_dir / f) for f in files}
    finally:
        shutil.rmtree(run_dir.parent, ignore_errors=True)


def run_from_repo(sc, label: str, out: Path | None, read: Callable) -> tuple[dict, object]:
    """Run `sc` from the repository's root (a command workload names its programs relative to
    it) into `out`, or a scratch directory removed after `read(result)` has taken what it needs:
    the run's summary and what `read` returned."""
    import shutil
    import tempfile

    from testbed.run import api

    run_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix=f"edgebed-{label}-")) / "run"
    cwd = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])
    try:
        result = api.run(sc, run_dir)
        return result.summary, read(result)
    finally:
        os.chdir(cwd)
        if out is None:
            shutil.rmtree(run_dir.parent, ignore_errors=True)


class Bench:
    """A small cluster (workers w0.. with the profile under test, an unshaped ps) on either runtime.

    From its making to the end of its `with` block, SIGTERM and SIGHUP stop the benchmark as
    Ctrl-C does, and as they stop `edgebed up` (run/interrupts.py): the exception leaves the
    block and the cluster is torn down, Ctrl-C ignored meanwhile."""

    def __init__(self, profile: dict, runtime: str = "netns", workers: int = 1, scenario: dict | None = None,
                 preload: tuple[str, ...] = ()):
        import tempfile

        self.run_id = secrets.token_hex(3)
        self.rt = None
        self.state: RunState | None = None
        self.problems: list[str] = []
        self.scratch: Path | None = None
        self._signals = ExitStack()
        self._signals.enter_context(interrupting_signals())  # before anything exists that `down` would have to find
        try:
            self.scratch = Path(tempfile.mkdtemp(prefix=f"edgebed-bench-{self.run_id}-"))
            self._open(profile, runtime, workers, scenario, list(preload))
        except BaseException:  # refused, or interrupted on the way: nothing is left of it
            self._remove()
            raise

    def _open(self, profile: dict, runtime: str, workers: int, scenario: dict | None, preload: list[str]) -> None:
        sc = parse_scenario(scenario or {"name": "bench", "profiles": {"shaped": profile},
                                         "workers": [{"count": workers, "profile": "shaped"}]})
        self.state = RunState(run_id=self.run_id, runner_pid=os.getpid(), run_dir=str(self.scratch), scenario="bench",
                              runtime=runtime)
        self.state.save()
        self.runtime = runtime
        why = runtime_class(runtime).available()
        if why is not None:
            raise HostCannot(f"--runtime {runtime}: {why.why}")
        self.rt = runtime_class(runtime).open(self.state, lambda s: None)
        placement = None if sc.placement else self.rt.bench_placement()
        if placement:  # e.g. the measured paths cross hosts: ps on one, workers on another
            sc = sc.model_copy(update={"placement": placement})
        self.spec = place(build_cluster(sc, self.run_id), self.rt.placer(sc))
        self.rt.set_preload(preload)  # what its node processes find imported (netns: the forkserver's)
        self.stop = None
        self.box = None

    def __enter__(self):
        try:
            self.rt.create(self.spec)
            self.stop = self.rt.make_stop_event()
            self.rt.start_idle(self.stop)  # containers host the measuring jobs; namespaces need nothing
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self.rt, self.spec

    def result(self, name: str):
        """Where a measuring job in a node puts its result or flag (a mailbox slot: runtimes.control.mailbox)."""
        if self.box is None:
            self.box = self.rt.mailbox("bench")
        return self.box / name

    def __exit__(self, *exc) -> None:
        if self.stop is not None:
            self.stop.set()
        self._remove()

    def _remove(self) -> None:
        """Tear down what was made (the runtime's teardown, or the run's state alone when it never
        opened), then give the signals back."""
        import shutil

        from testbed.runtimes.state import cleanup_run

        try:
            with shielded_teardown():
                if self.rt is not None:
                    self.problems = self.rt.teardown()
                elif self.state is not None:  # saved, the runtime not opened: the state file goes
                    self.problems = cleanup_run(self.run_id, self.state, stop_runner=False)
                if self.scratch is not None:
                    shutil.rmtree(self.scratch, ignore_errors=True)
        finally:
            self._signals.close()


def measure_transfer(bench: "Bench", sender, receiver, seconds: float, flows: int, label: str,
              counter: Callable[[], int]) -> tuple[float, float]:
    """Saturate sender -> receiver with TCP (`flows` connections); (goodput, wire) bit/s over
    `seconds` after a second's warm-up."""
    rate, = measure_flows(bench.rt, bench.rt.mailbox("transfer"), [Flow(label, sender, receiver, counter, flows)],
                          window=seconds, warmup=1.0)
    return rate.goodput_bps, rate.wire_bps


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0
