"""The scenario file: schema, defaults, validation with errors that name the field.

A scenario says what cluster to emulate (profiles, nodes), what to train (workload,
algorithm) and when to stop. `testbed.plan.load_scenario()` returns a fully resolved `Scenario`;
every problem is reported as `ScenarioError` with lines like
`workers[1].profile.bandwidth: '-5mbit' is not a rate`.

This module gathers the names callers import; each lives in a room of its own: the models in
`document` (with `profiles`, `workload` and `streaming`), cross-checks and error lines in
`checks`, reading and writing scenario files in `scenario_file`.
"""

from __future__ import annotations

from testbed.scenario.checks import (
    FIXED_SPLIT_DATASETS,
    KAFKA_NEEDS,
    MAX_MESSAGE,
    MAX_WORKERS,
    ScenarioError,
    gpu_fields,
    gpu_profiles,
    profile_refs,
    resolve_target,
    uses_kafka_image,
    validate_schema,
)
from testbed.scenario.document import EVENT_ACTIONS, Event, Faults, Network, Scenario
from testbed.scenario.profiles import (
    DEFAULT_CPU_PERIOD_S,
    MAX_CPU_PERIOD_S,
    MIN_CPU_PERIOD_S,
    MIN_CPU_QUOTA_S,
    LinkShape,
    NodeLink,
    NodeSpec,
    Profile,
    Site,
    Stress,
    Wan,
    WanLink,
    WorkerGroup,
    cpu_quota_problem,
)
from testbed.scenario.scenario_file import read_scenario_file, scenario_to_yaml, traces_outside
from testbed.scenario.streaming import KAFKA_IMAGE, BrokerSpec, Streaming, split_host_port
from testbed.scenario.workload import COMMAND_PLACEHOLDERS, Algorithm, Injection, Stop, Workload, command_problem

__all__ = ["FIXED_SPLIT_DATASETS", "KAFKA_NEEDS", "MAX_MESSAGE", "MAX_WORKERS", "ScenarioError", "gpu_fields",
           "gpu_profiles", "profile_refs", "resolve_target", "uses_kafka_image", "validate_schema",
           "read_scenario_file", "scenario_to_yaml", "traces_outside",
           "EVENT_ACTIONS", "Event", "Faults", "Network", "Scenario",
           "DEFAULT_CPU_PERIOD_S", "MAX_CPU_PERIOD_S", "MIN_CPU_PERIOD_S", "MIN_CPU_QUOTA_S", "LinkShape", "NodeLink",
           "NodeSpec", "Profile", "Site", "Stress", "Wan", "WanLink", "WorkerGroup", "cpu_quota_problem",
           "KAFKA_IMAGE", "BrokerSpec", "Streaming", "split_host_port",
           "COMMAND_PLACEHOLDERS", "Algorithm", "Injection", "Stop", "Workload", "command_problem"]
