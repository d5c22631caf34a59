"""Property-based: the scenario loader and the wire decoder raise nothing but their own errors,
whatever they are given."""
from hypothesis import HealthCheck, given, settings, strategies as st

from testbed.node.wire import MAGIC, WireError, decode
from testbed.plan import parse_scenario
from testbed.scenario.safe_yaml import LoadError, load_yaml_text
from testbed.scenario.schema import ScenarioError

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)
scenario_keys = st.sampled_from(["name", "seed", "runtime", "network", "workload", "stop", "algorithm", "profiles",
                                 "ps", "evaluator", "workers", "streaming", "sites", "wan", "links", "events",
                                 "faults"])


@SETTINGS
@given(st.text(max_size=400))
def test_the_yaml_loader_raises_only_load_errors(text):
    try:
        load_yaml_text(text)
    except LoadError:
        pass


@SETTINGS
@given(st.dictionaries(scenario_keys, json_values, max_size=6))
def test_validation_raises_only_scenario_errors(data):
    try:
        parse_scenario({"runtime": "netns", **data})
    except ScenarioError as e:
        assert e.lines and all(isinstance(line, str) and len(line) < 1000 for line in e.lines)


@SETTINGS
@given(st.lists(st.binary(max_size=64), max_size=4), st.booleans())
def test_the_wire_decoder_raises_only_wire_errors(frames, with_magic):
    if with_magic and frames:
        frames[0] = MAGIC + frames[0]
    try:
        decode(frames)
    except WireError:
        pass
