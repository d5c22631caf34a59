"""The import graph and function lengths of testbed/ (the layout's measures).

`python tests/architecture.py` prints the report; tests/repo/test_architecture.py asserts on it.
Lazy imports inside functions count: a cycle closed by one still couples the modules."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "testbed"
LONGEST_FUNCTION = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` names (a from-import may name a function)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported_names(node: ast.AST, here: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = here.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            for imported in _imported_names(node, name, path.name == "__init__.py"):
                target = _resolve(imported, known)
                if target and target != name:
                    graph[name].add(target)
    return graph


def _without_parent_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Importing a.b.c runs a/__init__ and a/b/__init__ too, but a package's __init__
    importing its own submodules is not a cycle of design: drop edges into ancestors."""
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def cycles(graph: dict[str, set[str]] | None = None) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph = _without_parent_packages(graph or import_graph())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The layers of testbed/, lowest first: a module imports only its own layer and those below.
LAYERS = ["errors", "kernel", "plugins", "records", "strategies", "data", "scenario", "plan", "node", "runtimes", "run",
          "bench", "reproduce", "cli", "(top)"]
RANK = {layer: i for i, layer in enumerate(LAYERS)}
RANK["reproduce"] = RANK["bench"]  # siblings: neither imports the other


def layer_of(module: str) -> str:
    if module == "testbed":  # the package root holds the version and imports nothing
        return "kernel"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else "(top)"


def upward_imports(graph: dict[str, set[str]] | None = None) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a lower layer imports a higher one (or a sibling)."""
    graph = graph or import_graph()
    out = []
    for m, targets in graph.items():
        for t in sorted(targets):
            a, b = layer_of(m), layer_of(t)
            if a != b and (RANK[b] > RANK[a] or (RANK[b] == RANK[a])):
                out.append((m, t))
    return sorted(out)


def private_imports() -> list[tuple[str, str]]:
    """(importer, module.name) for each underscore name a module of testbed/ imports from another
    (`from m import _x`, and `m._x` of an imported module `m`): a private name is its module's."""
    known = modules()
    out = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # a local name -> the testbed module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _imported_names(node, name, path.name == "__init__.py")[0]
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in known:
                        bound[alias.asname or alias.name] = full
                    elif alias.name.startswith("_") and not alias.name.startswith("__") and source in known \
                            and source != name:
                        out.append((name, full))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known and alias.asname:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                target = bound.get(node.value.id)
                if target and target != name:
                    out.append((name, f"{target}.{node.attr}"))
    return sorted(set(out))


# Each runtime's own folder; control/ and engine/ are rooms the backends share, as is runtimes/ top.
BACKENDS = ("netns", "docker", "swarm")


def backend_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "runtimes" and parts[2] in BACKENDS else None


def cross_backend_imports(graph: dict[str, set[str]] | None = None) -> list[tuple[str, str]]:
    """(importer, imported) where a module imports a backend's module from outside that backend:
    another backend, or anything the backends share (a backend is reached by its entry point)."""
    graph = graph or import_graph()
    out = []
    for m, targets in graph.items():
        for t in sorted(targets):
            b = backend_of(t)
            if b is not None and backend_of(m) != b and layer_of(m) == "runtimes":
                out.append((m, t))
    return sorted(out)


def function_lengths() -> list[tuple[int, str]]:
    """(lines, module:qualified name) of every function, nested ones included."""
    out = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))

        def walk(node: ast.AST, prefix: str, name: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    qual = f"{prefix}{child.name}"
                    out.append((child.end_lineno - child.lineno + 1, f"{name}:{qual}"))
                    walk(child, qual + ".")
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")
                else:
                    walk(child, prefix)

        walk(tree, "")
    return sorted(out, reverse=True)


def lines_per_folder() -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        folder = "/".join(rel.parts[:-1]) or "(top)"
        counts[folder] = counts.get(folder, 0) + len(path.read_text().splitlines())
    return dict(sorted(counts.items()))


def main() -> None:
    found = cycles()
    print(f"import cycles: {len(found)}")
    for component in found:
        print(f"  {len(component)} modules: {' '.join(component)}")
    up = upward_imports()
    print(f"imports against the layer order ({' < '.join(LAYERS)}): {len(up)}")
    for a, b in up:
        print(f"  {a} -> {b}")
    across = cross_backend_imports()
    print(f"imports of a backend ({', '.join(BACKENDS)}) from outside its folder, in runtimes/: {len(across)}")
    for a, b in across:
        print(f"  {a} -> {b}")
    private = private_imports()
    print(f"underscore names imported from another module: {len(private)}")
    for a, b in private:
        print(f"  {a} -> {b}")
    lengths = function_lengths()
    long = [(n, f) for n, f in lengths if n > LONGEST_FUNCTION]
    print(f"functions over {LONGEST_FUNCTION} lines: {len(long)}; the longest:")
    for n, f in lengths[:5]:
        print(f"  {n:4d} {f}")
    print("lines per folder of testbed/:")
    for folder, n in lines_per_folder().items():
        print(f"  {n:6d} {folder}")


if __name__ == "__main__":
    main()
