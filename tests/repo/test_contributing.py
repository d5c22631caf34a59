"""CONTRIBUTING.md's commit rule has its tools: the template it names exists, and the commit-msg
hook it points to refuses a subject over 72 characters and lets a good message through."""
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO

HOOK = REPO / "hooks" / "commit-msg"
TEMPLATE = REPO / ".gitmessage"
GUIDE = REPO / "CONTRIBUTING.md"


def test_the_guide_names_the_template_and_the_template_is_there():
    text = GUIDE.read_text()
    assert "git config commit.template .gitmessage" in text
    assert TEMPLATE.is_file()
    lines = TEMPLATE.read_text().splitlines()
    assert lines[0] == ""  # the subject is typed on the first line
    assert all(line.startswith("#") for line in lines[1:] if line), "git strips only '#' lines"
    assert any("72" in line for line in lines)


def test_the_guide_points_to_the_hook_and_the_checks():
    text = GUIDE.read_text()
    assert "hooks/commit-msg" in text
    for check in ("make test-fast", "make typecheck", "python -m tests.architecture",
                  "python -m tests.comment_history"):
        assert check in text


def test_the_templates_ruler_ends_at_72():
    ruler = next(line for line in TEMPLATE.read_text().splitlines() if line.endswith(">|"))
    assert len(ruler) == 73


def _hook(tmp_path, message: str) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run([sys.executable, str(HOOK), str(path)], capture_output=True, text=True, timeout=30)


def test_the_hook_is_executable():
    assert os.access(HOOK, os.X_OK)


@pytest.mark.parametrize("message", [
    "runtimes/swarm: wait for containers in down\n\nThe body may run long: " + "x" * 200 + "\n",
    "kernel: " + "a" * 64 + "\n",  # 72 characters exactly
    TEMPLATE.read_text().replace("\n", "\nrun: stop at the deadline\n", 1) if TEMPLATE.exists() else "ok\n",
    "fixup! " + "y" * 80 + "\n",
    "Merge branch 'a-branch-whose-name-is-long-enough-to-pass-seventy-two-characters'\n",
])
def test_the_hook_passes_a_good_subject(tmp_path, message):
    r = _hook(tmp_path, message)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("message", [
    "kernel: " + "a" * 65 + "\n",  # 73 characters
    "# a comment line first\n\nruntimes: " + "b" * 80 + "\n\nbody\n",
    "node/fleet_host: " + "é" * 56 + "\n",  # 73 characters, more bytes
])
def test_the_hook_refuses_a_long_subject(tmp_path, message):
    r = _hook(tmp_path, message)
    assert r.returncode == 1
    assert re.search(r"over 72", r.stderr)


def test_the_hook_reads_no_diff_below_the_scissors(tmp_path):
    message = ("# ------------------------ >8 ------------------------\n"
               "diff --git a/x b/x\n+" + "z" * 100 + "\n")
    assert _hook(tmp_path, message).returncode == 0
