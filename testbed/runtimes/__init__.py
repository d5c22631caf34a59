"""Runtimes make a ClusterSpec real: network namespaces + cgroups (netns), containers on this
machine (docker), services across the hosts of a Docker Swarm (swarm), and any other a package
registers in the entry point group `edgebed.runtimes` (runtimes/README.md: what one implements).

This registry is the only place that turns a runtime's name into its class; what a runtime can
do, whether it can run here and what of a scenario it cannot meet are the class's to say."""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Callable, Optional

from testbed.runtimes.errors import RuntimeUnavailable  # noqa: F401  (raised here, caught by the CLI)
from testbed.scenario import checks

GROUP = "edgebed.runtimes"
AUTO = "auto"  # a scenario's `runtime: auto`: the first runtime, by rank, that can run here


@functools.lru_cache(maxsize=None)
def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def runtime_names() -> list[str]:
    """The runtimes a scenario may name (besides `auto`), sorted: nothing is imported to list them."""
    return sorted(_entry_points())


def unknown_runtime(name: str) -> Optional[str]:
    """One line if `name` is neither `auto` nor a registered runtime (validation's line), else None."""
    return checks.unknown_runtime(name, _entry_points())


def runtime_class(name: str):
    """The class registered as `name` (imported now); an unknown name is a RuntimeUnavailable of one line."""
    line = unknown_runtime(name) if name != AUTO else f"runtime: '{AUTO}' is a choice among runtimes, not one"
    if line is not None:
        raise RuntimeUnavailable(line)
    return _entry_points()[name].load()


def auto_candidates() -> list:
    """The runtimes `auto` may pick, in the order it tries them (their auto_rank)."""
    classes = [runtime_class(name) for name in runtime_names()]
    return sorted((c for c in classes if c.auto_rank is not None), key=lambda c: c.auto_rank)


def load_backends() -> None:
    """Import every runtime, so each registers its share of the clean-up (`edgebed down`, `status`)."""
    for name in runtime_names():
        runtime_class(name)


def select_runtime(name: str, say: Callable[[str], None] = lambda line: None, sc=None) -> str:
    """The runtime that runs a scenario: `name`, if it can run here (else RuntimeUnavailable), or
    for `auto` the first candidate that can run here and does not refuse `sc` (`say` tells why an
    earlier one was passed over)."""
    if name != AUTO:
        why = runtime_class(name).available()
        if why is not None:
            raise RuntimeUnavailable(why.line)
        return name
    passed_over, last = None, None
    for cls in auto_candidates():
        refusal = cls.auto_refusal(sc) if sc is not None else None
        why = None if refusal is not None else cls.available()
        if refusal is None and why is None:
            if passed_over is not None:
                say(f"runtime auto: {cls.name}, because {passed_over}")
            return cls.name
        last = why or last
        passed_over = passed_over or refusal or why.why
    raise RuntimeUnavailable(last.line if last is not None else "runtime auto: no runtime can run here")


def auto_note(requested: str, chosen: str) -> str:
    """What follows `runtime: NAME` at bring-up: the chosen runtime's note when auto chose it."""
    return runtime_class(chosen).auto_note if requested == AUTO else ""


def scenario_problems(sc) -> list[str]:
    """Validation's per-runtime lines (pure): an unknown runtime's one line, the named runtime's, or
    for auto, those every candidate has."""
    unknown = unknown_runtime(sc.runtime)
    if unknown is not None:
        return [unknown]
    if sc.runtime != AUTO:
        return runtime_class(sc.runtime).scenario_problems(sc)
    per = [cls.scenario_problems(sc) for cls in auto_candidates()]
    return [line for line in per[0] if all(line in other for other in per[1:])] if per else []


def engine_problems(sc) -> list[str]:
    """Preflight's per-runtime lines (may ask an engine): the named runtime's; for auto, those of
    the first candidate that would take the scenario."""
    if sc.runtime != AUTO:
        return runtime_class(sc.runtime).problems(sc)
    for cls in auto_candidates():
        lines = cls.auto_problems(sc)
        if lines is not None:
            return lines
    return []


def plugin_refusals(sc, plugins: list[tuple[str, str]]) -> list[str]:
    """The named runtime's refusals of a user's plugins (auto: none; it passes over a runtime that refuses)."""
    return [] if sc.runtime == AUTO else runtime_class(sc.runtime).plugin_refusals(sc, plugins)
