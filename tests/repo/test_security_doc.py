"""SECURITY.md's promises each name the test that shows them: every test it names exists, so a
promise cannot outlive its test unnoticed."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"(tests/(?:\w+/)*test_\w+\.py)(?:::(test_\w+))?|(?<![\w/])(test_\w+\.py)::(test_\w+)|::(test_\w+)")
# a test file named without its folder: where it is under tests/
BY_NAME = {p.name: str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")}


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_test_security_md_names_exists():
    text = (ROOT / "SECURITY.md").read_text()
    files, missing, last = 0, [], None
    for m in NAMED.finditer(text):
        path = m.group(1) or (m.group(3) and BY_NAME.get(m.group(3), f"tests/{m.group(3)}"))
        name = m.group(2) or m.group(4) or m.group(5)
        path = path or last
        if path is None:
            continue
        last, files = path, files + 1
        if not (ROOT / path).is_file():
            missing.append(path)
        elif name and name not in _tests_in(ROOT / path):
            missing.append(f"{path}::{name}")
    assert files > 10 and missing == [], missing
