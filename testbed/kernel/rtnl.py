"""A few rtnetlink requests, encoded by hand: what a fleet's bring-up sends for every node.

pyroute2 (0.9) spends about 1.4 ms of Python on a request (its asyncio loop run for each call,
its message classes' encoding and decoding), against some 0.1 ms the kernel takes; at about 20
requests a node, that is most of a 1,000-device bring-up (BENCHMARKS.md, "A fleet up and down").
These are the link, address and neighbour requests of those, an HTB root and class (a shaped
access link's two, and a trace's rate changes; netem, loss filters and peer classes stay with
pyroute2), and the reads a node's own link makes every few seconds (its qdiscs' and classes'
counters: `tc_objects`). Each request waits for its acknowledgement; an error comes back as
OSError with the kernel's errno (pyroute2 raised its NetlinkError; nothing caught those here).
Formats: linux/netlink.h, rtnetlink.h, if_link.h, veth.h, neighbour.h, pkt_sched.h.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Optional

from testbed.kernel.netlink import NETNS_DIR, entered_netns

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_GETLINK, RTM_SETLINK = 16, 18, 19
RTM_NEWADDR = 20
RTM_NEWROUTE = 24
RTM_NEWNEIGH = 28
RTM_NEWQDISC, RTM_GETQDISC, RTM_NEWTCLASS, RTM_GETTCLASS = 36, 38, 40, 42
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLA_F_NESTED = 0x8000

IFLA_ADDRESS, IFLA_IFNAME, IFLA_MASTER, IFLA_PROTINFO, IFLA_LINKINFO, IFLA_NET_NS_PID, IFLA_NET_NS_FD = \
    1, 3, 10, 12, 18, 19, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFLA_BRPORT_ISOLATED = 33
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_GATEWAY = 5
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 3, 0, 1
NDA_DST, NDA_LLADDR = 1, 2
IFF_UP = 0x1
NUD_PERMANENT = 0x80  # a neighbour entry never aged, probed or collected (nor counted against gc_thresh)
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS, TCA_STATS = 1, 2, 3
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_CTAB, TCA_HTB_RTAB, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 3, 4, 6, 7
HTB_MTU = 1600  # what tc and pyroute2 size a rate table's cells for

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefix length, flags, scope, index
_NDMSG = struct.Struct("=BxxxiHBB")  # ndmsg: family, ifindex, state, flags, type
_TCMSG = struct.Struct("=BxxxiIII")  # tcmsg: family, ifindex, handle, parent, info
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst len, src len, tos, table, protocol, scope, type, flags
_RATESPEC = struct.Struct("=BBHhHI")  # tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate
_TC_STATS = struct.Struct("=QIIIIIII")  # tc_stats: bytes, packets, drops, overlimits, bps, pps, qlen, backlog


def attr(kind: int, payload: bytes) -> bytes:
    """One attribute (rtattr), padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _ifinfo(index: int = 0, up: bool = False, family: int = socket.AF_UNSPEC) -> bytes:
    return _IFINFO.pack(family, 0, index, IFF_UP if up else 0, IFF_UP if up else 0)


def _mac(address: str) -> bytes:
    return bytes(int(b, 16) for b in address.split(":"))


@functools.lru_cache(maxsize=256)
def htb_rate(rate_bps: int) -> tuple[bytes, bytes]:
    """(tc_ratespec, rate table) of an HTB rate, as pyroute2's `tc("add-class", "htb", rate="Nbit")`
    makes them (its own helpers, so the kernel gets the same numbers): a fleet's links share a few
    rates, and a table is 256 transmission times computed in Python."""
    from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime

    rate = min(rate_bps / 8, (1 << 32) - 1)  # bytes a second, as pyroute2's get_rate gives them (past
    cell_log = 0  # 32 bits the rest goes in TCA_HTB_RATE64, and the table is the capped rate's)
    while (HTB_MTU >> cell_log) > 255:
        cell_log += 1
    table = struct.pack("=256I", *(int(calc_xmittime(rate, (i + 1) << cell_log)) for i in range(256)))
    return _RATESPEC.pack(cell_log, 0, 0, -1, 0, int(rate)), table


class Rtnl:
    """A route netlink socket in one network namespace (None: the caller's); `with` closes it."""

    def __init__(self, netns: Optional[str] = None):
        with entered_netns(netns):  # a socket stays in the namespace it was made in
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        try:
            self.sock.bind((0, 0))
            self.sock.settimeout(30.0)  # a request the kernel never answers fails, not hangs bring-up
        except OSError:
            self.sock.close()
            raise
        self.seq = 0

    def __enter__(self) -> "Rtnl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, body: bytes) -> list[bytes]:
        """Send one request and read until its acknowledgement; returns the other messages of
        the answer (a get's). An error answer raises OSError(errno)."""
        return self._exchange(kind, NLM_F_ACK | flags, body, NLMSG_ERROR)

    def dump(self, kind: int, body: bytes) -> list[bytes]:
        """Every message of a dump (`kind` a get with NLM_F_DUMP), read until its NLMSG_DONE."""
        return self._exchange(kind, NLM_F_DUMP, body, NLMSG_DONE)

    def _exchange(self, kind: int, flags: int, body: bytes, last: int) -> list[bytes]:
        """Send a request; the messages of its answer up to the one of type `last` (an error
        answer raises OSError(errno))."""
        self.seq += 1
        self.sock.send(_HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | flags, self.seq, 0) + body)
        answers: list[bytes] = []
        while True:
            data, offset = self.sock.recv(1 << 16), 0
            while offset + _HEADER.size <= len(data):
                length, mtype, _, seq, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    raise OSError(f"netlink: a message of length {length}")
                payload = data[offset + _HEADER.size:offset + length]
                offset += (length + 3) & ~3
                if seq != self.seq:
                    continue  # an answer to an earlier request that gave up (never expected)
                if mtype == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", payload)[0]
                    if err:
                        raise OSError(err, os.strerror(err))
                if mtype == last:
                    return answers
                if mtype != NLMSG_ERROR:
                    answers.append(payload)

    # -- links -----------------------------------------------------------------------------
    def add_veth(self, ifname: str, peer_netns: str | int, peer_ifname: str, *, master: Optional[int] = None,
                 up: bool = False) -> int:
        """A veth: `ifname` here (enslaved to `master`, up if asked), its peer `peer_ifname` in netns
        `peer_netns` (a name, or an int: the namespace of that process), down, each made in place
        under its final name; returns the ifindex of `ifname`."""
        fd: Optional[int] = None
        if isinstance(peer_netns, str):  # a link at its name is refused, never followed
            fd = os.open(os.path.join(NETNS_DIR, peer_netns), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            where = attr(IFLA_NET_NS_FD, struct.pack("=I", fd)) if fd is not None \
                else attr(IFLA_NET_NS_PID, struct.pack("=I", peer_netns))
            peer = _ifinfo() + attr(IFLA_IFNAME, peer_ifname.encode() + b"\0") + where
            info = attr(IFLA_INFO_KIND, b"veth\0") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer))
            body = _ifinfo(up=up) + attr(IFLA_IFNAME, ifname.encode() + b"\0") + attr(IFLA_LINKINFO, info)
            if master is not None:
                body += attr(IFLA_MASTER, struct.pack("=I", master))
            self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)
        finally:
            if fd is not None:
                os.close(fd)
        return self.index(ifname)

    def index(self, ifname: str) -> int:
        """The ifindex of interface `ifname` (OSError ENODEV when there is none)."""
        answers = self.request(RTM_GETLINK, 0, _ifinfo() + attr(IFLA_IFNAME, ifname.encode() + b"\0"))
        if not answers:
            raise OSError(f"netlink: no answer for link {ifname}")
        return _IFINFO.unpack_from(answers[0])[2]

    def set_link(self, index: int, *, up: Optional[bool] = None, mac: Optional[str] = None) -> None:
        """Bring interface `index` up (or down), or give it a MAC address."""
        body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, IFF_UP if up else 0, IFF_UP if up is not None else 0)
        if mac is not None:
            body += attr(IFLA_ADDRESS, _mac(mac))
        self.request(RTM_NEWLINK, 0, body)

    def isolate_port(self, index: int) -> None:
        """A bridge port that forwards to the bridge's other ports only if they are not isolated
        (`bridge link set dev X isolated on`)."""
        protinfo = attr(IFLA_BRPORT_ISOLATED, b"\1")
        self.request(RTM_SETLINK, 0,
                     _ifinfo(index, family=socket.AF_BRIDGE) + attr(IFLA_PROTINFO | NLA_F_NESTED, protinfo))

    # -- addresses and neighbours ----------------------------------------------------------
    def add_address(self, index: int, address: str, prefixlen: int) -> None:
        """An IPv4 address on interface `index` (no broadcast address: as pyroute2 made it)."""
        packed = ipaddress.IPv4Address(address).packed
        body = _IFADDR.pack(socket.AF_INET, prefixlen, 0, 0, index) + attr(IFA_LOCAL, packed) \
            + attr(IFA_ADDRESS, packed)
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body)

    def add_neighbour(self, index: int, address: str, mac: str) -> None:
        """A permanent IPv4 neighbour (ARP) entry on interface `index` (`ip neigh replace`)."""
        body = _NDMSG.pack(socket.AF_INET, index, NUD_PERMANENT, 0, 0) \
            + attr(NDA_DST, ipaddress.IPv4Address(address).packed) + attr(NDA_LLADDR, _mac(mac))
        self.request(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body)

    def add_default_route(self, gateway: str) -> None:
        """The IPv4 default route through `gateway` (`ip route add default via G`)."""
        body = _RTMSG.pack(socket.AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0) \
            + attr(RTA_GATEWAY, ipaddress.IPv4Address(gateway).packed)
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body)

    # -- shaping ---------------------------------------------------------------------------
    def add_htb_qdisc(self, index: int, handle: int, default: int) -> None:
        """The root HTB qdisc (`tc qdisc add dev X root handle H htb default D`, r2q 10)."""
        options = attr(TCA_HTB_INIT, struct.pack("=IIIII", 3, 10, default, 0, 0))
        body = _TCMSG.pack(socket.AF_UNSPEC, index, handle, TC_H_ROOT, 0) + attr(TCA_KIND, b"htb\0") \
            + attr(TCA_OPTIONS, options)
        self.request(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, body)

    def add_htb_class(self, index: int, handle: int, parent: int, rate_bps: int, burst: int,
                      change: bool = False) -> None:
        """An HTB class of rate = ceil = `rate_bps` bits a second and burst = cburst = `burst` bytes
        (`change`: the class exists, and its rate changes in place: `tc class change`)."""
        from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime

        spec, table = htb_rate(rate_bps)
        buffer = int(calc_xmittime(rate_bps / 8, burst))
        parms = spec + spec + struct.pack("=IIIII", buffer, buffer, 0, 0, 0)  # quantum from r2q, level, prio
        options = attr(TCA_HTB_PARMS, parms) + attr(TCA_HTB_RTAB, table) + attr(TCA_HTB_CTAB, table)
        if rate_bps / 8 >= 1 << 32:
            options += attr(TCA_HTB_RATE64, struct.pack("=Q", int(rate_bps / 8))) \
                + attr(TCA_HTB_CEIL64, struct.pack("=Q", int(rate_bps / 8)))
        body = _TCMSG.pack(socket.AF_UNSPEC, index, handle, parent, 0) + attr(TCA_KIND, b"htb\0") \
            + attr(TCA_OPTIONS, options)
        self.request(RTM_NEWTCLASS, 0 if change else NLM_F_CREATE | NLM_F_EXCL, body)

    def tc_objects(self, index: int, classes: bool = False) -> list[TcObject]:
        """The qdiscs (or classes) of interface `index` with their kind, counters and HTB rate:
        what a node's own link reads every few seconds (pyroute2's get_qdiscs and get_classes
        leave MiBs of written pages in each of a fleet's thousand supervisors)."""
        body = _TCMSG.pack(socket.AF_UNSPEC, index, 0, 0, 0)
        found = []
        for payload in self.dump(RTM_GETTCLASS if classes else RTM_GETQDISC, body):
            _, ifindex, handle, parent, _ = _TCMSG.unpack_from(payload)
            if ifindex == index:  # a qdisc dump is every interface's
                found.append(_tc_object(handle, parent, _attrs(payload[_TCMSG.size:])))
        return found


@dataclass(frozen=True)
class TcObject:
    """A qdisc or class as a dump gives it: `stats` tc_stats's fields (bytes, packets, drops,
    overlimits, backlog), `rate` an HTB class's rate in bytes a second (None for others)."""

    handle: int
    parent: int
    kind: str
    stats: dict
    rate: Optional[int] = None


def _attrs(data: bytes) -> dict[int, bytes]:
    """A message's top-level attributes by type (the nested flag cleared)."""
    out, at = {}, 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        if length < 4:
            break
        out[kind & ~NLA_F_NESTED] = data[at + 4:at + length]
        at += (length + 3) & ~3
    return out


def _tc_object(handle: int, parent: int, attrs: dict[int, bytes]) -> TcObject:
    kind = attrs.get(TCA_KIND, b"").split(b"\0", 1)[0].decode()
    stats = {}
    if TCA_STATS in attrs and len(attrs[TCA_STATS]) >= _TC_STATS.size:
        values = _TC_STATS.unpack_from(attrs[TCA_STATS])
        stats = dict(zip(("bytes", "packets", "drops", "overlimits", "bps", "pps", "qlen", "backlog"), values))
    rate = None
    if kind == "htb" and TCA_OPTIONS in attrs:
        options = _attrs(attrs[TCA_OPTIONS])
        if TCA_HTB_RATE64 in options:
            rate = struct.unpack_from("=Q", options[TCA_HTB_RATE64])[0]
        elif TCA_HTB_PARMS in options:
            rate = _RATESPEC.unpack_from(options[TCA_HTB_PARMS])[5]
    return TcObject(handle, parent, kind, stats, rate)
