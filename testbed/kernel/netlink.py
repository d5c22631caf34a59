"""Netlink sockets bound to a named network namespace, without forking.

pyroute2's NetNS serves a namespace from a forked copy of the calling process; a fork
of the runner would inherit its signal handlers and `finally` blocks (a stray SIGTERM
there once ran a second teardown). Instead the calling thread enters the namespace
with setns(2), opens an IPRoute socket (a socket stays in the namespace it was made
in), and returns.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, Optional

from testbed.errors import RunFailed

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
LOOPBACK_INDEX = 1  # lo's in every network namespace (the kernel's LOOPBACK_IFINDEX)

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def enter_netns(name: str) -> None:
    """Move the calling thread (the whole process, if single-threaded) into netns `name`."""
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # a link is refused
    try:
        _setns(fd)
    finally:
        os.close(fd)


def ns_iproute(name: str):
    """An IPRoute socket inside netns `name` (caller closes it)."""
    from pyroute2 import IPRoute

    with entered_netns(name):
        return IPRoute()


class NetnsSockets:
    """IPRoute sockets kept open per thread and namespace, for what asks a namespace again and again
    (the monitor's reading of every link each second, a trace's 10 Hz rate changes): opening one
    costs a setns and about 1 ms, and a thread never shares one (pyroute2's are not thread-safe).
    At most `per_thread` a thread, the least recently used closed first (each holds 4 descriptors
    and keeps its namespace alive): `close` (before the namespaces go) closes them all."""

    def __init__(self, per_thread: Optional[int] = None):
        import resource

        # at most a 32nd of the descriptors this process may open (a socket holds 4): a fleet's
        # busy links each second are its trainers' (65 at K = 50 with over-selection 1.3)
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.per_thread = per_thread or max(16, min(128, soft // 128))
        self._local = threading.local()
        self._open: set = set()
        self._lock = threading.Lock()
        self._closed = False

    def _cache(self) -> "OrderedDict[Optional[str], object]":
        cache = getattr(self._local, "cache", None)
        if cache is None:
            cache = self._local.cache = OrderedDict()
        return cache

    def get(self, netns: Optional[str]):
        """This thread's socket in `netns` (None: the calling thread's own namespace)."""
        cache = self._cache()
        ipr = cache.get(netns)
        if ipr is not None:
            cache.move_to_end(netns)
            return ipr
        from pyroute2 import IPRoute

        with self._lock:
            if self._closed:
                raise RunFailed("the run's netlink sockets are closed (it is being torn down)")
            ipr = ns_iproute(netns) if netns is not None else IPRoute()
            self._open.add(ipr)
        cache[netns] = ipr
        if len(cache) > self.per_thread:
            self._close_one(cache.popitem(last=False)[1])
        return ipr

    @contextmanager
    def using(self, netns: Optional[str]):
        """This thread's socket in `netns` for a `with` block: one an error left in any state is
        dropped, not used again."""
        try:
            yield self.get(netns)
        except BaseException:
            self.drop(netns)
            raise

    def drop(self, netns: Optional[str]) -> None:
        """Close this thread's socket in `netns` (after an error: the next `get` opens a new one)."""
        ipr = self._cache().pop(netns, None)
        if ipr is not None:
            self._close_one(ipr)

    def _close_one(self, ipr) -> None:
        with self._lock:
            self._open.discard(ipr)
        try:
            ipr.close()
        except Exception:  # already broken: nothing of it to keep
            pass

    def close(self) -> None:
        """Every thread's sockets; later `get`s refuse."""
        with self._lock:
            self._closed, socks = True, list(self._open)
            self._open.clear()
        for ipr in socks:
            try:
                ipr.close()
            except Exception:
                pass
        self._local = threading.local()  # this thread's references go (the others' with their threads)


RTM_GETSTATS = 94
IFLA_STATS_LINK_64 = 1
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IF_STATS_MSG = struct.Struct("=BBHII")  # family, pad, pad, ifindex, filter_mask
_NLA = struct.Struct("=HH")
_STATS64_HEAD = struct.Struct("=QQQQ")  # rx_packets, tx_packets, rx_bytes, tx_bytes


def link_counters(netns: Optional[str]) -> dict[int, tuple[int, int, int, int]]:
    """Every interface of netns `netns`: ifindex -> (rx_bytes, rx_packets, tx_bytes, tx_packets),
    by one RTM_GETSTATS dump asking for the 64-bit counters alone. A link dump (pyroute2's
    get_links) carries and decodes every attribute: 325 ms for 500 veths, read each second."""
    with entered_netns(netns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        body = _IF_STATS_MSG.pack(socket.AF_UNSPEC, 0, 0, 0, 1 << (IFLA_STATS_LINK_64 - 1))
        sock.send(_NLMSG.pack(_NLMSG.size + len(body), RTM_GETSTATS, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
        out: dict[int, tuple[int, int, int, int]] = {}
        while True:
            data = sock.recv(1 << 20)
            if _parse_stats(data, out):
                return out
    finally:
        sock.close()


def _parse_stats(data: bytes, out: dict) -> bool:
    """One recv of the dump into `out`; True at its end."""
    off = 0
    while off + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, off)
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, off + _NLMSG.size)[0]
            raise OSError(code, f"RTM_GETSTATS: {os.strerror(code)}")
        _, _, _, ifindex, _ = _IF_STATS_MSG.unpack_from(data, off + _NLMSG.size)
        at, end = off + _NLMSG.size + _IF_STATS_MSG.size, off + length
        while at + _NLA.size <= end:
            nla_len, nla_type = _NLA.unpack_from(data, at)
            if nla_type == IFLA_STATS_LINK_64:
                rx_p, tx_p, rx_b, tx_b = _STATS64_HEAD.unpack_from(data, at + _NLA.size)
                out[ifindex] = (rx_b, rx_p, tx_b, tx_p)
            at += (nla_len + 3) & ~3
        off += (length + 3) & ~3
    return False


def set_sysctl(name: str, key: str, value: str) -> None:
    """Write /proc/sys/<key> (e.g. net/ipv4/ip_forward) of netns `name`: /proc/sys/net is the
    namespace of the thread that opens it, so enter, write, and come back."""
    with entered_netns(name), open(f"/proc/sys/{key}", "w") as f:
        f.write(value)


@contextmanager
def entered_netns(name: Optional[str]) -> Iterator[None]:
    """The calling thread inside netns `name` (None: where it is) until the block ends: a socket
    made inside stays in that namespace, whatever thread uses it later."""
    if name is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        enter_netns(name)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


def listening_socket(netns: Optional[str], address: str, port: int) -> socket.socket:
    """A TCP socket listening on address:port inside netns `netns` (None: the caller's own)."""
    with entered_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        return sock


def add_veth(ipr, ifname: str, peer_netns: str, peer_ifname: str, **attrs) -> int:
    """A veth made with its end `ifname` in `ipr`'s namespace (with `attrs`, such as master= and
    state="up") and its peer `peer_ifname` in netns `peer_netns`, each under its final name;
    returns the ifindex of `ifname`. Nothing passes through the root namespace and nothing moves:
    a veth moved between namespaces costs many times one made in place
    (benchmarks/fleet_bringup.py)."""
    fd = os.open(os.path.join(NETNS_DIR, peer_netns), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": peer_ifname, "net_ns_fd": fd}, **attrs)
    finally:
        os.close(fd)
    return ipr.link_lookup(ifname=ifname)[0]


@contextmanager
def in_netns(name: str) -> Iterator:
    ipr = ns_iproute(name)
    try:
        yield ipr
    finally:
        ipr.close()


MS_BIND = 4096
MS_REC = 16384
MS_SHARED = 1 << 20
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8


def create_netns(name: str, ipv6: bool = True) -> None:
    """`ip netns add NAME` without forking: unshare in a throwaway thread, bind-mount its namespace.

    unshare(CLONE_NEWNET) moves only the calling thread, so the runner's own
    threads stay in the host namespace. `ipv6=False`: the interfaces made in it later get no
    IPv6 (lo keeps ::1). A cluster's networks are IPv4, and on a bridge each new port's IPv6
    autoconfiguration (DAD, MLD, router solicitations) floods every other port, which more than
    doubles the time to plug 1,000 nodes into one bridge (benchmarks/fleet_bringup.py).
    """
    import threading

    os.makedirs(NETNS_DIR, exist_ok=True)
    # /run/netns must be a shared mount so the bind mounts propagate (as iproute2 does).
    if _libc.mount(b"", NETNS_DIR.encode(), b"none", MS_SHARED | MS_REC, None) != 0:
        if _libc.mount(NETNS_DIR.encode(), NETNS_DIR.encode(), b"none", MS_BIND | MS_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"cannot bind-mount {NETNS_DIR}")
        if _libc.mount(b"", NETNS_DIR.encode(), b"none", MS_SHARED | MS_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"cannot make {NETNS_DIR} shared")
    path = os.path.join(NETNS_DIR, name)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    errors: list[BaseException] = []

    def make() -> None:
        try:
            if _libc.unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
            src = f"/proc/self/task/{threading.get_native_id()}/ns/net".encode()
            if _libc.mount(src, path.encode(), b"none", MS_BIND, None) != 0:
                raise OSError(ctypes.get_errno(), f"bind mount of the new namespace onto {path} failed")
            if not ipv6:
                _no_ipv6_here()
        except BaseException as e:  # reported to the caller
            errors.append(e)

    t = threading.Thread(target=make, name=f"netns-{name}")
    t.start()
    t.join()
    if errors:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise errors[0]


def _no_ipv6_here() -> None:
    """IPv6 off for the interfaces made later in the calling thread's namespace (/proc/sys/net is
    the opener's); a kernel without IPv6 has nothing to turn off."""
    try:
        with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as f:
            f.write("1")
    except FileNotFoundError:
        pass


def remove_netns(name: str) -> None:
    """`ip netns del NAME`: detach the bind mount and remove the file (FileNotFoundError if
    absent). A link there is removed, never followed (the unmount would detach its target)."""
    path = os.path.join(NETNS_DIR, name)
    if not os.path.lexists(path):
        raise FileNotFoundError(path)
    if not os.path.islink(path):
        _libc.umount2(path.encode(), MNT_DETACH | UMOUNT_NOFOLLOW)
    os.unlink(path)


OFFLOADS = ("tx-tcp-segmentation", "tx-tcp6-segmentation", "tx-tcp-ecn-segmentation",
            "tx-tcp-mangleid-segmentation", "tx-generic-segmentation", "generic-receive-offload")
SIOCETHTOOL = 0x8946
# ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SGRO: the legacy commands, one a feature group, that turn
# off what OFFLOADS names (STSO takes TSO, TSO6, TSO-ECN and TSO-mangleid together)
OFFLOAD_COMMANDS = (0x1F, 0x24, 0x2C)


class _EthtoolValue(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_uint32), ("data", ctypes.c_uint32)]


def attach_netns(name: str, pid: int) -> None:
    """`ip netns attach NAME PID`: give a process's network namespace (a container's) a name."""
    os.makedirs(NETNS_DIR, exist_ok=True)
    path = os.path.join(NETNS_DIR, name)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    if _libc.mount(f"/proc/{pid}/ns/net".encode(), path.encode(), b"none", MS_BIND, None) != 0:
        err = ctypes.get_errno()
        os.unlink(path)
        raise OSError(err, f"cannot attach the network namespace of pid {pid}: {os.strerror(err)}")


def disable_offloads(name: "str | None", ifnames: list[str]) -> None:
    """Turn off TSO/GSO/GRO on interfaces of netns `name`.

    With segmentation offload a veth hands HTB 64 KB super-packets: the average rate is
    right, but at 1 Mbit/s each one leaves as a 0.5 s burst. MTU-sized packets keep the
    shaped link smooth at every time scale, as a real link is.

    Three ioctls an interface: pyroute2's Ethtool reads the kernel's feature names on every
    call, which made this a fifth of a fleet's bring-up.
    """
    with entered_netns(name):  # None: the caller's own namespace (the host's, for Docker's veth ends)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for ifname in ifnames:
            for cmd in OFFLOAD_COMMANDS:
                value = _EthtoolValue(cmd, 0)
                ifreq = struct.pack("16sP16x", ifname.encode(), ctypes.addressof(value))
                try:
                    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
                except OSError as e:
                    if e.errno != errno.EOPNOTSUPP:  # a device that cannot change it: nothing to turn off
                        raise OSError(e.errno, f"ethtool on {ifname}: {e.strerror}") from None
    finally:
        sock.close()
