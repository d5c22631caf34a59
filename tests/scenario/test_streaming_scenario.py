"""The `streaming:` section of a scenario: broker kinds, rates, traces, and the cluster it makes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from testbed.plan import load_scenario, parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.scenario.schema import KAFKA_IMAGE, ScenarioError

REPO = Path(__file__).resolve().parents[2]


def scenario(**streaming) -> dict:
    return {"workers": [{"count": 2}], "runtime": "netns", "streaming": streaming}


def only_line(data) -> str:
    with pytest.raises(ScenarioError) as ei:
        parse_scenario(data)
    assert len(ei.value.lines) == 1, ei.value.lines
    return ei.value.lines[0]


@pytest.mark.parametrize("broker,needle", [
    ({"kind": "external"}, "streaming.broker: kind external needs bootstrap: host:port"),
    ({"kind": "external", "bootstrap": "kafka"}, "'kafka' is not host:port"),
    ({"kind": "external", "bootstrap": "a:9092,b:9092"}, "is not host:port (one broker)"),
    ({"kind": "external", "bootstrap": "h:70000"}, "is not host:port"),
    ({"kind": "external", "bootstrap": "h:9092", "profile": {"cpus": 1}}, "use producer_profile"),
    ({"kind": "tansu", "bootstrap": "h:9092"}, "bootstrap: only for kind external"),
    ({"kind": "tansu", "upstream": "127.0.0.1:9092"}, "upstream: only for kind external"),
    ({"kind": "external", "bootstrap": "10.77.0.1:9092", "upstream": "x"}, "upstream: 'x' is not host:port"),
    ({"kind": "external", "bootstrap": "192.168.1.5:9092"},
     "bootstrap: the nodes reach an external broker at the run's gateway, 10.77.0.1:9092 (relayed to upstream "
     "'127.0.0.1:9092'), not at '192.168.1.5'"),
    ({"kind": "tansu", "image": "apache/kafka:3.9.0"}, "image: only for kind kafka"),
    ({"kind": "tansu", "producer_profile": {"cpus": 1}}, "producers run on the broker node"),
    ({"kind": "zookeeper"}, "streaming.broker.kind"),
])
def test_bad_broker_names_the_field(broker, needle):
    line = only_line(scenario(broker=broker))
    assert line.startswith("streaming.broker") and needle in line, line


def test_kafka_needs_the_docker_runtime():
    from testbed import runtimes

    sc = parse_scenario(scenario(broker={"kind": "kafka"}))  # the schema takes it; runtime netns refuses it
    [line] = runtimes.scenario_problems(sc)
    assert line == ("streaming.broker.kind: kafka runs Apache Kafka from its image and needs the docker runtime "
                    "(runtime: docker or auto)")


def test_unknown_producer_profile():
    line = only_line(scenario(broker={"kind": "external", "bootstrap": "10.77.0.1:9092", "producer_profile": "nope"}))
    assert line.startswith("streaming.broker.producer_profile: unknown profile 'nope'")


@pytest.mark.parametrize("rates,needle", [
    ([20, 40, 80], "streaming.rates: 3 rates for 2 workers"),
    ([], "an empty list of rates"),
    ([20, {"uniform": {"low": 1, "high": 2}}], "[1]: a list of rates holds numbers or {trace: FILE}"),
    ([20, -5], "[1]: rate must be > 0"),
    ("S3", "rate must be a number > 0, one of S1, S2, S1', S2'"),
    ({"trace": "/nonexistent/trace.csv"}, "no such file"),
])
def test_bad_rates(rates, needle):
    line = only_line(scenario(rates=rates))
    assert line.startswith("streaming.rates") and needle in line, line


def test_kafka_defaults_to_the_official_image_and_makes_a_producer_node():
    sc = parse_scenario({**scenario(broker={"kind": "kafka"}), "runtime": "docker"})  # pure: no engine asked
    spec = build_cluster(sc, "abcdef")
    assert spec.broker.role == "kafka" and spec.broker.image == KAFKA_IMAGE
    assert spec.stream_source.name == "producer" and spec.stream_source.role == "producer"


def test_cluster_nodes_per_broker_kind():
    tansu = build_cluster(parse_scenario(scenario()), "abcdef")
    assert tansu.broker.name == "broker" and tansu.broker.role == "broker" and tansu.stream_source is tansu.broker
    assert not tansu.relay_gateway and tansu.broker.image is None
    ext = build_cluster(parse_scenario(scenario(broker={"kind": "external", "bootstrap": "10.77.0.1:9092",
                                                        "producer_profile": {"cpus": 0.5}})), "abcdef")
    assert ext.broker is None and ext.relay_gateway
    assert ext.stream_source.name == "producer" and ext.stream_source.profile.cpus == 0.5
    assert ext.gateway == "10.77.0.1" and "10.77.0.1" not in [n.address for n in ext.nodes]
    plain = build_cluster(parse_scenario({"workers": [{"count": 2}]}), "abcdef")
    assert plain.broker is None and plain.stream_source is None and not plain.relay_gateway


def test_trace_paths_are_relative_to_the_scenario_file(tmp_path, monkeypatch):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text("time,rate\n0,10\n5,30\n")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario(rates=[{"trace": "traces/t.csv"}, 15])))
    monkeypatch.chdir("/")
    sc = load_scenario(tmp_path / "s.yaml")
    assert sc.streaming.rates[0] == {"trace": str(tmp_path / "traces" / "t.csv")}


def test_shipped_trace_scenario_schedules(tmp_path):
    from testbed.plan.streams import stream_config

    sc = load_scenario(REPO / "scenarios" / "streaming-trace.yaml")
    spec = build_cluster(sc, "abcdef")
    cfg = stream_config(sc, spec)
    assert cfg["schedules"] == {"w0": {"times": [0.0, 15.0, 30.0], "rates": [20.0, 80.0, 40.0]},
                                "w1": {"times": [0.0], "rates": [50.0]}}
    assert cfg["rates"] == {"w0": 20.0, "w1": 50.0}
    assert cfg["bootstrap"] == f"{spec.broker.address}:9092" and cfg["kind"] == "tansu"
    assert cfg["topics"] == {"w0": "edgebed-abcdef-w0", "w1": "edgebed-abcdef-w1"}


def test_compose_file_runs_the_same_kafka_as_kind_kafka():
    from testbed.data.streaming.kafka import kafka_environment

    compose = yaml.safe_load((REPO / "compose" / "kafka.yml").read_text())
    svc = compose["services"]["kafka"]
    assert svc["image"] == KAFKA_IMAGE
    assert svc["environment"] == kafka_environment("${EDGEBED_KAFKA_HOST:-10.77.0.1}", listen_host="127.0.0.1")


class _Err:
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code


def test_broker_watch_fails_after_the_grace_unless_alive():
    from confluent_kafka import KafkaError

    from testbed.data.streaming.broker import BrokerWatch

    w = BrokerWatch("10.77.0.9:9092", grace=0.05)
    w(_Err(KafkaError._TRANSPORT))  # one broker connection failing is not "all down"
    time.sleep(0.06)
    assert w.failed() is None
    w(_Err(KafkaError._ALL_BROKERS_DOWN))
    assert w.failed() is None  # within the grace
    time.sleep(0.06)
    assert w.failed() == "broker 10.77.0.9:9092 unreachable for 0 s"
    w.alive()  # a delivery: it came back
    assert w.failed() is None


def test_an_external_broker_is_reached_from_this_host_at_its_upstream():
    default = parse_scenario(scenario(broker={"kind": "external", "bootstrap": "10.77.0.1:19092"}))
    assert default.streaming.broker.upstream == "127.0.0.1:19092"  # the bootstrap's port, on this host
    other = parse_scenario(scenario(broker={"kind": "external", "bootstrap": "10.77.0.1:9092",
                                            "upstream": "192.168.1.5:29092"}))
    assert other.streaming.broker.upstream == "192.168.1.5:29092"
