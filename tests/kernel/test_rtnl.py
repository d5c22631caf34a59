"""kernel/rtnl.py: the link, address, neighbour and HTB requests a fleet's bring-up sends encoded by
hand; the kernel must end up with what pyroute2's requests made."""

import socket
import struct
import time
import uuid

import pytest

from testbed.kernel import rtnl
from testbed.kernel.netlink import create_netns, ns_iproute, remove_netns
from testbed.kernel.shaping import change_rate, htb_burst

from helpers import needs_root


def test_attributes_are_padded_and_nested_as_netlink_reads_them():
    a = rtnl.attr(rtnl.IFLA_IFNAME, b"eth0\0")
    assert struct.unpack_from("=HH", a) == (9, rtnl.IFLA_IFNAME) and len(a) == 12 and a[4:9] == b"eth0\0"
    nested = rtnl.attr(rtnl.IFLA_LINKINFO, rtnl.attr(rtnl.IFLA_INFO_KIND, b"veth\0"))
    assert struct.unpack_from("=HH", nested) == (16, rtnl.IFLA_LINKINFO) and nested[4:] == rtnl.attr(1, b"veth\0")


def test_a_rate_table_is_pyroute2_s():
    from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime

    spec, table = rtnl.htb_rate(10_000_000)
    cell_log, linklayer, overhead, align, mpu, rate = rtnl._RATESPEC.unpack(spec)
    assert (cell_log, linklayer, overhead, align, mpu, rate) == (3, 0, 0, -1, 0, 1_250_000)
    assert struct.unpack("=256I", table)[:3] == tuple(int(calc_xmittime(1_250_000, n)) for n in (8, 16, 24))
    assert rtnl._RATESPEC.unpack(rtnl.htb_rate(int(100e9))[0])[5] == (1 << 32) - 1  # the rest in RATE64


@pytest.fixture
def two_namespaces():
    names = [f"eb-rtnl-{uuid.uuid4().hex[:6]}-{k}" for k in ("sw", "n")]
    for n in names:
        create_netns(n, ipv6=False)
    yield names
    for n in names:
        remove_netns(n)


@needs_root
def test_a_node_s_link_address_neighbours_and_isolated_port(two_namespaces):
    sw, node = two_namespaces
    with rtnl.Rtnl(sw) as s:
        with ns_iproute(sw) as ipr:
            ipr.link("add", ifname="br0", kind="bridge")
        br = s.index("br0")
        s.set_link(br, up=True)
        port = s.add_veth("w0", node, "eth0", master=br, up=True)
        with pytest.raises(OSError) as exists:  # the kernel's errors come back as OSError
            s.add_veth("w0", node, "eth1")
        assert exists.value.errno == 17
        s.isolate_port(port)
    with rtnl.Rtnl(node) as n:
        idx = n.index("eth0")
        n.set_link(idx, mac="02:eb:0a:00:00:05")
        n.add_address(idx, "10.0.0.5", 24)
        n.add_neighbour(idx, "10.0.0.1", "02:eb:0a:00:00:01")
        n.add_neighbour(idx, "10.0.0.1", "02:eb:0a:00:00:01")  # replace: twice is fine
        n.set_link(idx, up=True)
        with pytest.raises(OSError) as missing:
            n.index("nothing")
        assert missing.value.errno == 19
    with ns_iproute(sw) as ipr:
        link = ipr.get_links(port)[0]
        assert link.get_attr("IFLA_IFNAME") == "w0" and link.get_attr("IFLA_MASTER") == br
        assert link["flags"] & 1  # up
        proto = ipr.brport("show", index=port)[0].get_attr("IFLA_PROTINFO")
        assert proto.get_attr("IFLA_BRPORT_ISOLATED") == 1
    with ns_iproute(node) as ipr:
        link = ipr.get_links(idx)[0]
        assert link.get_attr("IFLA_ADDRESS") == "02:eb:0a:00:00:05" and link["flags"] & 1
        addrs = [(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=idx, family=socket.AF_INET)]
        assert addrs == [("10.0.0.5", 24)]
        neigh = [(x.get_attr("NDA_DST"), x.get_attr("NDA_LLADDR"), x["state"]) for x in ipr.get_neighbours(ifindex=idx)]
        assert neigh == [("10.0.0.1", "02:eb:0a:00:00:01", rtnl.NUD_PERMANENT)]



@needs_root
def test_a_veth_into_a_process_s_namespace_and_a_default_route(two_namespaces):
    """A fleet host's device (node.fleet.host): its namespace is its process's, named nowhere."""
    import subprocess

    sw, node = two_namespaces
    inside = subprocess.Popen(["ip", "netns", "exec", node, "sleep", "30"])
    try:
        time.sleep(0.3)  # in its namespace by then
        with rtnl.Rtnl(sw) as s:
            s.add_veth("d0", inside.pid, "eth0", up=True)
        with rtnl.Rtnl(node) as n:
            idx = n.index("eth0")
            n.add_address(idx, "10.205.0.2", 24)
            n.set_link(idx, up=True)
            n.add_default_route("10.205.0.1")
            with pytest.raises(OSError) as twice:
                n.add_default_route("10.205.0.1")
            assert twice.value.errno == 17
        with ns_iproute(node) as ipr:
            [route] = [r for r in ipr.get_routes(family=socket.AF_INET, table=254) if r["dst_len"] == 0]
            assert route.get_attr("RTA_GATEWAY") == "10.205.0.1" and route.get_attr("RTA_OIF") == idx
    finally:
        inside.kill()
        inside.wait()

def _htb(ipr, index: int) -> list:
    """What the kernel holds of interface `index`'s HTB root and class 1:10."""
    qdisc = [q for q in ipr.get_qdiscs(index=index) if q.get_attr("TCA_KIND") == "htb"][0]
    cls = [c for c in ipr.get_classes(index=index) if c["handle"] == 0x10010][0]
    parms = cls.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
    init = qdisc.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_INIT")
    return [qdisc["handle"], init["defcls"], init["rate2quantum"], cls["parent"],
            *(parms[k] for k in ("rate", "ceil", "buffer", "cbuffer", "quantum", "prio", "level"))]


@needs_root
@pytest.mark.parametrize("rate_bps", [1_000_000, 10_000_001, 100_000_000, int(100e9)])
def test_an_htb_rate_is_installed_as_pyroute2_installs_it(two_namespaces, rate_bps):
    ns = two_namespaces[0]
    with ns_iproute(ns) as ipr, rtnl.Rtnl(ns) as rt:
        for name in ("a", "b"):
            ipr.link("add", ifname=name, kind="veth", peer=f"{name}p")
        a, b = ipr.link_lookup(ifname="a")[0], ipr.link_lookup(ifname="b")[0]
        burst, rate = htb_burst(rate_bps), f"{rate_bps}bit"
        ipr.tc("add", "htb", index=a, handle=0x10000, default=0x10)
        ipr.tc("add-class", "htb", index=a, handle=0x10010, parent=0x10000, rate=rate, ceil=rate, burst=burst,
               cburst=burst)
        rt.add_htb_qdisc(b, 0x10000, 0x10)
        rt.add_htb_class(b, 0x10010, 0x10000, rate_bps, burst)
        assert _htb(ipr, b) == _htb(ipr, a)
        assert _htb(ipr, b)[4] == min(rate_bps // 8, (1 << 32) - 1)
        # a trace's tick (node.own_link.set_rates): the rate changed in place, as change_rate does
        change_rate(ipr, a, rate_bps // 3)
        rt.add_htb_class(b, 0x10010, 0x10000, rate_bps // 3, htb_burst(rate_bps // 3), change=True)
        assert _htb(ipr, b) == _htb(ipr, a) and _htb(ipr, b)[4] == min(rate_bps // 24, (1 << 32) - 1)


@needs_root
@pytest.mark.parametrize("rate_bps", [10_000_000, int(100e9)])
def test_a_link_s_counters_read_by_hand_are_pyroute2_s(two_namespaces, rate_bps):
    """What a node's own link reads every few seconds (node.own_link: its counters and its HTB
    class, the fidelity monitor's input), read by kernel.rtnl's dumps: pyroute2's numbers."""
    from testbed.kernel.netlink import entered_netns, link_counters
    from testbed.kernel.shaping import htb_stats, read_htb_stats
    from testbed.node.own_link import root_qdisc_bytes

    a_ns, b_ns = two_namespaces
    with ns_iproute(a_ns) as ipr, rtnl.Rtnl(a_ns) as rt:
        a = rt.add_veth("a", b_ns, "b", up=True)
        rt.add_address(a, "10.9.0.1", 24)
        rt.add_htb_qdisc(a, 0x10000, 0x10)
        rt.add_htb_class(a, 0x10010, 0x10000, rate_bps, htb_burst(rate_bps))
        with rtnl.Rtnl(b_ns) as b_rt:
            b = b_rt.index("b")
            b_rt.add_address(b, "10.9.0.2", 24)
            b_rt.set_link(b, up=True)
            b_rt.add_neighbour(b, "10.9.0.1", "02:eb:0a:09:00:01")
        rt.add_neighbour(a, "10.9.0.2", "02:eb:0a:09:00:02")  # no ARP: the packets leave at once
        with entered_netns(a_ns):
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sender:  # until the link's carrier is on (the kernel turns it on a moment after "up")
            deadline = time.monotonic() + 5
            while (htb_stats(rt, a) or {}).get("packets", 0) < 50 and time.monotonic() < deadline:
                for _ in range(50):
                    sender.sendto(b"x" * 1000, ("10.9.0.2", 9))
                time.sleep(0.2)
        mine, theirs = htb_stats(rt, a), read_htb_stats(ipr, a)
        assert mine == theirs and mine["packets"] >= 50 and mine["bytes"] >= 50 * 1000
        assert mine["rate_bps"] == (None if rate_bps >= 100e9 else rate_bps)
        basic = [q for q in ipr.get_qdiscs(index=a) if q["parent"] == 0xFFFFFFFF][0] \
            .get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")
        assert root_qdisc_bytes(rt, a) == {"bytes": basic["bytes"], "packets": basic["packets"]}
        tx = ipr.get_links(a)[0].get_attr("IFLA_STATS64")
        assert link_counters(a_ns)[a][2:] == (tx["tx_bytes"], tx["tx_packets"])
        assert htb_stats(rt, rt.index("lo")) is None and [q.kind for q in rt.tc_objects(a)] == ["htb"]
