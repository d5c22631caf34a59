"""README's "Tests" table: the limits `make test` puts on one test and on each pytest it runs are
the ones it says (a stuck test or lane ends CI with a summary, not with CI's own timeout)."""

import re
import subprocess

from helpers import REPO


def _make_test_commands() -> list[str]:
    out = subprocess.run(["make", "-n", "--no-print-directory", "-W", "setup", "-W", "typecheck", "test"],
                         capture_output=True, text=True, cwd=REPO)
    return out.stdout.splitlines()


def test_each_pytest_of_make_test_runs_under_its_limit():
    script = "\n".join(_make_test_commands())
    assert re.search(r"timeout -s INT -k 60 55m \S+pytest -q -rs --durations=25 --timeout=1200 -n 2 -m \"not serial\"",
                     script), script[-2000:]
    assert re.search(r"timeout -s INT -k 60 15m \S+pytest -q -rs --durations=25 --timeout=1200 -m serial", script)


def test_a_stuck_test_prints_every_threads_stack():
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r"^faulthandler_timeout = 600$", text, re.M)
    assert "faulthandler_timeout`" in (REPO / "README.md").read_text()
