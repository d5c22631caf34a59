"""Plugins: what a scenario names as its algorithm, model or dataset.

A name is looked up in a Python entry point group (`edgebed.strategies`, `edgebed.models`,
`edgebed.datasets`); anything else of the form `package.module:Name` is imported. edgebed's own
algorithms, models and datasets register in the same groups (pyproject.toml), so a user's
package can do all that a built-in can: `pip install` it and name it, or name its import path.
"""

from __future__ import annotations

import functools
import importlib
from importlib import metadata
from typing import Any

from testbed.errors import BadInput

GROUPS = {"algorithm": "edgebed.strategies", "model": "edgebed.models", "dataset": "edgebed.datasets"}
IMPORT_HINT = "install its package (pip install -e DIR) or put its folder on PYTHONPATH"


class PluginError(BadInput):
    pass


@functools.lru_cache(maxsize=None)
def registered(kind: str) -> dict[str, metadata.EntryPoint]:
    """The names of a kind that are registered (edgebed's and installed packages')."""
    return {ep.name: ep for ep in metadata.entry_points(group=GROUPS[kind])}


def is_import_path(ref: str) -> bool:
    """`package.module:Name` (or `:Outer.Name`), as opposed to a registered name or a spec."""
    module, sep, attr = ref.partition(":")
    return bool(sep) and all(p.isidentifier() for p in module.split(".")) and \
        all(p.isidentifier() for p in attr.split("."))


def load(kind: str, ref: str) -> Any:
    """The object a registered name or an import path stands for."""
    eps = registered(kind)
    if ref in eps:
        try:
            return eps[ref].load()
        except Exception as e:
            raise PluginError(f"{kind} '{ref}' (entry point {eps[ref].value}) does not load: "
                              f"{type(e).__name__}: {e}") from None
    if is_import_path(ref):
        return import_object(ref)
    raise PluginError(f"unknown {kind} '{ref}' (known: {', '.join(sorted(eps))}; or a plugin's module:Name)")


def load_callable(kind: str, ref: str, what: str) -> Any:
    """load(), and a function: `what` says which (the error names it)."""
    obj = load(kind, ref)
    if not callable(obj):
        raise PluginError(f"'{ref}' is not callable (a {kind} is a function {what})")
    return obj


def import_object(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    try:
        obj = importlib.import_module(module)
    except Exception as e:
        raise PluginError(f"cannot import module '{module}' ({type(e).__name__}: {e}); {IMPORT_HINT}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"module '{module}' has no '{attr}'") from None
    return obj


def describe(obj: Any) -> str:
    """A plugin's one-line description: its `summary`, else its docstring's first line."""
    text = getattr(obj, "summary", "") or (obj.__doc__ or "").strip()
    return text.splitlines()[0] if text else ""
