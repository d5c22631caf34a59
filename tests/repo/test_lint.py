"""The lint (`make lint`, run by `make test` beside the type check): ruff, pinned in the test extra,
finds nothing in the folders the Makefile names, with the rules of pyproject.toml's [tool.ruff]."""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO


def _pin() -> str:
    found = re.search(r'"ruff==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert found, "pyproject.toml's test extra pins ruff (ruff==X.Y.Z): another version finds other things"
    return found.group(1)


def _ruff() -> list[str] | None:
    """The venv's ruff (beside this python), its module, or one on PATH; None without."""
    beside = Path(sys.executable).parent / "ruff"
    if beside.is_file():
        return [str(beside)]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    on_path = shutil.which("ruff")
    return [on_path] if on_path else None


def _linted() -> list[str]:
    """The folders `make lint` checks."""
    found = re.search(r"^lint:.*\n\t\$\(BIN\)/ruff check (.+)$", (REPO / "Makefile").read_text(), re.M)
    assert found, "the Makefile has a `lint` target that runs $(BIN)/ruff check"
    return found.group(1).split()


def test_pyproject_pins_ruff_and_configures_it():
    text = (REPO / "pyproject.toml").read_text()
    assert re.fullmatch(r"\d+\.\d+\.\d+", _pin())
    assert "[tool.ruff]" in text and "[tool.ruff.lint]" in text


def test_make_test_runs_the_lint():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test:.*\blint\b", makefile, re.M)
    assert {"testbed", "tests", "benchmarks", "analysis"} <= set(_linted())


def test_ruff_finds_nothing():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (the test extra pins it: `make setup`)")
    version = subprocess.run([*ruff, "--version"], capture_output=True, text=True, timeout=60).stdout.split()
    if version[-1:] != [_pin()]:
        pytest.skip(f"{' '.join(version)} is not the pinned ruff=={_pin()}: another version finds other things")
    out = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "--config", "pyproject.toml",
                          *_linted()], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
