"""Choosing the run's Docker subnet (runtimes/docker/network.py) against a stand-in engine."""

import pytest

from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.runtimes.docker.network import candidates, create_run_network


class FakeNet:
    def __init__(self, name, subnet):
        self.name, self.attrs = name, {"IPAM": {"Config": [{"Subnet": subnet}]}}


class FakeEngine:
    """Holds networks by subnet; `late` ones appear only when a create is tried (a run that won the race)."""

    def __init__(self, held=(), late=()):
        self.nets = [FakeNet(f"n{i}", s) for i, s in enumerate(held)]
        self.late, self.tried = list(late), []
        self.networks = self

    def list(self):
        return list(self.nets)

    def create(self, subnet, gateway):
        import docker

        self.tried.append(subnet)
        if subnet in self.late:
            self.late.remove(subnet)
            self.nets.append(FakeNet("racer", subnet))
            raise docker.errors.APIError("403 Forbidden (\"Pool overlaps with other one on this address space\")")
        self.nets.append(FakeNet("ours", subnet))
        return (subnet, gateway)


def _spec(**network):
    sc = parse_scenario({"name": "t", "runtime": "docker", "workers": [{"count": 3}],
                         **({"network": network} if network else {})})
    return build_cluster(sc, "abc123")


def test_a_free_default_subnet_stays_where_it_is():
    spec, said = _spec(), []
    engine = FakeEngine(held=["172.17.0.0/16"])
    assert create_run_network(engine, spec, engine.create, said.append) == ("10.77.0.0/16", "10.77.0.1")
    assert said == [] and spec.node("w0").address.startswith("10.77.0.")


def test_a_held_default_subnet_moves_and_every_address_keeps_its_offset():
    spec, said = _spec(), []
    before = {n.name: n.address for n in spec.nodes}
    engine = FakeEngine(held=["10.77.0.0/16", "10.78.0.0/24"])  # the second overlaps the next /16 too
    assert create_run_network(engine, spec, engine.create, said.append) == ("10.79.0.0/16", "10.79.0.1")
    assert engine.tried == ["10.79.0.0/16"]
    assert {n.name: n.address for n in spec.nodes} == {k: v.replace("10.77.", "10.79.", 1) for k, v in before.items()}
    assert said and "10.77.0.0/16 is in use" in said[0] and "uses 10.79.0.0/16" in said[0]


def test_a_run_that_wins_the_race_sends_the_other_to_the_next_block():
    spec = _spec()
    engine = FakeEngine(late=["10.77.0.0/16"])
    assert create_run_network(engine, spec, engine.create, lambda s: None)[0] == "10.78.0.0/16"
    assert engine.tried == ["10.77.0.0/16", "10.78.0.0/16"]


def test_a_subnet_the_scenario_names_is_never_moved():
    spec = _spec(subnet="10.77.0.0/16")
    engine = FakeEngine(held=["10.77.0.0/16"])
    with pytest.raises(RuntimeError, match=r"^network.subnet: 10.77.0.0/16 overlaps the Docker engine's network n0; "):
        create_run_network(engine, spec, engine.create, lambda s: None)
    assert engine.tried == [] and spec.subnet == "10.77.0.0/16"


def test_an_external_broker_pins_the_subnet_its_bootstrap_is_in():
    sc = parse_scenario({"name": "t", "runtime": "docker", "workers": [{"count": 2}],
                         "streaming": {"broker": {"kind": "external", "bootstrap": "10.77.0.1:9092"},
                                       "rates": [10, 10]}})
    spec = build_cluster(sc, "abc123")
    assert spec.subnet_fixed
    with pytest.raises(ValueError, match="cannot move"):
        spec.move_to("10.78.0.0/16")


def test_candidates_stay_private_and_of_the_same_size():
    blocks = [str(b) for b in candidates("10.254.0.0/16")]
    assert blocks == ["10.254.0.0/16", "10.255.0.0/16"]  # 11.0.0.0/16 is public: not offered
    assert [str(b) for b in candidates("192.168.250.0/24")][:2] == ["192.168.250.0/24", "192.168.251.0/24"]


@pytest.mark.parametrize("named", [False, True])
def test_up_s_overrides_and_api_vary_leave_the_subnet_as_the_scenario_did(named):
    """`edgebed up --runtime docker` re-validates the scenario with the override: a default subnet
    dumped and read back looked named, and two lanes' runs collided on it (10.77.0.0/16)."""
    from testbed.cli.core import _overridden
    from testbed.run.api import vary

    sc = parse_scenario({"name": "t", "runtime": "netns", "workers": [{"count": 2}],
                         **({"network": {"subnet": "10.77.0.0/16"}} if named else {})})
    for again in (_overridden(sc, "docker", None, [], False), vary(sc, {"stop.seconds": 5})):
        assert again.network.subnet == "10.77.0.0/16"
        assert build_cluster(again, "abc123").subnet_fixed is named
