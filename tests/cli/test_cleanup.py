"""`edgebed down` acts only on what is edgebed's and dead, unless told otherwise."""
import os
import signal
import subprocess
import time

import pytest
from typer.testing import CliRunner

from testbed.runtimes import state

from helpers import needs_root


class Orphan:
    """A process that is not this one's child (as a run's runner is not `edgebed down`'s)."""

    def __init__(self):
        out = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
        self.pid = int(out.stdout)

    def alive(self) -> bool:
        return state.process_start(self.pid) is not None

    def gone_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.alive()


@pytest.fixture
def sleeper():
    p = Orphan()
    yield p
    try:
        os.kill(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A machine of this test's own: no namespace, cgroup or container of a real run is seen
    (a bare `down` here once removed an experiment running beside the tests)."""
    (tmp_path / "netns").mkdir()
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    monkeypatch.setattr(state, "NETNS_DIR", tmp_path / "netns")
    monkeypatch.setattr(state.cgroups, "list_runs", lambda: [])
    monkeypatch.setattr(state, "SWEEPERS", {})
    monkeypatch.setattr("testbed.runtimes.load_backends", lambda: None)
    return tmp_path


def test_a_runner_is_known_by_its_pid_and_its_start(sleeper, state_dir):
    mine = state.RunState(run_id="aaaaaa", runner_pid=os.getpid(), run_dir="/x", scenario="s")
    assert mine.runner_start == state.process_start(os.getpid()) and state.runner_alive(mine)
    recycled = state.RunState(run_id="bbbbbb", runner_pid=sleeper.pid, run_dir="/x", scenario="s",
                              runner_start=state.process_start(sleeper.pid) - 1)
    assert not state.runner_alive(recycled)  # the pid now names another process
    gone = state.RunState(run_id="cccccc", runner_pid=2 ** 22 + 7, run_dir="/x", scenario="s")
    assert gone.runner_start is None and not state.runner_alive(gone)


@needs_root
def test_cleanup_never_signals_a_process_that_merely_has_the_pid(sleeper, state_dir):
    st = state.RunState(run_id="dddddd", runner_pid=sleeper.pid, run_dir="/x", scenario="s",
                        runner_start=state.process_start(sleeper.pid) + 5)
    st.save()
    assert state.cleanup_run("dddddd", st) == []
    assert sleeper.alive()  # still running: not SIGTERMed
    assert not (state_dir / "dddddd.json").exists()


@needs_root
def test_a_bare_down_leaves_live_runs_and_all_stops_them(sleeper, state_dir):
    from testbed.cli import app

    live = state.RunState(run_id="eeeeee", runner_pid=sleeper.pid, run_dir="/x", scenario="s")
    crashed = state.RunState(run_id="ffffff", runner_pid=2 ** 22 + 9, run_dir="/x", scenario="s")
    live.save()
    crashed.save()
    out = CliRunner().invoke(app, ["down"]).output
    assert "eeeeee: still running" in out and "ffffff: removed" in out
    assert sleeper.alive() and (state_dir / "eeeeee.json").exists()
    out = CliRunner().invoke(app, ["down", "--all"]).output
    assert "eeeeee: removed" in out
    assert sleeper.gone_within(5) and not (state_dir / "eeeeee.json").exists()


@needs_root
def test_a_bare_down_leaves_a_run_with_live_processes_and_no_state_file(state_dir, monkeypatch):
    from testbed.cli import app

    (state_dir / "netns" / "eb-abcdef-w0").touch()  # found by its namespace only
    monkeypatch.setattr(state, "run_processes", lambda rid: {4242} if rid == "abcdef" else set())
    out = CliRunner().invoke(app, ["down"]).output
    assert "abcdef: processes run in it and no state file here says whose" in out
    assert (state_dir / "netns" / "eb-abcdef-w0").exists()


@needs_root
@pytest.mark.parametrize("start", ["absent", None])
def test_down_never_signals_the_pid_of_a_state_file_without_its_runners_start(sleeper, state_dir, start):
    """A state file that names a live pid but not when its runner started (planted, or from an
    edgebed before the field) cannot tell the runner from whatever has that pid: down leaves it."""
    import json

    from testbed.cli import app

    data = {"run_id": "abcabc", "runner_pid": sleeper.pid, "run_dir": "/x", "scenario": "s"}
    (state_dir / "abcabc.json").write_text(json.dumps(data if start == "absent" else {**data, "runner_start": start}))
    assert not state.runner_alive(state.RunState.load(state_dir / "abcabc.json"))
    out = CliRunner().invoke(app, ["down", "abcabc"]).output
    assert "abcabc: removed" in out
    assert not sleeper.gone_within(1)  # neither SIGTERMed nor SIGKILLed
