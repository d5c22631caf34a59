"""The plan: what a scenario means as a cluster (nodes, profiles, addresses, links) and its
topology of sites and WAN links.

`parse_scenario`/`load_scenario` are the whole validation: the schema's field checks, then
what only a plan can tell (do the sites' subnets fit, is the WAN connected, when are the
workers online). They live here,
not in testbed.scenario.scenario_file, because that second half is planning (a lower layer may not
import it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence, Union

from testbed.plan.availability import availability_problems
from testbed.plan.topology import topology_problems
from testbed.scenario.checks import ScenarioError, validate_schema
from testbed.scenario.document import Scenario
from testbed.scenario.scenario_file import read_scenario_file


def parse_scenario(data: Any) -> Scenario:
    sc = validate_schema(data)
    lines = topology_problems(sc) + availability_problems(sc)
    if lines:
        raise ScenarioError(lines)
    return sc


def load_scenario(path: Union[str, Path], trace_dirs: Sequence[Union[str, Path]] = ()) -> Scenario:
    """A scenario file, validated and planned; its traces are read from its folder or `trace_dirs`."""
    return parse_scenario(read_scenario_file(path, trace_dirs))
