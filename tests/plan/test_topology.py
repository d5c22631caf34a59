"""Sites and WAN links: the schema and its errors, the plan (subnets, routes, path delays), the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.plan import load_scenario, parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.plan.topology import plan_topology
from testbed.scenario.schema import ScenarioError

REPO = Path(__file__).resolve().parents[2]


def two_sites(**extra) -> dict:
    data = {"runtime": "netns", "sites": {"a": {}, "b": {}},
            "workers": [{"count": 2, "site": "a"}, {"count": 1, "site": "b"}]}
    data.update(extra)
    return data


def lines_of(data) -> list[str]:
    with pytest.raises(ScenarioError) as ei:
        parse_scenario(data)
    return ei.value.lines


@pytest.mark.parametrize("data,needle", [
    (two_sites(ps={"site": "c"}), "ps.site: unknown site 'c' (defined: a, b)"),
    ({"workers": [{"count": 1, "site": "a"}]}, "workers[0].site: unknown site 'a' (no sites are defined)"),
    (two_sites(wan={"links": [{"between": ["a", "z"]}]}), "wan.links[0].between: unknown site 'z'"),
    (two_sites(wan={"links": [{"between": ["a", "a"]}]}), "wan.links[0].between: a link from site 'a' to itself"),
    (two_sites(wan={"links": [{"between": ["a", "b"]}, {"between": ["b", "a"]}]}),
     "wan.links[1].between: a second link between 'b' and 'a'"),
    (two_sites(wan={"mesh": False}), "wan: the topology is disconnected: no WAN path from 'a' to 'b'"),
    ({"wan": {"links": [{"between": ["a", "b"]}]}}, "wan.links: WAN links need sites"),
    (two_sites(sites={"A-1": {}}), "sites: 'A-1' is not a site name"),
    (two_sites(sites={"a": {"lan": "nope"}, "b": {}}), "sites.a.lan: unknown profile 'nope'"),
    (two_sites(wan={"default": {"bandwidth": "-5mbit"}}), "wan.default.bandwidth: '-5mbit' is not a rate"),
    (two_sites(wan={"links": [{"between": ["a"]}]}), "wan.links[0].between"),
    (two_sites(network={"subnet": "10.1.0.0/28"}), "network.subnet: 10.1.0.0/28 is too small for 2 sites"),
])
def test_topology_errors_name_the_field(data, needle):
    lines = lines_of(data)
    assert any(needle in line for line in lines), lines


def test_too_many_nodes_for_a_site():
    lines = lines_of(two_sites(network={"subnet": "10.1.0.0/26"}, workers=[{"count": 20, "site": "a"}]))
    assert any(line.startswith("sites.a: 22 nodes do not fit its subnet 10.1.0.0/28") for line in lines), lines


def test_mesh_plan_subnets_routers_and_wan_addresses():
    sc = parse_scenario(two_sites(sites={"a": {}, "b": {}, "c": {}},
                                  wan={"default": {"bandwidth": "100mbit", "latency": "10ms"},
                                       "links": [{"between": ["c", "a"], "forward": "5mbit"}]}))
    topo = plan_topology(sc)
    assert [(s.name, s.subnet, s.router) for s in topo.sites] == [
        ("a", "10.77.0.0/24", "10.77.0.1"), ("b", "10.77.1.0/24", "10.77.1.1"), ("c", "10.77.2.0/24", "10.77.2.1")]
    pairs = {(e.a, e.b): e for e in topo.edges}
    assert set(pairs) == {("a", "b"), ("c", "a"), ("b", "c")}  # the override keeps its own orientation
    ca = pairs[("c", "a")]
    assert ca.forward.rate == 5e6 and ca.reverse.rate == 100e6  # forward = c -> a, reverse from the default
    assert ca.forward.latency == 0.01 and ca.reverse.latency == 0.01
    assert ca.a_address.startswith("10.77.255.") and ca.prefixlen == 30
    assert topo.routes("a") == {"10.77.1.0/24": (pairs[("a", "b")].b_address, "wan-b"),
                                "10.77.2.0/24": (ca.a_address, "wan-c")}


def test_star_routes_through_the_hub_and_delays_add_up():
    sc = load_scenario(REPO / "scenarios" / "topologies" / "edge-star.yaml")
    topo = plan_topology(sc)
    assert len(topo.sites) == 9 and len(topo.edges) == 8
    assert topo.path("e1", "e2") == ["e1", "dc", "e2"]
    via, ifname = topo.routes("e1")[topo.site("e2").subnet]
    assert ifname == "wan-dc" and via == topo.edge("e1", "dc").peer_address("e1")
    assert topo.path_delay("e1", "dc") == (pytest.approx(0.05), 0.0)
    assert topo.path_delay("e1", "e2") == (pytest.approx(0.10), 0.0)


def test_asymmetric_home_gateway_links():
    topo = plan_topology(load_scenario(REPO / "scenarios" / "topologies" / "home-gateways.yaml"))
    e = topo.edge("h1", "dc")
    assert (e.a, e.b) == ("h1", "dc")
    assert e.direction_from("h1").rate == 10e6 and e.direction_from("dc").rate == 100e6


def test_cluster_places_nodes_in_sites_and_merges_the_lan_profile():
    sc = parse_scenario(two_sites(profiles={"lan": {"bandwidth": "1gbit", "latency": "1ms"},
                                            "slow": {"cpus": 0.5, "uplink": "10mbit"}},
                                  sites={"a": {"lan": "lan"}, "b": {"lan": "lan"}},
                                  workers=[{"count": 2, "site": "a"}, {"count": 1, "site": "b", "profile": "slow"}]))
    spec = build_cluster(sc, "abcdef")
    by = {n.name: n for n in spec.nodes}
    assert {n: by[n].site for n in by} == {"ps": "a", "w0": "a", "w1": "a", "w2": "b", "eval": "a"}
    assert by["ps"].address == "10.77.0.2" and by["w2"].address == "10.77.1.2"
    # the node's own profile wins field by field; the rest comes from its site's LAN
    assert by["w2"].link.uplink.rate == 10e6 and by["w2"].link.downlink.rate == 1e9
    assert by["w2"].link.uplink.latency == 0.001
    assert by["w0"].link.uplink.rate == 1e9


def test_without_sites_nothing_changes():
    spec = build_cluster(parse_scenario({"workers": [{"count": 2}]}), "abcdef")
    assert spec.topology is None and all(n.site is None for n in spec.nodes)
    assert [n.address for n in spec.nodes] == ["10.77.0.2", "10.77.0.3", "10.77.0.4", "10.77.0.5"]


def test_receivers_hold_messages_for_the_wan_path_delay():
    from testbed.node.transport import DelayLine, DelaySpec
    from testbed.plan.delays import transport_delays

    sc = load_scenario(REPO / "scenarios" / "topologies" / "edge-star.yaml")
    spec = build_cluster(sc, "abcdef")
    plans = {n.name: {"uplink": {"transport_delay_s": 0.0, "transport_jitter_s": 0.0},
                      "downlink": {"transport_delay_s": 0.0, "transport_jitter_s": 0.0}} for n in spec.nodes}
    ps = transport_delays(spec.ps, plans, spec, wan_by_transport=True)
    assert ps["paths"]["w0"] == [pytest.approx(0.05), 0.0] and "eval" not in ps["paths"]  # eval shares the PS's site
    w0 = transport_delays(spec.node("w0"), plans, spec, wan_by_transport=True)
    assert w0["paths"]["ps"] == [pytest.approx(0.05), 0.0] and w0["paths"]["w1"] == [pytest.approx(0.10), 0.0]
    assert transport_delays(spec.ps, plans, spec, wan_by_transport=False)["paths"] == {}  # netem does it
    line = DelayLine(DelaySpec(paths={"w0": [0.05, 0.0], "ps": [0.02, 0.0]}))
    line.hold("from w0", "w0", 0.0, 0.0, now=100.0)
    line.hold("from ps", None, 0.0, 0.0, now=100.0)  # a DEALER's sender is the PS
    assert line.ready(now=100.019) == []
    assert line.ready(now=100.02) == ["from ps"]
    assert line.ready(now=100.05) == ["from w0"]


@pytest.mark.parametrize("links,needle", [
    ([{"between": ["w0", "w9"]}], "links[0].between: unknown node 'w9'"),
    ([{"between": ["w0", "w0"]}], "links[0].between: a link from node 'w0' to itself"),
    ([{"between": ["w0", "ps"]}, {"between": ["ps", "w0"]}], "links[1].between: a second link between 'ps' and 'w0'"),
    ([{"between": ["w0", "ps"], "bandwidth": "fast"}], "links[0].bandwidth: 'fast' is not a rate"),
])
def test_node_link_errors(links, needle):
    lines = lines_of({"workers": [{"count": 2}], "links": links})
    assert any(needle in line for line in lines), lines


def test_per_destination_plan_classes_and_filters():
    from testbed.kernel.shaping import KernelCaps, plan_direction

    sc = parse_scenario({"profiles": {"edge": {"bandwidth": "40mbit"}}, "workers": [{"count": 2, "profile": "edge"}],
                         "links": [{"between": ["w0", "w1"], "forward": {"rate": "8mbit", "latency": "5ms"},
                                    "reverse": "16mbit"}]})
    spec = build_cluster(sc, "abcdef")
    w0, w1 = spec.node("w0"), spec.node("w1")
    assert [(p.peer, p.match, p.direction.rate) for p in w0.link.uplink_peers] == [("w1", "dst", 8e6)]
    assert [(p.peer, p.match, p.direction.rate) for p in w1.link.downlink_peers] == [("w0", "src", 8e6)]
    assert [(p.peer, p.match, p.direction.rate) for p in w1.link.uplink_peers] == [("w0", "dst", 16e6)]
    no_netem = KernelCaps(htb=True, netem=False, tbf=True, ifb=True, bpf_loss=True)
    up = plan_direction(w0.link.uplink, no_netem, w0.link.uplink_peers)
    assert up.rate_bps == 40e6 and len(up.peers) == 1
    cls = up.peers[0]
    assert (cls.classid, cls.rate_bps, cls.address) == (0x10020, 8e6, w1.address)
    assert cls.transport_delay_s == 0.005 and cls.mechanisms["latency"].startswith("transport")
    down = plan_direction(w1.link.downlink, no_netem, w1.link.downlink_peers)
    assert down.peers[0].transport_delay_s == 0.0  # the pair's delay is made once, on the sender's side
    netem = KernelCaps(htb=True, netem=True, tbf=True, ifb=True)
    assert plan_direction(w0.link.uplink, netem, w0.link.uplink_peers).peers[0].netem["delay"] == 5000
    meta = up.to_meta()["peers"][0]
    assert meta["match"] == f"dst {w1.address}" and meta["class"] == "1:20"
    # the receiver's transport holds w0's messages for the pair's latency (no netem)
    from testbed.plan.delays import transport_delays

    plans = {n.name: {"uplink": {"transport_delay_s": 0.0, "transport_jitter_s": 0.0},
                      "downlink": {"transport_delay_s": 0.0, "transport_jitter_s": 0.0}} for n in spec.nodes}
    assert transport_delays(w1, plans, spec, wan_by_transport=True)["paths"] == {"w0": [0.005, 0.0]}
    assert transport_delays(w0, plans, spec, wan_by_transport=True)["paths"] == {}  # reverse has no latency


def test_placement_gives_every_node_a_host():
    from testbed.plan.cluster import build_cluster
    from testbed.plan.placement import SingleHost, place

    spec = place(build_cluster(parse_scenario({"workers": [{"count": 3}]}), "abcdef"), SingleHost("edge-1"))
    assert {n.name: n.host for n in spec.nodes} == {"ps": "edge-1", "w0": "edge-1", "w1": "edge-1", "w2": "edge-1",
                                                    "eval": "edge-1"}

    class Partial:
        def place(self, spec):
            return {"ps": "a"}

    with pytest.raises(ValueError, match="placement: no host for w0, w1, w2, eval"):
        place(build_cluster(parse_scenario({"workers": [{"count": 3}]}), "abcdef"), Partial())
