"""A benchmark stopped by SIGTERM (`timeout`, a cancelled CI job) tears its cluster down as
`edgebed up` does (run/interrupts.py, bench/harness.py's Bench): nothing of it is left."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import REPO, edgebed_cmd, needs_root, our_netns, our_processes

# A benchmark's cluster on a runtime that makes nothing real: SIGTERM arrives while the runtime
# opens, while the cluster is made, or inside the `with` block.
CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    from testbed.bench import harness
    from testbed.run.interrupts import Interrupted
    from testbed.runtimes.state import cleanup_run

    WHEN = sys.argv[1]

    def term(at):
        if at == WHEN:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
            print("not interrupted")

    class Fake:
        def __init__(self, state):
            self.state = state
        @classmethod
        def available(cls):
            return None
        @classmethod
        def open(cls, state, say):
            term("open")
            return cls(state)
        def bench_placement(self):
            return None
        def placer(self, sc):
            return None
        def set_preload(self, modules):
            pass
        def create(self, spec):
            term("create")
        def make_stop_event(self):
            return threading.Event()
        def start_idle(self, stop):
            pass
        def teardown(self):
            print("teardown")
            return cleanup_run(self.state.run_id, self.state, stop_runner=False)

    harness.runtime_class = lambda name: Fake
    try:
        with harness.Bench({}, "netns") as (rt, spec):
            term("inside")
            try:  # a library's broad except (pyroute2 decodes an attribute under one)
                term("in a library")
            except Exception:
                print("swallowed by the library")
    except Interrupted as e:
        print("interrupted", e)
    print("default handler again", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    print("state files", sorted(os.listdir(os.environ["EDGEBED_STATE_DIR"])))
""")


@pytest.mark.parametrize("when", ["open", "inside", "in a library"])
def test_sigterm_stops_a_bench_like_ctrl_c_and_removes_its_run(tmp_path, when):
    env = {**os.environ, "EDGEBED_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run([sys.executable, "-c", CHILD, when], capture_output=True, text=True, timeout=60, env=env,
                       cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr  # was -15: killed, its run left for `edgebed down`
    lines = r.stdout.splitlines()
    assert "interrupted SIGTERM" in lines and "not interrupted" not in lines
    assert "swallowed by the library" not in lines
    assert ("teardown" in lines) == (when != "open")  # a runtime that never opened has nothing to tear down
    assert "default handler again True" in lines and "state files []" in lines


@needs_root
@pytest.mark.root
def test_sigterm_to_edgebed_bench_trace_tears_its_namespaces_down(tmp_path):
    from testbed.runtimes.state import STATE_DIR

    p = subprocess.Popen(edgebed_cmd() + ["bench", "trace", "--seconds", "20", "--repetitions", "1",
                                          "--out", str(tmp_path / "results")],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_id, deadline = None, time.time() + 90
    while time.time() < deadline and p.poll() is None:
        for f in STATE_DIR.glob("*.json") if STATE_DIR.is_dir() else []:
            try:
                st = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if st.get("runner_pid") == p.pid:
                run_id = st["run_id"]
        if run_id and len([n for n in our_netns() if run_id in n]) >= 2:  # its nodes are up
            break
        time.sleep(0.2)
    else:
        p.kill()
        pytest.fail(f"the bench's namespaces did not come up: {p.communicate()[0][-2000:]}")
    time.sleep(1.0)  # inside its measurement
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=90)
    assert p.returncode == 130, out[-2000:]
    assert "interrupted (SIGTERM)" in out
    assert [n for n in our_netns() if run_id in n] == []
    assert not (STATE_DIR / f"{run_id}.json").exists()
    assert [line for line in our_processes() if run_id in line] == []
