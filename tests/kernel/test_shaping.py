"""Shaping rules built for given profiles (pure), and installed on real interfaces (root)."""

import pytest

from testbed.kernel.shaping import KernelCaps, htb_burst, plan_direction
from testbed.scenario.links import Direction

from helpers import needs_root

NO_NETEM = KernelCaps(htb=True, netem=False, tbf=True, ifb=True)
NETEM = KernelCaps(htb=True, netem=True, tbf=True, ifb=True)


def test_rate_only_uses_htb_with_explicit_burst():
    p = plan_direction(Direction(rate=10e6), NO_NETEM)
    assert p.rate_bps == 10e6
    assert p.burst_bytes == htb_burst(10e6) == 3028  # two full frames floor
    assert p.mechanisms == {"rate": "htb"}
    assert p.netem == {} and p.transport_delay_s == 0


def test_burst_scales_with_rate():
    assert htb_burst(1e9) == 125_000  # 1 ms at 1 Gbit/s
    assert htb_burst(1e6) == 3028


def test_netem_kernel_puts_delay_jitter_loss_in_netem():
    p = plan_direction(Direction(rate=20e6, latency=0.02, jitter=0.005, loss=0.01), NETEM)
    assert p.netem["delay"] == 20000 and p.netem["jitter"] == 5000
    assert p.netem["loss"] == pytest.approx(1.0)
    assert p.netem["limit"] >= 1000
    assert p.mechanisms == {"rate": "htb", "latency": "netem", "jitter": "netem", "loss": "netem"}
    assert p.transport_delay_s == 0


def test_without_netem_delay_falls_back_to_transport_and_loss_is_not_claimed():
    p = plan_direction(Direction(rate=20e6, latency=0.02, jitter=0.005, loss=0.01), NO_NETEM)
    assert p.netem == {}
    assert p.transport_delay_s == pytest.approx(0.02)
    assert p.transport_jitter_s == pytest.approx(0.005)
    assert p.mechanisms["latency"].startswith("transport")
    assert p.mechanisms["loss"].startswith("not-applied")


def test_unshaped_direction_plans_nothing():
    p = plan_direction(Direction(), NO_NETEM)
    assert p.rate_bps is None and p.mechanisms == {} and p.to_meta()["netem"] is None


def test_without_netem_loss_uses_bpf_when_the_kernel_can():
    caps = KernelCaps(htb=True, netem=False, tbf=True, ifb=True, bpf_loss=True)
    p = plan_direction(Direction(loss=0.05), caps)
    assert p.bpf_loss == pytest.approx(0.05)
    assert p.mechanisms == {"loss": "bpf (random drop filter; no sch_netem in this kernel)"}
    assert p.rate_bps is None  # no rate is claimed for a loss-only link


def test_bpf_loss_program_threshold():
    import struct

    from testbed.kernel.bpf import RESOLUTION, loss_program

    code = loss_program(0.25)
    assert len(code) == 7 * 8
    opcode, _, off, imm = struct.unpack("<BBhi", code[16:24])  # the compare instruction
    assert (opcode, off, imm) == (0x35, 2, RESOLUTION // 4)


@needs_root
def test_a_node_tries_its_own_kernel_in_its_namespace_and_leaves_nothing_there():
    """What a swarm node answers to `kernel`: the qdiscs tried on a veth pair in its own namespace
    (here a scratch one), the same answer as this machine's probe, and no interface left."""
    import uuid

    from testbed.kernel.netlink import create_netns, ns_iproute, remove_netns
    from testbed.kernel.shaping import probe_kernel, probe_links

    name = f"eb-t-{uuid.uuid4().hex[:6]}"
    create_netns(name)
    try:
        with ns_iproute(name) as ns:
            before = sorted(link.get_attr("IFLA_IFNAME") for link in ns.get_links())
            caps = probe_links(ns)
            after = sorted(link.get_attr("IFLA_IFNAME") for link in ns.get_links())
    finally:
        remove_netns(name)
    assert caps == probe_kernel() and caps.htb and caps.ifb
    assert after == before == ["lo"]


def test_weakest_is_what_every_kernel_has():
    from testbed.kernel.shaping import weakest

    assert weakest([NETEM, NO_NETEM]) == NO_NETEM
    assert weakest([KernelCaps(htb=True, netem=True, tbf=False, ifb=True, bpf_loss=True), NO_NETEM]) == \
        KernelCaps(htb=True, netem=False, tbf=False, ifb=True, bpf_loss=False)


@needs_root
def test_a_veth_made_across_namespaces_with_its_offloads_off():
    """add_veth makes both ends in place under their final names (nothing in the host's namespace),
    disable_offloads' ioctls turn off every feature OFFLOADS names, on both ends, and the end in a
    namespace made with ipv6=False gets no IPv6 address when up (the other end does)."""
    import socket
    import uuid

    from pyroute2 import IPRoute
    from pyroute2.ethtool import Ethtool

    from testbed.kernel.netlink import (
        OFFLOADS,
        add_veth,
        create_netns,
        disable_offloads,
        entered_netns,
        ns_iproute,
        remove_netns,
    )

    a, b = f"eb-t-{uuid.uuid4().hex[:6]}", f"eb-t-{uuid.uuid4().hex[:6]}"
    create_netns(a)
    create_netns(b, ipv6=False)
    try:
        with IPRoute() as host:
            host_before = {link.get_attr("IFLA_IFNAME") for link in host.get_links()}
        with ns_iproute(a) as ns:
            index = add_veth(ns, "sw-end", b, "eth0")
            assert ns.get_links(index)[0].get_attr("IFLA_IFNAME") == "sw-end"
        with IPRoute() as host:
            assert {link.get_attr("IFLA_IFNAME") for link in host.get_links()} == host_before
        with entered_netns(b):
            et = Ethtool()
            try:
                on_before = [k for k, f in et.get_features("eth0").features.items() if k in OFFLOADS and f.enable]
            finally:
                et.close()
        assert on_before, "a new veth starts with some offloads on: the test would show nothing"
        disable_offloads(a, ["sw-end"])
        disable_offloads(b, ["eth0"])
        for netns, ifname in ((a, "sw-end"), (b, "eth0")):
            with entered_netns(netns):
                et = Ethtool()
                try:
                    feats = et.get_features(ifname).features
                finally:
                    et.close()
            assert [k for k in OFFLOADS if k in feats and feats[k].enable] == [], (netns, ifname)
        for netns, ifname in ((a, "sw-end"), (b, "eth0")):
            with ns_iproute(netns) as ns:
                ns.link("set", index=ns.link_lookup(ifname=ifname)[0], state="up")
        v6 = {}
        for netns, ifname in ((a, "sw-end"), (b, "eth0")):
            with ns_iproute(netns) as ns:
                v6[netns] = list(ns.get_addr(family=socket.AF_INET6, index=ns.link_lookup(ifname=ifname)[0]))
        assert len(v6[a]) == 1 and v6[b] == [], v6  # a's end: its link-local address
    finally:
        remove_netns(a)
        remove_netns(b)


@needs_root
def test_link_counters_read_what_a_link_dump_reads():
    """kernel.netlink.link_counters (one RTM_GETSTATS dump, the monitor's each second) against
    pyroute2's IFLA_STATS64 of the same interfaces, after traffic over lo and a veth."""
    import socket
    import uuid

    from testbed.kernel.netlink import (
        LOOPBACK_INDEX,
        create_netns,
        entered_netns,
        link_counters,
        ns_iproute,
        remove_netns,
    )

    ns = f"eb-test-{uuid.uuid4().hex[:6]}"
    create_netns(ns, ipv6=False)
    try:
        with ns_iproute(ns) as ipr:
            ipr.link("set", index=LOOPBACK_INDEX, state="up")
            ipr.link("add", ifname="va", kind="veth", peer={"ifname": "vb"})
            for name in ("va", "vb"):
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
            with entered_netns(ns):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for _ in range(37):
                s.sendto(b"x" * 100, ("127.0.0.1", 9))
            s.close()
            got = link_counters(ns)
            want = {link["index"]: link.get_attr("IFLA_STATS64") for link in ipr.get_links()}
    finally:
        remove_netns(ns)
    assert set(got) == set(want) and len(got) == 3
    for index, st in want.items():
        assert got[index] == (st["rx_bytes"], st["rx_packets"], st["tx_bytes"], st["tx_packets"])
    assert got[LOOPBACK_INDEX][1] >= 37 and got[LOOPBACK_INDEX][0] >= 37 * 128
