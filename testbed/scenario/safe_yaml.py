"""Reading a scenario file without trusting it: a size cap, strict UTF-8, a depth cap, few
aliases (a YAML "billion laughs" is a few hundred bytes), and duplicate keys refused. Every
problem is one line naming the file and where in it, never more than a short excerpt of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.data.textfile import capped_text
from testbed.errors import BadInput

MAX_BYTES = 1 << 20  # a scenario is a page of YAML; traces and data live in files of their own
MAX_DEPTH = 32
MAX_ALIASES = 100
MAX_NODES = 100_000  # values in the document with every alias expanded
EXCERPT = 60  # characters of the input an error may quote


class LoadError(BadInput):
    """A scenario file that is not a readable YAML mapping; the message is one line."""


def excerpt(value: Any) -> str:
    """`value` as an error may show it: its repr, cut to a few dozen characters."""
    text = repr(value)
    return text if len(text) <= EXCERPT else text[:EXCERPT - 3] + "..."


class _GuardedLoader(yaml.SafeLoader):
    """SafeLoader with a depth cap, an alias cap and duplicate keys refused."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise LoadError(f"more than {MAX_ALIASES} aliases{_where(self.peek_event())}")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise LoadError(f"nested deeper than {MAX_DEPTH} levels{_where(self.peek_event())}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_NODES:
            raise LoadError(f"more than {MAX_NODES} values once its aliases are expanded")
        return node

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base constructor says so
                break
            if duplicate:
                raise LoadError(f"duplicate key {excerpt(key)}{_where(key_node)}")
        return super().construct_mapping(node, deep)


_GuardedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _GuardedLoader.construct_mapping)


def _expanded_size(node, memo: dict) -> int:
    """How many values `node` stands for with its aliases expanded (shared nodes counted at each
    use), in time linear in the document (each node measured once)."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a cycle (not possible in composed YAML) would count as nothing
        if isinstance(node, yaml.SequenceNode):
            memo[key] = 1 + sum(_expanded_size(n, memo) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            memo[key] = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
        else:
            memo[key] = 1
    return memo[key]


def _where(item) -> str:
    mark = getattr(item, "start_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def load_yaml_text(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_GuardedLoader)
    except yaml.reader.ReaderError as e:
        raise LoadError(f"not valid YAML: a control character at position {e.position}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise LoadError(f"not valid YAML{where}: {getattr(e, 'problem', None) or type(e).__name__}") from None
    except RecursionError:
        raise LoadError(f"nested deeper than {MAX_DEPTH} levels") from None


def load_yaml_file(path: Path) -> Any:
    """The YAML document in `path`, or LoadError with one line saying why not."""
    try:
        text = capped_text(path, MAX_BYTES)
    except ValueError as e:
        why = ": a scenario refers to traces and data by path" if "larger" in str(e) else ""
        raise LoadError(f"{e}{why}") from None
    return load_yaml_text(text)
