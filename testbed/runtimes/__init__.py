"""Runtimes make a ClusterSpec real: the LXC-style one (network namespaces + cgroups) here."""

from __future__ import annotations

import os


class RuntimeUnavailable(RuntimeError):
    pass


def select_runtime(name: str) -> str:
    """Resolve 'auto' to a concrete runtime and check that it can run here.

    auto: docker when an engine answers, else the netns runtime.
    """
    if os.geteuid() != 0:
        raise RuntimeUnavailable(
            f"the {'netns' if name != 'docker' else 'docker'} runtime needs root (it creates network namespaces, "
            "veth links, tc qdiscs and cgroups, and shapes containers' links from the host); run edgebed with sudo"
        )
    if name in ("auto", "docker"):
        from testbed.runtimes.docker import docker_client

        if docker_client() is not None:
            return "docker"
        if name == "docker":
            raise RuntimeUnavailable("runtime docker: no Docker engine answers (is dockerd running?)")
    if name in ("auto", "netns"):
        if os.geteuid() != 0:
            raise RuntimeUnavailable(
                "the netns runtime needs root (it creates network namespaces, veth links, tc qdiscs "
                "and cgroups); run edgebed with sudo"
            )
        return "netns"
    raise RuntimeUnavailable(f"runtime '{name}' is not available in this version")
