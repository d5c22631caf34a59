"""Teardown always runs, whatever fails before it; a full disk is said, not ignored."""
import errno
import time

import pytest

from testbed.plan import parse_scenario
from testbed.records import metrics


class FullDiskRuntime:
    """Stopping the nodes and sampling counters fail as on a full disk; teardown is recorded."""

    def __init__(self):
        self.calls = []

    def stop_processes(self, grace):
        self.calls.append("stop")
        raise OSError(errno.ENOSPC, "No space left on device")

    def counters(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def teardown(self):
        self.calls.append("teardown")
        return []


def test_teardown_runs_whatever_fails_before_it(tmp_path):
    from testbed.run.runner import Run

    run = object.__new__(Run)  # the run's state as bring-up left it, without a real cluster
    said = []
    rt = FullDiskRuntime()
    metrics.init_tables(tmp_path)
    sc = parse_scenario({"runtime": "netns"})
    run.__dict__.update(sc=sc, world=sc, dilation=1.0, say=said.append, timeline=None, stop_event=None,
                        runtime=rt, spec=object(), run_dir=tmp_path, t0=time.time(), t_invoked=time.time(),
                        status="completed", reason="steps", last_counters={}, runtime_name="netns",
                        run_id="abcdef", state=None, relay=None, hub=None, _tensorboard=None)
    summary = run.tear_down()
    assert rt.calls == ["stop", "teardown"]  # the cluster is removed after the failures
    assert summary["status"] == "failed" and "stopping the nodes failed" in summary["reason"]
    assert any("No space left on device" in s for s in said)
    assert (tmp_path / "summary.json").exists()


def test_a_short_write_is_an_error_not_a_silent_half_line(tmp_path, monkeypatch):
    log = metrics.open_table(tmp_path, "events.csv")
    monkeypatch.setattr(metrics.os, "write", lambda fd, data: len(data) // 2)
    with pytest.raises(OSError) as e:
        log.write(time=1.0, target="w0", action="kill", detail="x")
    assert e.value.errno == errno.ENOSPC and "events.csv" in str(e.value)
    log.close()
