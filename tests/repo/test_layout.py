"""tests/ mirrors the package: each test file in the folder of the layer it tests (testbed/'s, or
lab/, runs/, repo/), none at the top, every file name once (pytest imports a test file by its
name), and what test files share in tests/helpers.py: no test file imports another, or conftest."""

import ast
from pathlib import Path

import architecture as arch

TESTS = Path(__file__).resolve().parents[1]
# beside conftest.py and helpers.py, the modules at the top are run or read by path, not collected
TOP = {"conftest.py", "helpers.py", "architecture.py", "comment_history.py", "channel_intruder.py", "env_probe.py",
       "hub_process.py", "undo_shaping.py"}
FOLDERS = {layer for layer in arch.LAYERS if layer != "(top)"} | {"lab", "runs", "repo"}


def _test_files(root: Path = TESTS) -> list[Path]:
    return sorted(p for p in root.rglob("test_*.py") if "__pycache__" not in p.parts)


def _imported(path: Path) -> set[str]:
    """The top-level names of the modules a file imports (anywhere in it, lazily too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def borrowed(root: Path = TESTS) -> list[tuple[str, str]]:
    """(file, module) for each test file, conftest or helper module under `root` that imports a
    test file, and each test file that imports conftest."""
    tests = {p.stem for p in _test_files(root)}
    found = []
    for path in sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts):
        taken = _imported(path) & (tests | ({"conftest"} if path.name.startswith("test_") else set()))
        found += [(str(path.relative_to(root)), name) for name in sorted(taken)]
    return found


def misplaced(root: Path = TESTS) -> list[str]:
    """Files at tests/'s top that are not conftest, helpers or a helper module, and test files
    in a folder that is no layer of testbed/ (nor lab, runs, repo)."""
    top = [p.name for p in root.glob("*.py") if p.name not in TOP]
    return sorted(top) + [str(p.relative_to(root)) for p in _test_files(root)
                          if p.parent != root and p.relative_to(root).parts[0] not in FOLDERS]


def test_no_test_file_imports_another_or_conftest():
    assert borrowed() == []


def test_every_test_file_is_in_its_layers_folder():
    assert misplaced() == []


def test_every_test_file_name_is_used_once():
    names = [p.name for p in _test_files()]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_checks_find_a_borrowed_helper_and_a_stray_file(tmp_path):
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel" / "test_a.py").write_text("from helpers import until\n")
    (tmp_path / "kernel" / "test_b.py").write_text("def f():\n    from test_a import x\n")
    (tmp_path / "attic").mkdir()
    (tmp_path / "attic" / "test_c.py").write_text("import conftest\n")
    (tmp_path / "test_d.py").write_text("")
    assert borrowed(tmp_path) == [("attic/test_c.py", "conftest"), ("kernel/test_b.py", "test_a")]
    assert misplaced(tmp_path) == ["test_d.py", "attic/test_c.py"]


def test_importing_the_helpers_starts_no_thread():
    """A node process that unpickles a test's function imports its file and tests/helpers.py, then
    drops its privileges, which needs a process of one thread (kernel.privileges)."""
    import subprocess
    import sys

    code = "import os, helpers; print(len(os.listdir('/proc/self/task')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=TESTS, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr[-2000:]
