"""The runner's parts without a cluster: the live-ops object's one dispatch table for the
timeline's actions, the runner's side of the timeline (kill bookkeeping, restart), and the
monitor's decisions (a dead worker, a killed stream node, the PS's stop reason)."""
import signal
import time
from types import SimpleNamespace

import pytest

from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.records import metrics
from testbed.run.events import Events
from testbed.run.monitor import LiveState, Monitor, Sampler
from testbed.run.timeline import Change
from testbed.runtimes.live import LiveOps


class RecordingOps(LiveOps):
    """Each live operation says what it was asked."""

    def set_link(self, node, direction, fields):
        return f"link {node} {direction} {sorted(fields.items())}"

    def set_cpus(self, node, cpus):
        return f"cpu {node} {cpus}"

    def set_stress(self, node, load):
        return f"stress {node} {load}"

    def freeze(self, node, frozen):
        return f"freeze {node} {frozen}"

    def partition(self, node, peers, cut):
        return f"partition {node} {peers} {cut}"

    def kill_node(self, node):
        return f"kill {node}"


@pytest.mark.parametrize("action,fields,said", [
    ("link", {"direction": "up", "rate": 2e6}, "link w0 up [('rate', 2000000.0)]"),
    ("cpu", {"cpus": 0.5}, "cpu w0 0.5"),
    ("stress", {"load": 0.25}, "stress w0 0.25"),
    ("pause", {}, "freeze w0 True"),
    ("resume", {}, "freeze w0 False"),
    ("partition", {"peers": ["ps"]}, "partition w0 ['ps'] True"),
    ("heal", {}, "partition w0 [] False"),
    ("kill", {}, "kill w0"),
])
def test_each_timeline_action_is_one_live_operation(action, fields, said):
    assert RecordingOps().apply_change(action, "w0", fields) == said


def test_an_action_no_runtime_makes_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown action restart"):
        RecordingOps().apply_change("restart", "w0", {})  # the runner's own: it starts a role


class FakeProc:
    def __init__(self, alive=True, exitcode=None):
        self.alive, self.exitcode, self.joined = alive, exitcode, []

    def is_alive(self):
        return self.alive

    def join(self, timeout=None):
        self.joined.append(timeout)


def _spec(data=None):
    sc = parse_scenario(data or {"workers": [{"count": 2}]})
    return sc, build_cluster(sc, "abcdef")


def test_a_kill_is_marked_on_purpose_and_a_restart_starts_the_role_again(tmp_path):
    sc, spec = _spec()
    ops = RecordingOps()
    started, live = [], LiveState()
    procs = {"w0": FakeProc(alive=True), "w1": FakeProc(alive=False, exitcode=-9)}
    events = Events(ops, spec, procs, started.append, live, tmp_path, say=lambda s: None)
    assert events.apply(Change(1.0, None, "w1", "kill")) == "kill w1"
    assert live.killed == {"w1"}  # the monitor does not take it for a crash
    assert events.apply(Change(2.0, None, "w0", "restart")) == "kill w0; started again"
    assert procs["w0"].joined == [5] and [n.name for n in started] == ["w0"] and live.killed == {"w1"}
    assert events.apply(Change(3.0, None, "w1", "restart")) == "started again"  # dead already: nothing to kill
    assert [n.name for n in started] == ["w0", "w1"] and live.killed == set()


def test_applied_changes_are_recorded_in_events_csv(tmp_path):
    sc, spec = _spec()
    metrics.init_tables(tmp_path)
    said = []
    events = Events(SimpleNamespace(hub=None), spec, {}, lambda n: None, LiveState(), tmp_path, said.append)
    tl = events.start(sc, time.time())
    events.record(Change(None, 100, "w0", "cpu", {"cpus": 0.5}, "events[0]"), 12.5, "cpu quota 0.5 cores")
    tl.stop()
    lines = (tmp_path / "events.csv").read_text().splitlines()
    assert "at_step 100; cpus=0.5 -> cpu quota 0.5 cores" in lines[-1] and ",w0,cpu," in lines[-1]
    assert said == ["[   12.5s] event cpu w0: cpu quota 0.5 cores"]


def _monitor(tmp_path, procs, live=None, sc_data=None):
    sc, spec = _spec(sc_data)
    metrics.init_tables(tmp_path)
    stop = SimpleNamespace(is_set=False)
    stop.set = lambda: setattr(stop, "is_set", True)
    sampler = Sampler(SimpleNamespace(counters=lambda: {}, wan_counters=lambda: {}, usage=lambda: {}), tmp_path,
                      time.time(), {})
    said = []
    m = Monitor(sc, spec, procs, stop, sampler, live or LiveState(), said.append, progress_every=3600.0)
    return m, stop, said


def test_a_worker_that_died_stops_the_run_with_how_it_ended(tmp_path):
    procs = {"ps": FakeProc(), "w0": FakeProc(alive=False, exitcode=-signal.SIGKILL), "w1": FakeProc()}
    m, stop, _ = _monitor(tmp_path, procs)
    status, reason = m.watch()
    assert status == "failed" and reason.startswith("node(s) w0 (killed by SIGKILL: out of memory?")
    assert reason.endswith("exited with an error") and stop.is_set and procs["ps"].joined == [30]


def test_a_worker_killed_on_purpose_is_no_failure_but_a_killed_broker_is(tmp_path):
    live = LiveState(killed={"w0"})
    procs = {"ps": FakeProc(), "w0": FakeProc(alive=False, exitcode=-9), "w1": FakeProc()}
    m, stop, _ = _monitor(tmp_path, procs, live)
    assert m._check(time.time(), time.time() + 60) is None and not stop.is_set
    live.killed.add("broker")
    assert m._check(time.time(), time.time() + 60) == (
        "failed", "the stream broker was killed (a timeline event): the workers' streams end with it")
    assert m._check(time.time() + 120, time.time()) is not None and stop.is_set


def test_a_worker_restarted_while_the_monitor_looks_is_no_failure(tmp_path):
    """The timeline's restart puts the new process in, then takes the node out of `killed`; a
    monitor that read the killed process before and `killed` after failed the run (CI)."""
    live = LiveState(killed={"w0"})

    class RestartedWhileRead(dict):  # the timeline's thread restarts w0 as the monitor reads the nodes
        def _restart(self):
            dict.__setitem__(self, "w0", FakeProc())
            live.killed.discard("w0")

        def items(self):
            seen = list(dict.items(self))
            self._restart()
            return seen

        def __iter__(self):
            seen = list(dict.__iter__(self))
            self._restart()
            return iter(seen)

    procs = RestartedWhileRead(ps=FakeProc(), w0=FakeProc(alive=False, exitcode=-9), w1=FakeProc())
    m, stop, _ = _monitor(tmp_path, procs, live)
    assert m._check(time.time(), time.time() + 60) is None and not stop.is_set

def test_the_runner_deadline_stops_the_run(tmp_path):
    m, stop, _ = _monitor(tmp_path, {"ps": FakeProc(), "w0": FakeProc(), "w1": FakeProc()})
    assert m._check(time.time() + 120, time.time()) == ("stopped", "runner deadline passed") and stop.is_set


def test_the_ps_stop_reason_decides_and_the_records_give_the_global_step(tmp_path):
    procs = {"ps": FakeProc(alive=False, exitcode=0)}
    live = LiveState()
    m, _, said = _monitor(tmp_path, procs, live)
    steps = metrics.open_table(tmp_path, "steps.csv")
    steps.write(time=1.0, node="w0", step=7, loss=0.5, model_version=42)
    steps.close()
    (tmp_path / "ps.json").write_text('{"stop_reason": "target_accuracy"}')
    assert m.watch() == ("completed", "target_accuracy")
    assert live.step == 42 and m.worker_steps == {"w0": 7}
    assert "worker steps      7  loss 0.500  acc -  PS in" in m._progress(time.time())
    (tmp_path / "ps.json").write_text('{"stop_reason": "worker_loss"}')
    assert m._ps_ended(0) == ("stopped", "worker_loss")
    live.killed.add("ps")
    assert m._ps_ended(-9)[0] == "failed" and "killed (a timeline event)" in m._ps_ended(-9)[1]
