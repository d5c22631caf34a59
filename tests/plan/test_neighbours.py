"""Permanent ARP entries planned per LAN (plan/neighbours.py): a fleet's LAN asks nothing by
broadcast between a device and its hubs, and a small LAN nothing at all."""

from __future__ import annotations

import json
import socket
import subprocess
import threading

import pytest

from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.plan.neighbours import MESH_UP_TO, mac_of, static_neighbours

from helpers import needs_root, netns_cluster


def _spec(workers: int, **extra):
    sc = parse_scenario({"profiles": {"edge": {"cpus": 0.1}}, "workers": [{"count": workers, "profile": "edge"}],
                         **extra})
    return build_cluster(sc, "abcdef")


def _sites_spec():
    sc = parse_scenario({"profiles": {"edge": {"cpus": 0.1}}, "sites": {"a": {}, "b": {}},
                         "wan": {"default": {"bandwidth": "10mbit"}},
                         "ps": {"profile": "edge", "site": "a"}, "evaluator": {"profile": "edge", "site": "a"},
                         "workers": [{"count": 2, "profile": "edge", "site": "b"}]})
    return build_cluster(sc, "abcdef")


def test_a_mac_is_made_from_its_address_locally_administered_and_unicast():
    assert mac_of("10.0.0.2") == "02:eb:0a:00:00:02"
    assert mac_of("192.168.255.254") == "02:eb:c0:a8:ff:fe"
    assert int(mac_of("10.0.0.2")[:2], 16) & 0b11 == 0b10  # local, not multicast
    with pytest.raises(ValueError):
        mac_of("10.0.0.256")


def test_a_small_lan_is_a_mesh_and_a_large_one_pairs_each_device_with_its_hubs():
    small = _spec(3)
    addresses = {n.address for n in small.nodes}
    table = static_neighbours(small)
    assert set(table) == addresses
    assert all(set(v) == addresses - {a} for a, v in table.items())

    large = _spec(MESH_UP_TO)  # and PS, evaluator: past the mesh
    table = static_neighbours(large)
    hubs = {n.address for n in large.nodes if n.role != "worker"}
    assert len(hubs) == 2 and len(table) == MESH_UP_TO + 2
    for node in large.nodes:
        if node.role == "worker":
            assert set(table[node.address]) == hubs
        else:
            assert set(table[node.address]) == {n.address for n in large.nodes} - {node.address}
    assert sum(map(len, table.values())) == 2 * 2 * MESH_UP_TO + 2  # each pair both ways, and PS-evaluator


def test_each_site_is_a_lan_of_its_own_with_its_router_as_a_hub():
    spec = _sites_spec()
    table = static_neighbours(spec)
    routers = {s.name: s.router for s in spec.topology.sites}
    w0, ps = spec.node("w0"), spec.ps
    assert set(table[w0.address]) == {spec.node("w1").address, routers["b"]}  # not the PS: through the router
    assert set(table[routers["a"]]) == {ps.address, spec.evaluator.address}
    assert routers["a"] not in table[w0.address]


def test_the_relay_gateway_is_a_hub_of_the_one_lan():
    spec = _spec(2)
    spec.relay_gateway = True
    table = static_neighbours(spec)
    assert set(table[spec.gateway]) == {n.address for n in spec.nodes}
    assert all(spec.gateway in table[n.address] for n in spec.nodes)


def _neighbours(netns: str) -> dict[str, dict]:
    out = subprocess.run(["ip", "-n", netns, "-j", "neigh", "show", "dev", "eth0"], capture_output=True, text=True,
                         check=True).stdout
    return {e["dst"]: e for e in json.loads(out or "[]")}


@needs_root
def test_a_device_reaches_its_ps_with_no_arp_asked(tmp_path):
    """The entries are there, permanent, with the MAC each interface was given, and a connection
    from a worker to the PS adds no entry on either side (nothing was resolved)."""
    from testbed.kernel.netlink import entered_netns, listening_socket
    from testbed.runtimes.local_nodes import netns_name

    scenario = {"profiles": {"edge": {"cpus": 0.1}}, "workers": [{"count": 2, "profile": "edge"}]}
    with netns_cluster(tmp_path, scenario) as (rt, spec):
        ps = spec.ps
        ps_ns, w0_ns = netns_name(spec.run_id, "ps"), netns_name(spec.run_id, "w0")
        before = _neighbours(w0_ns), _neighbours(ps_ns)
        assert before[0][ps.address]["lladdr"] == mac_of(ps.address) and before[0][ps.address]["state"] == ["PERMANENT"]
        assert set(before[1]) == {n.address for n in spec.nodes} - {ps.address}
        link = json.loads(subprocess.run(["ip", "-n", ps_ns, "-j", "link", "show", "eth0"], capture_output=True,
                                         text=True, check=True).stdout)[0]
        assert link["address"] == mac_of(ps.address)
        server = listening_socket(ps_ns, ps.address, 7123)
        accepted = threading.Thread(target=lambda: server.accept()[0].close(), daemon=True)
        accepted.start()
        with entered_netns(w0_ns):
            socket.create_connection((ps.address, 7123), timeout=5).close()
        accepted.join(5)
        server.close()
        assert (_neighbours(w0_ns), _neighbours(ps_ns)) == before
