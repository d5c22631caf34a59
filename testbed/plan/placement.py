"""Placement: which host each node runs on, a step of the plan of its own (Mininet Cluster
Edition's Placer). The runner and runtimes read `Node.host` and never assume where a node is;
today one host runs them all, and a multi-host runtime brings a placer that spreads them."""

from __future__ import annotations

import socket
from typing import Protocol

from testbed.plan.cluster import ClusterSpec


class Placer(Protocol):
    def place(self, spec: ClusterSpec) -> dict[str, str]:
        """Node name -> host name."""


class SingleHost:
    """Every node on one host (this machine by default)."""

    def __init__(self, host: str | None = None):
        self.host = host or socket.gethostname()

    def place(self, spec: ClusterSpec) -> dict[str, str]:
        return {n.name: self.host for n in spec.nodes}


def place(spec: ClusterSpec, placer: Placer | None = None) -> ClusterSpec:
    """Give every node of `spec` its host."""
    hosts = (placer or SingleHost()).place(spec)
    missing = [n.name for n in spec.nodes if n.name not in hosts]
    if missing:
        raise ValueError(f"placement: no host for {', '.join(missing)}")
    for n in spec.nodes:
        n.host = hosts[n.name]
    return spec
