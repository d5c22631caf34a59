import os
import shutil
import subprocess
import sys
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
    return [l for l in out.splitlines() if "edgebed-" in l and "ps -eo" not in l]


@pytest.fixture
def clean_host():
    """Fail a test that leaves namespaces, cgroups or state files of edgebed behind."""
    from testbed import cgroups
    from testbed.state import known_runs

    before = set(known_runs())
    yield
    after = set(known_runs()) - before
    assert not after, f"leftover runs: {after}; netns {our_netns()}; cgroups {cgroups.list_runs()}"
