"""meta.json's parts: the software and host a run ran on, its nodes, its sites, its warnings."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from testbed import __version__
from testbed.plan.cluster import ClusterSpec
from testbed.scenario.schema import Scenario

# What a runtime may add to a node's meta.json entry: its container or service and image, its clock's offset.
NODE_META_EXTRAS = ("container", "service", "image", "clock_offset_s", "clock_rtt_s", "kernel_features")


def versions() -> dict:
    import numpy
    import pyroute2
    import torch
    import zmq

    return {"edgebed": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "pyroute2": getattr(pyroute2, "__version__", "?"),
            "pyzmq": zmq.__version__}


def host() -> dict:
    u = os.uname()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"hostname": u.nodename, "kernel": u.release, "machine": u.machine, "cpus": os.cpu_count(),
            "memory_bytes": mem}


def nodes_meta(sc: Scenario, spec: ClusterSpec, node_meta: dict) -> dict:
    """Each node: its role, address, profile, and where and how the runtime made it (`node_meta`)."""
    return {n.name: {"role": n.role, "rank": n.rank, "address": n.address, "profile_name": n.profile_name,
                     "profile": n.profile.model_dump(mode="json", exclude_none=True),
                     "netns": node_meta[n.name]["netns"], "compute": node_meta[n.name]["compute"],
                     "threads": sc.workload.threads or n.threads, "host": n.host,
                     **{k: v for k, v in node_meta[n.name].items() if k in NODE_META_EXTRAS}}
            for n in spec.nodes}


def topology_meta(spec: ClusterSpec) -> dict:
    topo = spec.topology
    return {
        "sites": {s.name: {"subnet": s.subnet, "router": s.router,
                           "nodes": [n.name for n in spec.nodes if n.site == s.name]} for s in topo.sites},
        "wan_links": [{"between": [e.a, e.b], "addresses": [e.a_address, e.b_address],
                       "forward": e.forward.model_dump(exclude_none=True),
                       "reverse": e.reverse.model_dump(exclude_none=True)} for e in topo.edges],
    }


def no_netem_warning(node_meta: dict) -> str:
    """What a kernel (some host's, on swarm) without sch_netem did to latency and loss."""
    lost = [f"{n} {d}" for n, m in node_meta.items() for d in ("uplink", "downlink")
            if m[d]["mechanisms"].get("loss", "").startswith("not-applied")]
    loss = (f"loss is NOT applied on {', '.join(lost)} (no usable eBPF filter either)" if lost
            else "loss (where a link has it) by an eBPF drop filter")
    return f"a kernel without sch_netem: latency/jitter are applied by edgebed's transport (per message); {loss}"


def dilation_meta(k: float, auto: bool) -> dict:
    """meta.json's `dilation`: the run's k and what is in which clock (scenario.dilation)."""
    return {"k": k, "chosen": "auto" if auto else "given",
            "records": "the world's seconds (wall / k) and rates (wall x k)",
            "wall": "links, quotas and calibrations in this file are as made on the wall"}
