"""Fidelity benchmarks: does a shaped link carry its rate, does a quota give its share?

Each builds the same objects a run does (namespaces, veth, HTB, cgroups) through a
runtime, measures, tears down, and writes a JSON result. One module per family:
links (link, topology, loss, delay), cpu, startup, stream; harness holds what they
share. This module keeps every benchmark importable under its old name.
"""

from testbed.bench.cpu import cpu_benchmark
from testbed.bench.harness import run_for_records, run_from_repo
from testbed.bench.links import delay_benchmark, link_benchmark, loss_benchmark, topology_benchmark
from testbed.bench.startup import startup_benchmark
from testbed.bench.stream import stream_benchmark

__all__ = ["cpu_benchmark", "delay_benchmark", "link_benchmark", "loss_benchmark", "run_for_records", "run_from_repo",
           "startup_benchmark", "stream_benchmark", "topology_benchmark"]
