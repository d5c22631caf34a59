"""Shaping rules built for given profiles (pure), and installed on real interfaces (root)."""

import pytest

from conftest import needs_root

from testbed.kernel.shaping import KernelCaps, htb_burst, plan_direction
from testbed.scenario.links import Direction

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
