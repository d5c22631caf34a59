"""Everything edgebed makes is removed: after success, Ctrl-C, kill -9 + `edgebed down`; bad input starts nothing."""

import json
import os
import signal
import subprocess
import time

import pytest
import yaml
from helpers import edgebed_cmd, needs_root, our_netns, our_processes, run_up, start_up

pytestmark = [needs_root, pytest.mark.root, pytest.mark.serial]  # counts every namespace and process on the host

LONG = {
    "name": "lifecycle",
    "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 16, "eval_interval": 5},
    "stop": {"seconds": 120},
    "algorithm": {"name": "asgd"},
    "profiles": {"edge": {"cpus": 0.3, "bandwidth": "50mbit"}},
    "workers": [{"count": 2, "profile": "edge"}],
}

# the same, on two sites joined by a WAN link (switches, routers and WAN veths to remove too)
SITES = {**LONG, "profiles": {"edge": {"cpus": 0.3}, "lan": {"bandwidth": "200mbit"}},
         "sites": {"a": {"lan": "lan"}, "b": {"lan": "lan"}}, "wan": {"default": {"bandwidth": "20mbit"}},
         "workers": [{"count": 1, "profile": "edge", "site": "a"}, {"count": 1, "profile": "edge", "site": "b"}]}


def _docker_or_skip(runtime):
    if runtime == "docker":
        from testbed.runtimes.engine.client import docker_client

        if docker_client(timeout=3) is None:
            pytest.skip("no Docker engine answers (CI starts dockerd)")


def _containers(run_id):
    from testbed.runtimes.engine.client import docker_client

    c = docker_client(timeout=3)
    if c is None:
        return []
    return [x.name for x in c.containers.list(all=True, filters={"label": f"edgebed.run={run_id}"})]


def _nothing_left(run_id=None):
    from testbed.kernel import cgroups
    from testbed.runtimes.state import STATE_DIR

    ns = our_netns()
    cg = cgroups.list_runs()
    procs = our_processes()
    states = list(STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else []
    if run_id:
        ns = [n for n in ns if run_id in n]
        cg = {c for c in cg if c == run_id}
        states = [s for s in states if run_id in s.name]
    return ns, cg, procs, states


def _root_links(run_id):
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return [n for n in (link.get_attr("IFLA_IFNAME") for link in ipr.get_links()) if n and run_id in n]


def _start(tmp_path, runtime="netns", scenario=LONG):
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump(scenario))
    run_dir = tmp_path / "run"
    # Ctrl-C as a terminal sends it: SIGINT at its default in the runner, even where this pytest was
    # started in the background (a non-interactive shell's `cmd &` ignores SIGINT for its children,
    # and the runner, which inherits that, never saw the tests' Ctrl-C)
    p = start_up(scen, run_dir, "-q", "--runtime", runtime,
                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 90
    while time.time() < deadline:
        steps = run_dir / "steps.csv"
        if steps.exists() and len(steps.read_text().splitlines()) > 3:
            break
        if p.poll() is not None:
            pytest.fail(f"edgebed up ended early: {p.stdout.read()}")
        time.sleep(0.2)
    else:
        p.kill()
        pytest.fail("training did not start within 90 s")
    run_id = json.loads((run_dir / "meta.json").read_text())["run_id"]
    assert [n for n in our_netns() if run_id in n], "namespaces should exist while running"
    return p, run_dir, run_id


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_ctrl_c_tears_down_and_keeps_records(tmp_path, runtime):
    _docker_or_skip(runtime)
    p, run_dir, run_id = _start(tmp_path, runtime)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 130, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and "interrupted" in summary["reason"]
    assert summary["worker_steps"] > 0
    ns, cg, procs, states = _nothing_left(run_id)
    assert (ns, cg, procs, states) == ([], set(), [], [])
    assert _containers(run_id) == []


@pytest.mark.parametrize("scenario", ["one-lan", "sites"])
@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_kill_9_then_down_removes_everything(tmp_path, runtime, scenario):
    _docker_or_skip(runtime)
    p, run_dir, run_id = _start(tmp_path, runtime, SITES if scenario == "sites" else LONG)
    if scenario == "sites":
        assert {f"eb-{run_id}-rt-a", f"eb-{run_id}-sw-b"} <= set(our_netns())
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    time.sleep(0.5)
    ns, cg, _, _ = _nothing_left(run_id)
    if runtime == "netns":
        assert ns and cg, "a killed runner cannot clean up; these are what `down` must remove"
    else:
        assert ns and _containers(run_id), "containers and netns handles outlive a killed runner"
    status = subprocess.run(edgebed_cmd() + ["status"], capture_output=True, text=True)
    assert run_id in status.stdout and "runner gone" in status.stdout
    down = subprocess.run(edgebed_cmd() + ["down", run_id], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stdout + down.stderr
    ns, cg, procs, states = _nothing_left(run_id)
    assert (ns, cg, procs, states) == ([], set(), [], [])
    assert _containers(run_id) == []
    assert _root_links(run_id) == []  # no veth end of the run left in the host namespace
    # the records written before the crash are still readable
    from testbed.records.reader import load_run

    assert len(load_run(run_dir).steps) > 0


@pytest.mark.parametrize("bad,field", [
    ({"algorithm": {"name": "nope"}}, "algorithm.name"),
    ({"workload": {"model": "nope"}}, "workload.model"),
    ({"workers": [{"count": 1, "profile": {"bandwidth": "-5mbit"}}]}, "workers[0].profile.bandwidth"),
    ({"workers": [{"count": 0}]}, "workers[0].count"),
    ({"workers": [{"count": 1, "profile": "ghost"}]}, "workers[0].profile"),
])
def test_bad_input_starts_nothing(tmp_path, bad, field):
    scen = tmp_path / "bad.yaml"
    scen.write_text(yaml.safe_dump({"name": "bad", **bad}))
    before = our_netns()
    r = run_up(scen, tmp_path / "run", expect=2, timeout=60)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), r.stderr
    assert not (tmp_path / "run").exists()
    # nothing new: another lane's run may have gone meanwhile (before held one that after did not)
    assert set(our_netns()) <= set(before)


def test_missing_file_is_one_clear_line(tmp_path):
    r = run_up(tmp_path / "nope.yaml", None, expect=2)
    assert r.stderr.strip() == f"error: {tmp_path / 'nope.yaml'}: no such scenario file"


def test_a_dead_node_is_reported_with_how_it_ended():
    from testbed.run.monitor import exit_reason

    assert exit_reason("w3", 1) == "w3 (exit status 1)"
    assert exit_reason("w7", -signal.SIGKILL) == \
        "w7 (killed by SIGKILL: out of memory? the kernel's OOM killer sends it (dmesg says))"
    assert exit_reason("w1", -signal.SIGSEGV) == "w1 (killed by SIGSEGV)"


def test_nodes_die_with_a_killed_runner(tmp_path):
    """kill -9 of the runner: within seconds no process is left in the run's namespaces and no
    step is recorded any more (before `edgebed down`, which then removes the namespaces)."""
    from testbed.runtimes.state import run_processes

    p, run_dir, run_id = _start(tmp_path, "netns", LONG)
    assert run_processes(run_id), "the nodes run"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    deadline = time.time() + 5
    while run_processes(run_id) and time.time() < deadline:
        time.sleep(0.1)
    try:
        assert run_processes(run_id) == set()
        lines = len((run_dir / "steps.csv").read_text().splitlines())
        time.sleep(2)
        assert len((run_dir / "steps.csv").read_text().splitlines()) == lines
    finally:
        subprocess.run(edgebed_cmd() + ["down", run_id], capture_output=True, timeout=60)
