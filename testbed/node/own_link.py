"""A node shaping its own access link from inside (runtime swarm, where the runner is on another
host and cannot reach the node's namespace): the same plans as the other runtimes
(kernel.shaping), the uplink on the egress of the node's interface on the run's network, the
downlink on the egress of an IFB device that the interface's ingress is redirected to (the
usual way to shape what arrives). Needs CAP_NET_ADMIN in the container.
"""

from __future__ import annotations

import errno
import ipaddress
from contextlib import contextmanager
from typing import Optional

from testbed.errors import HostCannot, RunFailed
from testbed.kernel.netlink import disable_offloads
from testbed.kernel.shaping import HTB_CLASS, HTB_HANDLE, DirectionPlan, PeerPlan, apply_direction, htb_burst, reshape

IFB = "ifb0"
IFB_QUEUE = 1000  # packets, a veth's default
BLACKHOLE = "ifb-drop"  # an IFB kept down: a redirect to it is a drop (kernels without the gact action)
ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
CLSACT_INGRESS, CLSACT_EGRESS = 0xFFFFFFF2, 0xFFFFFFF3  # the clsact qdisc's two hooks
REDIRECT_PRIO = 1000  # the IFB redirect runs after the partition's drops (prio 1..999)
EVERYONE_PRIO = 999  # a cut from everyone's filters (one peer's: 1..998)


def plan_from_dict(d: dict) -> DirectionPlan:
    """The inverse of dataclasses.asdict for a DirectionPlan (how plans travel in requests)."""
    return DirectionPlan(**{**d, "peers": [PeerPlan(**p) for p in d.get("peers", [])]})


def iface_with(ipr, address: str) -> int:
    """The index of the interface that holds `address` (the node's address on the run's network)."""
    for a in ipr.get_addr(family=2):
        if a.get_attr("IFA_ADDRESS") == address:
            return a["index"]
    raise HostCannot(f"no interface holds {address}")


def _ifb(ipr, ifindex: int) -> int:
    """IFB0, with every packet arriving at `ifindex` redirected to its egress."""
    if not ipr.link_lookup(ifname=IFB):
        ipr.link("add", ifname=IFB, kind="ifb")
    ifb = ipr.link_lookup(ifname=IFB)[0]
    # an IFB's queue is 32 packets: TCP's bursts overflow it and the link reads 4-8% low (measured)
    ipr.link("set", index=ifb, txqlen=IFB_QUEUE, state="up")
    ipr.tc("add", "clsact", index=ifindex)  # ingress, and egress filters ahead of the root qdisc (cuts)
    ipr.tc("add-filter", "u32", index=ifindex, parent=CLSACT_INGRESS, prio=REDIRECT_PRIO, protocol=ETH_P_ALL,
           target=0x10,
           keys=["0x0/0x0+0"], action={"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": ifb})
    return ifb


@contextmanager
def _bpf_permission():
    """The loss fallback's eBPF filter needs more than NET_ADMIN: say so instead of EPERM."""
    from testbed.kernel.bpf import BpfError

    try:
        yield
    except BpfError as e:
        if e.errno == errno.EPERM:
            raise HostCannot("loss without netem is an eBPF filter, which needs CAP_SYS_ADMIN in the node: runtime "
                               "swarm grants it to nodes whose links have loss from the start") from None
        raise


def _ip_key(address: str, offset: int) -> str:
    """A u32 key matching an IPv4 address at `offset` of the IP header (12: source, 16: destination)."""
    return f"0x{int(ipaddress.IPv4Address(address)):08x}/0xffffffff+{offset}"


def _net_key(net: ipaddress.IPv4Network, offset: int) -> str:
    """A u32 key matching the IPv4 addresses of `net` at `offset` of the IP header."""
    return f"0x{int(net.network_address):08x}/0x{int(net.netmask):08x}+{offset}"


def spared_complement(spare: list[str]) -> list[ipaddress.IPv4Network]:
    """Every IPv4 address but `spare`, as prefixes (32 for one spared address)."""
    nets = [ipaddress.IPv4Network("0.0.0.0/0")]
    for address in spare:
        host = ipaddress.IPv4Network(f"{address}/32")
        nets = [piece for net in nets for piece in (net.address_exclude(host) if host.subnet_of(net) else [net])]
    return sorted(nets)


def _blackhole(ipr) -> dict:
    if not ipr.link_lookup(ifname=BLACKHOLE):
        ipr.link("add", ifname=BLACKHOLE, kind="ifb")
    return {"kind": "mirred", "direction": "egress", "action": "redirect",
            "ifindex": ipr.link_lookup(ifname=BLACKHOLE)[0]}


class OwnLink:
    """`netns`: the named namespace the link is in (a fleet host's device, shaped by the host's
    one process: node.fleet.device); None: the caller's own."""

    def __init__(self, netns: Optional[str] = None):
        self.netns = netns
        self.ifindex: Optional[int] = None
        self.ifb: Optional[int] = None
        self.cuts: dict[str, int] = {}  # peer address -> prio of the filters dropping its traffic
        self.everyone = False  # cut off from every address but the runner's path (cut_everyone)
        self.everyone_kind = "u32"  # the classifier that cut is made of
        self.bpf_cuts: Optional[bool] = None  # whether this node may cut by eBPF (None: not tried yet)
        self._drop: Optional[dict] = None  # the drop action this kernel has

    def _iproute(self):
        from pyroute2 import IPRoute

        from testbed.kernel.netlink import ns_iproute

        return IPRoute() if self.netns is None else ns_iproute(self.netns)

    def shape(self, address: str, uplink: dict, downlink: dict, routes: Optional[dict] = None) -> str:
        """Shape the interface holding `address`; `routes` (other sites' subnets -> the site's
        router) where the run has sites."""
        from testbed.kernel.rtnl import Rtnl

        up, down = plan_from_dict(uplink), plan_from_dict(downlink)
        with self._iproute() as ipr, Rtnl(self.netns) as rt:  # (the HTB classes by kernel.rtnl: 1 ms less each)
            self.ifindex = iface_with(ipr, address)
            ifname = ipr.get_links(self.ifindex)[0].get_attr("IFLA_IFNAME")
            apply_direction(ipr, self.ifindex, up, rt=rt)
            self.ifb = _ifb(ipr, self.ifindex)
            apply_direction(ipr, self.ifb, down, rt=rt)
            for subnet, via in (routes or {}).items():
                ipr.route("add", dst=subnet, gateway=via)
        disable_offloads(self.netns, [ifname])  # MTU-sized packets: see kernel.netlink.disable_offloads
        return f"{ifname} shaped: up {up.rate_bps} bit/s, down {down.rate_bps} bit/s (on {IFB})"

    def reshape(self, which: str, old: dict, new: dict) -> str:
        if self.ifindex is None:
            raise RunFailed("the link is not shaped yet")
        with self._iproute() as ipr, _bpf_permission():
            reshape(ipr, self.ifindex if which == "up" else self.ifb, plan_from_dict(old), plan_from_dict(new))
        return f"{which} reshaped"

    def set_rates(self, rates: dict[str, float]) -> None:
        """A trace replay's tick: the HTB class's rate of each direction changed in place (by
        kernel.rtnl, as kernel.shaping.change_rate changes it: no pyroute2 in a node's every tick)."""
        from testbed.kernel.rtnl import Rtnl

        if self.ifindex is None or self.ifb is None:
            raise RunFailed("the link is not shaped yet")
        with Rtnl(self.netns) as rt:
            for which, rate in rates.items():
                rt.add_htb_class(self.ifindex if which == "up" else self.ifb, HTB_CLASS, HTB_HANDLE, int(rate),
                                 htb_burst(rate), change=True)

    def cut(self, addresses: list[str], cut: bool) -> str:
        """Drop everything to and from `addresses` (cut), or stop dropping it (heal): u32 filters
        on the interface's clsact hooks, ahead of shaping; the rest of the traffic is untouched."""
        if self.ifindex is None:
            raise RunFailed("the link is not shaped yet")
        with self._iproute() as ipr:
            for address in addresses:
                if cut and address not in self.cuts:
                    self.cuts[address] = min(set(range(1, EVERYONE_PRIO)) - set(self.cuts.values()))
                    for kw in self._drop_filters(address):
                        self._add_drop(ipr, kw)
                elif not cut and address in self.cuts:
                    for kw in self._drop_filters(address):
                        ipr.tc("del-filter", "u32", **kw)
                    del self.cuts[address]
        return f"{'cut' if cut else 'healed'} {', '.join(addresses)}"

    def cut_everyone(self, cut: bool, spare: list[str]) -> str:
        """Drop everything to and from every address but `spare` (the runner's path), or stop:
        one eBPF classifier each way where the node may load one (kernel.bpf.cut_program), else
        the addresses that are not spared as a few u32 prefixes (at most 32 a spared address),
        one filter each way each; whatever the cluster's size."""
        if self.ifindex is None:
            raise RunFailed("the link is not shaped yet")
        with self._iproute() as ipr:
            if cut and not self.everyone:
                self.everyone_kind = "bpf" if self._cut_everyone_bpf(ipr, spare) else "u32"
                if self.everyone_kind == "u32":
                    self._cut_everyone_u32(ipr, spare)
            elif not cut and self.everyone:
                for parent in (CLSACT_EGRESS, CLSACT_INGRESS):  # every filter of the priority
                    ipr.tc("del-filter", self.everyone_kind, index=self.ifindex, parent=parent, prio=EVERYONE_PRIO,
                           protocol=ETH_P_IP, **({"target": 0x10, "keys": ["0x0/0x0+0"]}  # (pyroute2 wants them)
                                                 if self.everyone_kind == "u32" else {}))
        self.everyone = cut
        return f"{'cut off from' if cut else 'healed with'} everyone" + (f" but {', '.join(spare)}" if spare else "")

    def _cut_everyone_bpf(self, ipr, spare: list[str]) -> bool:
        """The cut as one classifier each way (2-3 ms); False where eBPF is not to be had (no
        CAP_SYS_ADMIN in the node, no cls_bpf): then no filter is left of it."""
        from pyroute2.netlink.exceptions import NetlinkError

        from testbed.kernel.bpf import BpfError, attach_cut

        if self.bpf_cuts is False:
            return False
        try:
            for parent, offset in ((CLSACT_EGRESS, 14 + 16), (CLSACT_INGRESS, 14 + 12)):
                attach_cut(ipr, self.ifindex, parent, EVERYONE_PRIO, offset, spare)
            self.bpf_cuts = True
        except (BpfError, NetlinkError):
            self.bpf_cuts = False
            for parent in (CLSACT_EGRESS, CLSACT_INGRESS):
                try:
                    ipr.tc("del-filter", "bpf", index=self.ifindex, parent=parent, prio=EVERYONE_PRIO,
                           protocol=ETH_P_IP)
                except NetlinkError:
                    pass  # (none there)
        return bool(self.bpf_cuts)

    def _cut_everyone_u32(self, ipr, spare: list[str]) -> None:
        for net in spared_complement(spare):
            for parent, offset in ((CLSACT_EGRESS, 16), (CLSACT_INGRESS, 12)):
                self._add_drop(ipr, dict(index=self.ifindex, parent=parent, prio=EVERYONE_PRIO,
                                         protocol=ETH_P_IP, target=0x10, keys=[_net_key(net, offset)]))

    def _drop_filters(self, address: str) -> list[dict]:
        """The two filters of a cut: what goes to `address`, what comes from it."""
        return [dict(index=self.ifindex, parent=parent, prio=self.cuts[address], protocol=ETH_P_IP, target=0x10,
                     keys=[_ip_key(address, offset)]) for parent, offset in ((CLSACT_EGRESS, 16), (CLSACT_INGRESS, 12))]

    def _add_drop(self, ipr, kw: dict) -> None:
        """One u32 filter `kw` whose match is dropped (gact, or a redirect to a down IFB where the
        kernel has no act_gact)."""
        from pyroute2.netlink.exceptions import NetlinkError

        if self._drop is None:
            try:
                ipr.tc("add-filter", "u32", action={"kind": "gact", "action": "drop"}, **kw)
                self._drop = {"kind": "gact", "action": "drop"}
                return
            except NetlinkError:  # no act_gact in this kernel
                self._drop = _blackhole(ipr)
        ipr.tc("add-filter", "u32", action=self._drop, **kw)

    def counters(self) -> Optional[dict]:
        """What the link carried: up is what left the interface, down what the IFB delivered."""
        from testbed.kernel.netlink import link_counters
        from testbed.kernel.rtnl import Rtnl

        if self.ifindex is None:
            return None
        _, _, up_bytes, up_packets = link_counters(self.netns)[self.ifindex]
        with Rtnl(self.netns) as rt:
            down = root_qdisc_bytes(rt, self.ifb, self.netns)
        return {"up_bytes": up_bytes, "up_packets": up_packets,
                "down_bytes": down["bytes"], "down_packets": down["packets"]}

    def class_stats(self) -> dict:
        """Each direction's HTB class as the fidelity monitor reads it on a host it shapes
        (kernel.shaping.read_htb_stats), flat for the channel's stats: up_class_rate_bps,
        up_class_bytes, ... down_class_backlog; {} without a link or a class."""
        from testbed.kernel.rtnl import Rtnl
        from testbed.kernel.shaping import htb_stats

        if self.ifindex is None:
            return {}
        out = {}
        try:
            with Rtnl(self.netns) as rt:
                for direction, ifindex in (("up", self.ifindex), ("down", self.ifb)):
                    for key, value in (htb_stats(rt, ifindex) or {}).items():
                        out[f"{direction}_class_{key}"] = value
        except Exception:  # a class being replaced: no reading this time, never the supervisor's end
            return {}
        return out


def root_qdisc_bytes(rt, ifindex: int, netns: Optional[str] = None) -> dict:
    """What the root qdisc of `ifindex` sent (`rt` a kernel.rtnl.Rtnl), counted as the wire
    would: an IFB receives what GRO merged before the node (the host's VXLAN), and its interface
    counter counts a merged packet's headers once (4.2% low at 1450-byte packets, measured); a
    qdisc counts every segment."""
    from testbed.kernel.netlink import link_counters

    for q in rt.tc_objects(ifindex):
        if q.parent == 0xFFFFFFFF and q.stats:
            return {"bytes": q.stats["bytes"], "packets": q.stats["packets"]}
    _, _, tx_bytes, tx_packets = link_counters(netns)[ifindex]
    return {"bytes": tx_bytes, "packets": tx_packets}
