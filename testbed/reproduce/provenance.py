"""Which code made a reproduction's records: a digest of the sources that decide them.

A series' records are reused only while both its scenario and this code are what they were when
it ran, so a change to a strategy reruns the figures that use it, not the others. The code is:
the algorithm's strategy module and the strategy modules it imports (its compressors, its base),
the node roles (what a worker, the PS, a peer and the evaluator do), and the experiment's own
reproduction module (its series and read-outs). The rest of edgebed (runtimes, shaping, the
wire) changes how a run is hosted, not what the algorithm computes, and would rerun every figure
on every commit; a user who wants that passes --rerun.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "testbed" / "node" / "roles"
STRATEGIES = "testbed.strategies"


def _module_file(module: str) -> Optional[Path]:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _strategy_module(name: str) -> Optional[str]:
    """The module an algorithm's name (registered, or `pkg.mod:Name`) stands for, not imported."""
    from testbed import plugins

    eps = plugins.registered("algorithm")
    ref = eps[name].value if name in eps else name
    return ref.partition(":")[0] if plugins.is_import_path(ref) else None


def _imported_strategies(path: Path) -> set[str]:
    """The testbed.strategies modules a source file imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == STRATEGIES:
            out |= {f"{STRATEGIES}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(STRATEGIES + "."):
            out.add(node.module or "")
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith(STRATEGIES + ".")}
    return out


def strategy_files(name: str) -> list[Path]:
    """The algorithm's module and, transitively, the strategy modules it imports."""
    start = _strategy_module(name)
    todo, seen, files = [start] if start else [], set(), []
    while todo:
        module = todo.pop()
        path = _module_file(module) if module not in seen else None
        seen.add(module)
        if path is None:
            continue
        files.append(path)
        todo += sorted(_imported_strategies(path) - seen)
    return sorted(files)


def algorithms(data: dict) -> list[str]:
    """The algorithm names a scenario runs (its `algorithm`, a name or a mapping with `name`)."""
    algo = data.get("algorithm")
    name = algo.get("name") if isinstance(algo, dict) else algo
    return [name] if isinstance(name, str) and name else []


def code_files(data: dict, experiment_module: str) -> list[Path]:
    """Every source that decides a series' records (the module docstring says which)."""
    files = {p for name in algorithms(data) for p in strategy_files(name)}
    files |= set(ROLES.glob("*.py"))
    mod_file = getattr(sys.modules.get(experiment_module), "__file__", None)
    if mod_file:
        files.add(Path(mod_file))
    return sorted(files)


def _name(path: Path) -> str:
    path = path.resolve()
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def code_digest(data: dict, experiment_module: str) -> dict:
    """{"code": digest of them all, "files": {path: digest}} for a series' scenario."""
    files = {_name(p): hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in code_files(data, experiment_module)}
    whole = hashlib.sha256("\n".join(f"{k} {v}" for k, v in sorted(files.items())).encode()).hexdigest()[:16]
    return {"code": whole, "files": files}


def changed_files(then: dict, now: dict) -> list[str]:
    """The files whose digest differs between two code_digest() results (added or gone too)."""
    a, b = then.get("files") or {}, now.get("files") or {}
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
