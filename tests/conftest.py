import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def is_root() -> bool:
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not is_root(), reason="needs root: namespaces, veth, tc and cgroups")


def edgebed_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("edgebed")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "testbed.cli"]


def our_netns() -> list[str]:
    d = Path("/run/netns")
    return sorted(p.name for p in d.iterdir() if p.name.startswith("eb-")) if d.is_dir() else []


def our_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    # not the heavy lock's waiters nor the lab's engines (edgebed-heavy.lock, edgebed-lab in their args)
    return [l for l in out.splitlines() if "edgebed-" in l and "ps -eo" not in l
            and "edgebed-heavy.lock" not in l and "edgebed-lab" not in l]


@pytest.fixture
def clean_host(tmp_path):
    """Fail a test that leaves namespaces, cgroups, containers or state files of edgebed behind.

    Only runs this test made count (runner is this process, or the run dir is in the test's
    tmp_path): other edgebed runs on the same machine must not fail it.
    """
    from testbed.kernel import cgroups
    from testbed.runtimes import load_backends
    from testbed.runtimes.state import known_runs

    load_backends()
    before = set(known_runs())
    yield

    def ours(st) -> bool:
        return st is None or st.runner_pid == os.getpid() or str(st.run_dir).startswith(str(tmp_path))

    after = {rid for rid, st in known_runs().items() if rid not in before and ours(st)}
    assert not after, f"leftover runs: {after}; netns {our_netns()}; cgroups {cgroups.list_runs()}"


@contextmanager
def netns_cluster(run_dir, scenario: dict):
    """A netns cluster made from a scenario dict; torn down (and checked) on exit."""
    import secrets

    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster
    from testbed.runtimes.netns import NetnsRuntime
    from testbed.runtimes.state import RunState

    sc = parse_scenario(scenario)
    run_id = secrets.token_hex(3)
    state = RunState(run_id=run_id, runner_pid=os.getpid(), run_dir=str(run_dir), scenario=sc.name)
    state.save()
    rt = NetnsRuntime(state)
    rt.set_preload([])
    spec = build_cluster(sc, run_id)
    try:
        rt.create(spec)
        yield rt, spec
    finally:
        assert rt.teardown() == []
        assert not [n for n in our_netns() if run_id in n]
