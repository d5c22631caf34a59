"""What nodes load from one another (decentralized replicas) goes through torch.load with
weights_only=True, on a torch whose weights_only loader has the known bypasses fixed
(CVE-2025-32434 in 2.6, CVE-2026-24747 in 2.10): every call in testbed/ says so, and the
project's floor and the installed torch are at least 2.10."""

import ast
import re
import tomllib

import torch

from helpers import REPO

SAFE_FLOOR = (2, 10)


def _version(text: str) -> tuple:
    return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", text).groups())


def _torch_loads(tree) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "load" and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]


def test_every_torch_load_in_testbed_loads_weights_only():
    calls = []
    for path in sorted((REPO / "testbed").rglob("*.py")):
        for call in _torch_loads(ast.parse(path.read_text(), str(path))):
            flag = next((k.value for k in call.keywords if k.arg == "weights_only"), None)
            calls.append((f"{path.relative_to(REPO)}:{call.lineno}",
                          isinstance(flag, ast.Constant) and flag.value is True))
    assert calls, "no torch.load found: the scan itself is broken"
    assert [where for where, safe in calls if not safe] == []


def test_the_scan_finds_an_unsafe_call():
    tree = ast.parse("import torch\ntorch.load(f)\ntorch.load(f, weights_only=False)\ntorch.load(f, weights_only=True)")
    flags = [next((k.value.value for k in c.keywords if k.arg == "weights_only"), None) for c in _torch_loads(tree)]
    assert flags == [None, False, True]


def test_the_torch_floor_is_a_safe_weights_only_loader():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(d for d in deps if re.match(r"torch\s*>=", d))
    assert _version(floor.split(">=")[1]) >= SAFE_FLOOR
    assert _version(torch.__version__) >= SAFE_FLOOR
