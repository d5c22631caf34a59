"""Runtimes make a ClusterSpec real: network namespaces + cgroups (netns), containers on this
machine (docker), services across the hosts of a Docker Swarm (swarm)."""

from __future__ import annotations

import os

from testbed.runtimes.errors import RuntimeUnavailable  # noqa: F401  (raised here, caught by the CLI)


# Every runtime, by the name scenarios use: `module:class`, imported when asked for.
RUNTIMES = {"netns": "testbed.runtimes.netns:NetnsRuntime", "docker": "testbed.runtimes.docker:DockerRuntime",
            "swarm": "testbed.runtimes.swarm:SwarmRuntime"}


def runtime_names() -> list[str]:
    """The runtimes a scenario may name (besides `auto`), in the order help texts list them."""
    return list(RUNTIMES)


def runtime_class(name: str):
    import importlib

    module, _, cls = RUNTIMES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def load_backends() -> None:
    """Import every runtime, so each registers its share of the clean-up (`edgebed down`, `status`)."""
    for name in RUNTIMES:
        runtime_class(name)


def select_runtime(name: str, say=lambda line: None) -> str:
    """Resolve 'auto' to a concrete runtime and check that it can run here.

    auto: docker when an engine answers and the node image exists or can be built now, else the
    netns runtime (and `say` tells why).
    """
    if name == "swarm":  # nothing made on this machine but the channel's sockets
        from testbed.runtimes.hosts import swarm_client

        try:
            swarm_client()
        except RuntimeError as e:
            raise RuntimeUnavailable(str(e)) from None
        return "swarm"
    if os.geteuid() != 0:
        raise RuntimeUnavailable(
            f"the {'netns' if name != 'docker' else 'docker'} runtime needs root (it creates network namespaces, "
            "veth links, tc qdiscs and cgroups, and shapes containers' links from the host); run edgebed with sudo"
        )
    if name in ("auto", "docker"):
        from testbed.runtimes.docker import docker_client
        from testbed.runtimes.images import image_unavailable

        client = docker_client()
        if client is None and name == "docker":
            raise RuntimeUnavailable("runtime docker: no Docker engine answers (is dockerd running?)")
        why_not = "no Docker engine answers" if client is None else image_unavailable(client)
        if why_not is None:
            return "docker"
        if name == "docker":
            raise RuntimeUnavailable(f"runtime docker: {why_not} (`edgebed build` makes the image)")
        say(f"runtime auto: netns, because {why_not}")
    if name in ("auto", "netns"):
        return "netns"
    raise RuntimeUnavailable(f"runtime '{name}' is not available in this version")
