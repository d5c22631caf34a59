"""Runtimes make a ClusterSpec real: the LXC-style one (network namespaces + cgroups) here."""

from __future__ import annotations

import os


class RuntimeUnavailable(RuntimeError):
    pass


def select_runtime(name: str) -> str:
    """Resolve 'auto' to a concrete runtime and check that it can run here."""
    if name in ("auto", "netns"):
        if os.geteuid() != 0:
            raise RuntimeUnavailable(
                "the netns runtime needs root (it creates network namespaces, veth links, tc qdiscs "
                "and cgroups); run edgebed with sudo"
            )
        return "netns"
    raise RuntimeUnavailable(f"runtime '{name}' is not available in this version")
