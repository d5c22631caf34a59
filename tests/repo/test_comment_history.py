"""Comments keep the why, not the history (CONTRIBUTING.md, "Comments"): no issue number, date,
CI stop, session or measurement of one machine in testbed/'s comments and docstrings or the
Makefile's comments; tests/comment_history.py finds them, and these tests check that it does."""
import subprocess
import sys

import pytest

import comment_history as ch
from helpers import REPO


def test_testbed_and_the_makefile_carry_no_history():
    found = ch.findings(benchmarks=False)
    assert found == [], "history belongs in the commit body:\n" + "\n".join(map(str, found))


def test_the_tests_cite_no_issue_date_ci_run_or_session():
    """The tests' own comments and docstrings too; "as before" is theirs to say (a behaviour kept),
    and a fake clock's "took" is the test's input, so only these kinds are held to here."""
    history = {"issue", "date", "CI", "stop", "session"}
    found = [f for p in sorted((REPO / "tests").rglob("*.py")) if p.name != "test_comment_history.py"
             for f in ch.python_findings(p, REPO) if history & set(f.kind.split(", "))]
    assert found == [], "history belongs in the commit body:\n" + "\n".join(map(str, found))


@pytest.mark.parametrize("text, kind", [
    ("the hub's queue (issue 34)", "issue"),
    ("see #41 for the race", "issue"),
    ("(#12)", "issue"),
    ("veths are made in place since 2026-11-28", "date"),
    ("changed in Nov 2026", "date"),
    ("from 27 November 2026 on", "date"),
    ("a veth carries 16 Gbit/s on this machine", "this machine"),
    ("a veth carries ~16 Gbit/s here", "here"),
    ("256: the most tried here (9.6 GiB)", "here"),
    ("took 0.17 s once in CI", "CI"),
    ("read 90.6% in CI", "CI"),
    ("CI (stop 57) failed twice", "stop"),
    ("found in this session", "session"),
    ("pyroute2 took 8 ms a node", "took"),
    ("until its ARP entry ages (measured: 20-30 s)", "measured"),
    ("a node with no process: 0.53 MiB measured", "measured"),
    ("a device used to be a container of its own", "then and now"),
    ("stays one bridge, as before", "then and now"),
    ("the 1,024th fails, measured here", "then and now"),
    ("Measured on an H100: within 8%", "then and now"),
])
def test_the_checker_names_each_mark_of_history(text, kind):
    assert kind in ch.kinds(text)


@pytest.mark.parametrize("text", [
    "This saves an ifconfig command per node",
    "a 1 s window: the kernel's period",
    "HTB's quantum is 1514 B",
    "moby#48783: the engine races with itself",  # an upstream report: the reason
    "deleting the qdisc skews measurements, Mininet #650",
    "kubernetes#90838",
    "on a clock that counts from 2020-01-02 00:00 (run second 0)",  # a value, not a when
    "what detaches into a session of its own",
    "half of the default 45 s session timeout",
    "requests replace a session's CA",
    "a runtime that makes namespaces on this machine needs root",
    "the measured paths cross hosts",
    "May the runner stop early",
    "rounds stop at 2,000 steps",
])
def test_the_checker_leaves_reasons_alone(text):
    assert ch.kinds(text) == []


def test_comments_docstrings_and_the_makefile_are_read(tmp_path):
    (tmp_path / "testbed").mkdir()
    (tmp_path / "testbed" / "a.py").write_text(
        '"""A module (issue 7)."""\n'
        "X = 1  # took 3 s in CI\n"
        "# a block that says, on its second line,\n"
        "# when: 2026-11-27\n"
        "def f():\n"
        '    """Fine."""\n'
        "    return '# issue 9 in a string is code, not a comment'\n")
    (tmp_path / "Makefile").write_text("all:\n\t# passed in 41 min (2026-11-29)\n\techo '#12'\n")
    found = [(f.path, f.line, f.kind) for f in ch.findings(tmp_path)]
    assert found == [("testbed/a.py", 1, "issue"), ("testbed/a.py", 2, "CI, took"),
                     ("testbed/a.py", 3, "date"), ("Makefile", 2, "date")]


def test_trailing_comments_are_counted_per_thousand_lines(tmp_path):
    (tmp_path / "testbed").mkdir()
    (tmp_path / "testbed" / "a.py").write_text(
        "# a comment above is not trailing\n"
        "X = 1  # trailing\n"
        "import os  # noqa: F401\n"
        "Y = '# not a comment'\n")
    assert ch.trailing_density(tmp_path) == (1, 4, 250.0)


def test_the_script_runs_as_a_module():
    r = subprocess.run([sys.executable, "-m", "tests.comment_history"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert "trailing comments" in r.stdout, r.stdout + r.stderr
