"""The docker runtime: internal network, shaped container links, engine limits, labels, teardown."""

import os

import pytest

from helpers import _client, needs_root, our_netns

pytestmark = [needs_root, pytest.mark.root]


@pytest.fixture(scope="module")
def image():
    from testbed.runtimes.engine.images import ensure_node_image

    return ensure_node_image(_client(), say=lambda s: None)


@pytest.fixture
def cluster(image, tmp_path, clean_host):
    import secrets

    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster
    from testbed.runtimes.docker.runtime import DockerRuntime
    from testbed.runtimes.state import RunState

    client = _client()
    sc = parse_scenario({
        "name": "t", "runtime": "docker",
        "profiles": {"edge": {"cpus": 0.5, "memory": "300m", "uplink": "10mbit", "downlink": "30mbit"}},
        "workers": [{"count": 1, "profile": "edge"}],
    })
    run_id = secrets.token_hex(3)
    state = RunState(run_id=run_id, runner_pid=os.getpid(), run_dir=str(tmp_path), scenario="t", runtime="docker")
    state.save()
    rt = DockerRuntime(state, client, image)
    spec = build_cluster(sc, run_id)
    try:
        rt.create(spec)
        yield rt, spec, client
    finally:
        stop = rt.make_stop_event()
        stop.set()
        assert rt.teardown() == []
        assert client.containers.list(all=True, filters={"label": f"edgebed.run={run_id}"}) == []
        assert client.networks.list(filters={"label": f"edgebed.run={run_id}"}) == []
        assert not [n for n in our_netns() if run_id in n]


def test_network_is_internal_with_the_scenarios_subnet(cluster):
    rt, spec, client = cluster
    net = client.networks.get(rt.network.id)
    assert net.attrs["Internal"] is True
    assert net.attrs["IPAM"]["Config"][0]["Subnet"] == spec.subnet
    assert net.attrs["Labels"]["edgebed.run"] == rt.run_id


def test_container_links_shaped_from_the_host(cluster):
    from testbed.kernel.netlink import in_netns
    from testbed.kernel.shaping import read_htb_class

    rt, spec, client = cluster
    h = rt.handles["w0"]
    with in_netns(h.netns) as ns:
        idx = ns.link_lookup(ifname="eth0")[0]
        assert read_htb_class(ns, idx)["rate_bps"] == pytest.approx(10e6, rel=0.01)
        addrs = [a.get_attr("IFA_ADDRESS") for a in ns.get_addr(index=idx)]
        assert spec.node("w0").address in addrs
    assert read_htb_class(rt._host_ipr, h.host_ifindex)["rate_bps"] == pytest.approx(30e6, rel=0.01)


def test_engine_limits_and_labels(cluster):
    rt, spec, client = cluster
    c = client.containers.get(rt.handles["w0"].container.id)
    assert c.attrs["HostConfig"]["NanoCpus"] == 500_000_000
    assert c.attrs["HostConfig"]["Memory"] == 300 * 1024 ** 2
    assert c.labels["edgebed"] == "1" and c.labels["edgebed.run"] == rt.run_id
    assert rt.node_meta()["w0"]["compute"]["cpu_quota"] == 0.5


@pytest.mark.serial  # it measures the cores a quota gives: beside another lane's load one read 0.449 of 0.5
def test_cpu_quota_benchmark_in_docker(image, clean_host):
    from testbed.bench.cpu import cpu_benchmark

    res = cpu_benchmark(0.5, seconds=3, say=lambda s: None, runtime="docker")
    assert res["achieved_cores"] == pytest.approx(0.5, abs=0.05)


@pytest.mark.serial  # it measures the cores a quota gives: beside another lane's load one read 0.449 of 0.5
def test_cpu_period_in_docker(image, clean_host):
    from testbed.bench.cpu import cpu_benchmark

    res = cpu_benchmark(0.5, seconds=2, say=lambda s: None, runtime="docker", cpu_period=0.02)
    assert res["cpu_period_s"] == pytest.approx(0.02)  # read back from the container's cgroup
    assert res["achieved_cores"] == pytest.approx(0.5, abs=0.05)


def test_link_benchmark_in_docker(image, clean_host):
    from testbed.bench.links import link_benchmark

    res = link_benchmark("10mbit", seconds=4, say=lambda s: None, runtime="docker")
    for r in res["results"]:
        assert 9.3e6 <= r["goodput_bps"] <= 10.0e6, r


def test_gpu_profile_without_nvidia_runtime_fails_validation():
    from testbed.plan import parse_scenario
    from testbed.runtimes.engine.client import docker_client, nvidia_runtime_available
    from testbed.runtimes.preflight import preflight
    from testbed.scenario.schema import ScenarioError

    c = docker_client(timeout=3)
    if c is not None and nvidia_runtime_available(c):
        pytest.skip("this engine has the NVIDIA runtime")
    sc = parse_scenario({"runtime": "docker", "profiles": {"gpu": {"gpus": 1}},
                         "workers": [{"count": 1, "profile": "gpu"}]})
    with pytest.raises(ScenarioError) as e:  # validation is pure: the engine is asked by the preflight
        preflight(sc)
    assert len(e.value.lines) == 1
    assert e.value.lines[0].startswith("profiles.gpu.gpus: GPUs need")


def test_a_default_subnet_the_engine_holds_moves_to_the_next_free_block(image):
    """On the real engine: a network (not a run's) holds the plan's subnet, so the run's network is
    made on the next /16, and every planned address moves with it."""
    import secrets

    import docker

    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster
    from testbed.runtimes.docker.network import create_run_network

    client, tag = _client(), secrets.token_hex(3)
    sc = parse_scenario({"name": "t", "runtime": "docker", "workers": [{"count": 2}]})
    spec = build_cluster(sc, tag)
    # a block no other test's run asks for, so a parallel lane cannot take it between the calls
    spec.move_to("10.151.0.0/16")
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet="10.151.0.0/16")])
    holder = client.networks.create(f"eb-test-holder-{tag}", driver="bridge", internal=True, ipam=ipam)
    said: list[str] = []
    made = None
    try:
        made = create_run_network(client, spec, lambda subnet, gw: client.networks.create(
            f"eb-test-moved-{tag}", driver="bridge", internal=True,
            ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet, gateway=gw)])),
            said.append)
        made.reload()
        assert made.attrs["IPAM"]["Config"][0]["Subnet"] == "10.152.0.0/16" == spec.subnet
        assert spec.node("w1").address.startswith("10.152.0.") and spec.gateway == "10.152.0.1"
        assert said == ["network.subnet: 10.151.0.0/16 is in use on this Docker engine; this run uses "
                        "10.152.0.0/16 (name a subnet in the scenario to choose it)"]
    finally:
        for net in (made, holder):
            if net is not None:
                net.remove()
