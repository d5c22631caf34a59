"""The scenario layer in rooms of its own (document, profiles, workload, streaming, checks, scenario_file)
with testbed.scenario.schema still offering every name its importers use, and the cross-checks
still reporting their lines in the order of the fields."""

import pytest

from testbed.scenario import checks, document, profiles, scenario_file, schema, streaming, workload
from testbed.scenario.schema import ScenarioError, validate_schema

# What schema.py defined before it was split (the ~40 importers use a part of it).
BEFORE = ["MAX_WORKERS", "FIXED_SPLIT_DATASETS", "ScenarioError", "Stress", "MIN_CPU_PERIOD_S", "MAX_CPU_PERIOD_S",
          "DEFAULT_CPU_PERIOD_S", "MIN_CPU_QUOTA_S", "cpu_quota_problem", "Profile", "NodeSpec", "Site", "LinkShape",
          "WanLink", "NodeLink", "Wan", "WorkerGroup", "Injection", "COMMAND_PLACEHOLDERS", "command_problem",
          "Workload", "Stop", "Algorithm", "KAFKA_IMAGE", "split_host_port", "BrokerSpec", "Streaming", "Network",
          "Faults", "EVENT_ACTIONS", "Event", "Scenario", "MAX_MESSAGE", "resolve_target", "KAFKA_NEEDS",
          "gpu_fields", "gpu_profiles", "profile_refs", "uses_kafka_image", "validate_schema", "read_scenario_file",
          "traces_outside", "scenario_to_yaml"]


@pytest.mark.parametrize("name", BEFORE)
def test_schema_still_offers_every_name_and_it_is_the_one_object(name):
    rooms = (document, profiles, workload, streaming, checks, scenario_file)
    obj = getattr(schema, name)
    assert name in schema.__all__
    assert any(vars(m).get(name) is obj for m in rooms)
    if callable(obj):  # defined in its room, not in schema.py
        assert obj.__module__ in {m.__name__ for m in rooms}


def test_cross_check_lines_keep_the_order_of_the_fields():
    data = {"streaming": {"rates": [10, 20]}, "profiles": {"p": {"jitter": "5ms"}},
            "workers": [{"count": 2, "profile": "nope"}, {"count": 1, "name": "w", "profile": "p"}],
            "events": [{"at": 1, "target": "ghost", "action": "kill"}], "algorithm": {"name": "no-such-algorithm"},
            "placement": {"ghost": "label:x"}, "network": {"encrypt": True, "subnet": "10.9.0.0/29"},
            "runtime": "netns", "workload": {"test_size": 10, "dataset": "mnist"}}
    with pytest.raises(ScenarioError) as e:
        validate_schema(data)
    fields = [line.split(":")[0] for line in e.value.lines]
    order = ["streaming.rates", "workers[0].profile", "events[0].target", "network.subnet", "algorithm.name",
             "placement.ghost", "workload.test_size", "profiles.p.uplink"]
    assert [f for f in order if f in fields] == order, e.value.lines
    assert [f for f in fields if f in order] == sorted((f for f in fields if f in order), key=order.index)
