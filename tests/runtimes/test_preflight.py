"""Validation is pure; what needs an engine is asked by the runtime's preflight."""
import os

import pytest

from testbed.plan import parse_scenario
from testbed.runtimes import preflight as pf
from testbed.runtimes.docker import runtime as docker_runtime
from testbed.scenario.schema import ScenarioError

GPU = {"runtime": "docker", "profiles": {"gpu": {"gpus": 1}}, "workers": [{"count": 1, "profile": "gpu"}]}
KAFKA = {"runtime": "auto", "workers": [{"count": 2}], "streaming": {"broker": {"kind": "kafka"}}}


def no_engine_contact(*a, **k):
    raise AssertionError("validation contacted the Docker engine")


@pytest.mark.parametrize("data", [GPU, KAFKA])
def test_validation_does_not_contact_the_engine(monkeypatch, data):
    monkeypatch.setattr(docker_runtime, "docker_client", no_engine_contact)
    assert parse_scenario(data).runtime == data["runtime"]


def test_preflight_names_each_field_when_no_engine_answers(monkeypatch):
    monkeypatch.setattr(docker_runtime, "docker_client", lambda timeout: None)
    assert pf.engine_problems(parse_scenario(GPU)) == [
        "profiles.gpu.gpus: GPUs need the docker runtime (or netns), and no Docker engine answers"]
    with pytest.raises(ScenarioError) as e:
        pf.preflight(parse_scenario(KAFKA))
    assert e.value.lines == ["streaming.broker.kind: kafka runs Apache Kafka from its image and needs the docker "
                             "runtime, and no Docker engine answers"]


def test_preflight_names_the_missing_nvidia_runtime(monkeypatch):
    monkeypatch.setattr(docker_runtime, "docker_client", lambda timeout: object())
    monkeypatch.setattr(docker_runtime, "nvidia_runtime_available", lambda client: False)
    assert pf.engine_problems(parse_scenario(GPU)) == [
        "profiles.gpu.gpus: GPUs need the NVIDIA container runtime, which this Docker engine does not have"]
    monkeypatch.setattr(docker_runtime, "nvidia_runtime_available", lambda client: True)
    assert pf.engine_problems(parse_scenario(GPU)) == []


def test_a_scenario_without_engine_needs_asks_nothing(monkeypatch):
    monkeypatch.setattr(docker_runtime, "docker_client", no_engine_contact)
    pf.preflight(parse_scenario({"runtime": "docker", "workers": [{"count": 2}]}))
    monkeypatch.setattr(pf, "host_gpus", lambda: [])
    with pytest.raises(ScenarioError) as e:  # netns GPUs are this machine's: asked of its driver, not an engine
        pf.preflight(parse_scenario({**GPU, "runtime": "netns"}))
    assert e.value.lines == ["profiles.gpu.gpus: 1 GPUs asked for, and this machine has none"]


def test_the_cleanup_core_imports_no_backend_and_runs_every_registered_sweeper(monkeypatch, tmp_path):
    import subprocess
    import sys

    code = ("import sys, testbed.runtimes.state; "
            "print(sorted(m for m in sys.modules if m.startswith('testbed.runtimes.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # errors and ticks: no imports, no backend
    assert out.strip() == "['testbed.runtimes.errors', 'testbed.runtimes.state', 'testbed.runtimes.ticks']"

    from testbed.runtimes import state

    removed = []
    monkeypatch.setattr(state, "SWEEPERS", {})
    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    state.register_sweeper(state.Sweeper("fake", lambda: [("thing", {state.RUN_LABEL: "abc123"})],
                                         lambda rid: removed.append(rid) or ["left"]))
    assert "abc123" in state.known_runs()
    if os.geteuid() == 0:
        assert "left" in state.cleanup_run("abc123", stop_runner=False) and removed == ["abc123"]


def test_a_cpuset_this_machine_lacks_is_named_before_anything_starts():
    sc = parse_scenario({"profiles": {"pinned": {"cpuset": "1,999"}},
                         "workers": [{"count": 1, "profile": "pinned"}, {"count": 1, "profile": {"cpuset": "0"}}]})
    assert pf.cpuset_problems(sc, available={0, 1}) == ["profiles.pinned.cpuset: CPU 999 is not on this machine "
                                                        "(it has 0-1)"]
    assert pf.cpuset_problems(sc, available={0, 1, 999}) == []
    assert pf.cpuset_problems(sc, available={1, 999}) == ["workers[1].profile.cpuset: CPU 0 is not on this machine "
                                                          "(it has 1,999)"]


def test_auto_runs_on_netns_and_says_why_when_no_image_can_be_had(monkeypatch):
    import testbed.runtimes as runtimes
    import testbed.runtimes.engine.images as images

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(docker_runtime, "docker_client", lambda timeout=10: object())
    monkeypatch.setattr(images, "image_unavailable", lambda client: "no node image, no base and no debootstrap")
    said = []
    assert runtimes.select_runtime("auto", said.append) == "netns"
    assert said == ["runtime auto: netns, because no node image, no base and no debootstrap"]
    with pytest.raises(runtimes.RuntimeUnavailable, match="runtime docker: no node image"):
        runtimes.select_runtime("docker")
    monkeypatch.setattr(images, "image_unavailable", lambda client: None)
    assert runtimes.select_runtime("auto") == "docker"


def test_more_workers_than_training_samples_is_one_line_naming_the_field():
    """4,096 workers on mnist5k's 4,000 training samples: every worker would exit once started
    ("cannot give 4096 workers a sample each"); preflight says it before anything is made."""
    def problems(count, **workload):
        return pf.shard_problems(parse_scenario({"workers": [{"count": count}],
                                                 "workload": {"dataset": "mnist5k", **workload}}))

    assert problems(4000) == []
    line, = problems(4001)
    assert line.startswith("workers: 4001 workers and 4000 training samples in workload.dataset 'mnist5k': "), line
    line, = problems(2001, train_fraction=0.5)
    assert line.startswith("workers: 2001 workers and 2000 training samples") and "train_fraction" in line
    assert problems(4500, test_size=500) == [] and len(problems(4501, test_size=500)) == 1
    assert pf.shard_problems(parse_scenario({"workers": [{"count": 5000}],
                                             "workload": {"dataset": "mnist"}})) == []
