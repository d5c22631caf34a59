"""Link shaping with tc through pyroute2: HTB for rate, netem for delay/jitter/loss.

Each direction of a node's access link is shaped on the *egress* of one veth end:
uplink (node -> network) on the node's eth0, downlink (network -> node) on the peer
end inside the switch namespace. Egress shaping on both ends needs neither IFB nor
ingress policing, and it backs TCP off the way a real bottleneck does.

Kernels without sch_netem (this project's CI machine is one) cannot delay packets in
tc. Then latency and jitter fall back to edgebed's transport, which holds each received
message for the link's one-way delay (see transport.DelayLine), and loss falls back to
an eBPF drop filter on the HTB root (bpf.py) where the bpf classifier exists; else it
is not applied. `plan_direction` records which mechanism produces each property,
and meta.json carries that record: a property is never claimed when it was not applied.
"""

from __future__ import annotations

import errno
import ipaddress
import uuid
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Optional, Protocol


class DirectionShape(Protocol):
    """What one direction of a link asks for (the scenario's `Direction`): the kernel layer
    reads these four properties and imports nothing of the scenario."""
    rate: Optional[float]  # bit/s; None = unshaped
    latency: Optional[float]  # seconds, one-way
    jitter: Optional[float]
    loss: Optional[float]  # probability

MTU = 1500
HTB_HANDLE = 0x10000  # 1:
HTB_CLASS = 0x10010  # 1:10
NETEM_HANDLE = 0x100000  # 10:
UNLIMITED_BPS = 100e9  # HTB class that never limits: above what a veth carries


@dataclass(frozen=True)
class KernelCaps:
    htb: bool
    netem: bool
    tbf: bool
    ifb: bool
    bpf_loss: bool = False  # eBPF classifier can drop packets (loss without netem)

    def describe(self) -> str:
        missing = [k for k, v in asdict(self).items() if not v]
        return "all of htb, netem, tbf, ifb" if not missing else f"missing: {', '.join(missing)}"


@dataclass
class DirectionPlan:
    """What will be configured on one interface, and by which mechanism."""

    rate_bps: Optional[float] = None
    burst_bytes: Optional[int] = None
    netem: dict = field(default_factory=dict)  # pyroute2 netem kwargs (delay/jitter in us, loss in %)
    transport_delay_s: float = 0.0  # fallback: held by the receiver's transport
    transport_jitter_s: float = 0.0
    bpf_loss: Optional[float] = None  # fallback: drop probability of the eBPF filter
    mechanisms: dict = field(default_factory=dict)  # property -> "htb" | "netem" | "transport" | "not-applied: why"
    peers: list["PeerPlan"] = field(default_factory=list)  # per-destination classes (`links:` overrides)

    def to_meta(self) -> dict:
        out = {
            "rate_bps": self.rate_bps,
            "burst_bytes": self.burst_bytes,
            "netem": self.netem or None,
            "transport_delay_s": self.transport_delay_s,
            "transport_jitter_s": self.transport_jitter_s,
            "bpf_loss": self.bpf_loss,
            "mechanisms": self.mechanisms,
        }
        if self.peers:
            out["peers"] = [p.to_meta() for p in self.peers]
        return out


@dataclass
class PeerPlan:
    """An HTB class of its own for the traffic to (match dst) or from (match src) one address."""

    peer: str
    address: str
    match: str  # "dst" | "src"
    classid: int
    rate_bps: float
    burst_bytes: int
    netem: dict = field(default_factory=dict)
    transport_delay_s: float = 0.0
    transport_jitter_s: float = 0.0
    mechanisms: dict = field(default_factory=dict)

    def to_meta(self) -> dict:
        return {"peer": self.peer, "match": f"{self.match} {self.address}", "class": f"1:{self.classid & 0xFFFF:x}",
                "rate_bps": self.rate_bps, "netem": self.netem or None, "transport_delay_s": self.transport_delay_s,
                "mechanisms": self.mechanisms}


PEER_CLASS_BASE = 0x10020  # 1:20, 1:21, ... (1:10 is the access link's own class)
ETH_P_IP = 0x0800


def plan_peers(peers, caps: "KernelCaps") -> list[PeerPlan]:
    """Classes for `links:` overrides. Delay and loss of a pair are made once, where the flow
    leaves its sender (match dst); the receiving side's class (match src) only limits the rate."""
    out = []
    for i, ps in enumerate(peers):
        d = ps.direction
        rate = float(d.rate) if d.rate is not None else UNLIMITED_BPS
        plan = PeerPlan(ps.peer, ps.address, ps.match, PEER_CLASS_BASE + i, rate, htb_burst(rate))
        plan.mechanisms["rate"] = "htb class + u32 filter" if d.rate is not None else "unlimited"
        if ps.match == "dst" and (d.latency or d.jitter or d.loss):
            if caps.netem:
                if d.latency or d.jitter:
                    plan.netem["delay"] = int(round((d.latency or 0) * 1e6))
                    if d.jitter:
                        plan.netem["jitter"] = int(round(d.jitter * 1e6))
                    plan.mechanisms["latency"] = "netem"
                if d.loss:
                    plan.netem["loss"] = d.loss * 100.0
                    plan.mechanisms["loss"] = "netem"
                bdp = rate / 8 * max((d.latency or 0) + 3 * (d.jitter or 0), 0.001)
                plan.netem["limit"] = max(1000, int(2 * bdp / MTU))
            else:
                if d.latency or d.jitter:
                    plan.transport_delay_s, plan.transport_jitter_s = float(d.latency or 0), float(d.jitter or 0)
                    plan.mechanisms["latency"] = "transport (no sch_netem in this kernel)"
                if d.loss:
                    plan.mechanisms["loss"] = "not-applied: per-pair loss needs sch_netem"
        out.append(plan)
    return out


def htb_burst(rate_bps: float) -> int:
    """Bucket size: ~1 ms of traffic at the rate, never less than two full frames.

    Too small and HTB undershoots at high rates (timer granularity); too large and a
    link sends a burst far above its rate at start (kubernetes#90838).
    """
    return max(2 * (MTU + 14), int(rate_bps / 8 * 0.001))


def plan_direction(d: DirectionShape, caps: KernelCaps, peers=()) -> DirectionPlan:
    plan = DirectionPlan(peers=plan_peers(peers, caps))
    if d.rate is not None:
        plan.rate_bps = float(d.rate)
        plan.burst_bytes = htb_burst(d.rate)
        plan.mechanisms["rate"] = "htb"
    wants_delay = bool(d.latency) or bool(d.jitter)
    if caps.netem:
        if wants_delay:
            plan.netem["delay"] = int(round((d.latency or 0) * 1e6))
            if d.jitter:
                plan.netem["jitter"] = int(round(d.jitter * 1e6))
            plan.mechanisms["latency"] = "netem"
            if d.jitter:
                plan.mechanisms["jitter"] = "netem"
        if d.loss:
            plan.netem["loss"] = d.loss * 100.0
            plan.mechanisms["loss"] = "netem"
        if plan.netem:
            # Queue room for one bandwidth-delay product (netem's default 1000 packets
            # overflows at high rate x delay and would add loss nobody asked for).
            bdp = (plan.rate_bps or 1e9) / 8 * max((d.latency or 0) + 3 * (d.jitter or 0), 0.001)
            plan.netem["limit"] = max(1000, int(2 * bdp / MTU))
    else:
        if wants_delay:
            plan.transport_delay_s = float(d.latency or 0.0)
            plan.transport_jitter_s = float(d.jitter or 0.0)
            plan.mechanisms["latency"] = "transport (no sch_netem in this kernel)"
            if d.jitter:
                plan.mechanisms["jitter"] = "transport (no sch_netem in this kernel)"
        if d.loss and caps.bpf_loss:
            plan.bpf_loss = float(d.loss)
            plan.mechanisms["loss"] = "bpf (random drop filter; no sch_netem in this kernel)"
        elif d.loss:
            plan.mechanisms["loss"] = "not-applied: neither sch_netem nor a usable bpf classifier"
    return plan


def rate_alone(plan: DirectionPlan) -> bool:
    """Whether `plan` is an HTB rate and nothing else (what kernel.rtnl installs by itself)."""
    return not plan.netem and not plan.bpf_loss and not plan.peers


def apply_direction(ipr, ifindex: int, plan: DirectionPlan, rt=None) -> None:
    """Install `plan` on interface `ifindex` of the namespace `ipr` is bound to. `rt`: a
    kernel.rtnl.Rtnl in the same namespace that installs the HTB root and class instead of
    pyroute2 (a fleet's bring-up); `ipr` may then be None for a plan that is a rate alone."""
    if plan.rate_bps is None and rate_alone(plan):  # nothing to install
        return
    parent = None
    if plan.rate_bps is not None or plan.bpf_loss or plan.peers:
        # A loss filter needs a classful root; without a rate, the class never limits.
        rate_bps = plan.rate_bps if plan.rate_bps is not None else UNLIMITED_BPS
        burst = plan.burst_bytes or htb_burst(rate_bps)
        if rt is not None:
            rt.add_htb_qdisc(ifindex, HTB_HANDLE, default=0x10)
            rt.add_htb_class(ifindex, HTB_CLASS, HTB_HANDLE, int(rate_bps), burst)
        else:
            ipr.tc("add", "htb", index=ifindex, handle=HTB_HANDLE, default=0x10)
            rate = f"{int(rate_bps)}bit"
            ipr.tc(
                "add-class", "htb", index=ifindex, handle=HTB_CLASS, parent=HTB_HANDLE,
                rate=rate, ceil=rate, burst=burst, cburst=burst,
            )
        parent = HTB_CLASS
    if plan.bpf_loss:
        from testbed.kernel.bpf import attach_loss

        attach_loss(ipr, ifindex, HTB_HANDLE, plan.bpf_loss)
    if plan.netem:
        kw = dict(plan.netem)
        if parent is None:
            ipr.tc("add", "netem", index=ifindex, handle=NETEM_HANDLE, **kw)
        else:
            ipr.tc("add", "netem", index=ifindex, handle=NETEM_HANDLE, parent=parent, **kw)
    for i, peer in enumerate(plan.peers):
        # A sibling of the access class under the root: the pair's traffic does not share its rate.
        rate = f"{int(peer.rate_bps)}bit"
        ipr.tc("add-class", "htb", index=ifindex, handle=peer.classid, parent=HTB_HANDLE,
               rate=rate, ceil=rate, burst=peer.burst_bytes, cburst=peer.burst_bytes)
        if peer.netem:
            ipr.tc("add", "netem", index=ifindex, handle=(0x20 + i) << 16, parent=peer.classid, **peer.netem)
        offset = 16 if peer.match == "dst" else 12  # IPv4 header: source at byte 12, destination at 16
        ipr.tc("add-filter", "u32", index=ifindex, parent=HTB_HANDLE, prio=2, protocol=ETH_P_IP,
               target=peer.classid, keys=[f"0x{int(ipaddress.IPv4Address(peer.address)):08x}/0xffffffff+{offset}"])


def change_rate(ipr, ifindex: int, rate_bps: float) -> None:
    """Change an installed HTB rate in place (deleting the qdisc skews measurements, Mininet #650)."""
    rate = f"{int(rate_bps)}bit"
    burst = htb_burst(rate_bps)
    ipr.tc("change-class", "htb", index=ifindex, handle=HTB_CLASS, parent=HTB_HANDLE,
           rate=rate, ceil=rate, burst=burst, cburst=burst)


def _has_htb(plan: DirectionPlan) -> bool:
    return plan.rate_bps is not None or bool(plan.bpf_loss) or bool(plan.peers)


def reshape(ipr, ifindex: int, old: DirectionPlan, new: DirectionPlan) -> None:
    """Move an interface from `old` to `new` during a run: the rate in place (HTB change-class),
    the loss filter and the netem qdisc replaced only when they change. An interface with
    nothing classful installed yet gets `new` from scratch."""
    if not _has_htb(old):
        if old.netem:
            ipr.tc("del", index=ifindex)  # a netem-only root: start over
        apply_direction(ipr, ifindex, new)
        return
    change_rate(ipr, ifindex, new.rate_bps if new.rate_bps is not None else UNLIMITED_BPS)
    if old.bpf_loss != new.bpf_loss:
        if old.bpf_loss:
            ipr.tc("del-filter", "bpf", index=ifindex, handle=1, parent=HTB_HANDLE, prio=1, protocol=3)
        if new.bpf_loss:
            from testbed.kernel.bpf import attach_loss

            attach_loss(ipr, ifindex, HTB_HANDLE, new.bpf_loss)
    if old.netem != new.netem:
        if old.netem and new.netem:
            ipr.tc("change", "netem", index=ifindex, handle=NETEM_HANDLE, parent=HTB_CLASS, **new.netem)
        elif new.netem:
            ipr.tc("add", "netem", index=ifindex, handle=NETEM_HANDLE, parent=HTB_CLASS, **new.netem)
        else:
            ipr.tc("del", "netem", index=ifindex, handle=NETEM_HANDLE, parent=HTB_CLASS)


def read_htb_class(ipr, ifindex: int) -> Optional[dict]:
    """The installed HTB class's rate (bit/s), ceil and buffer, or None (for tests and status)."""
    for msg in ipr.get_classes(index=ifindex):
        if msg.get("kind") != "htb" or msg["handle"] != HTB_CLASS:
            continue
        opts = msg.get("options")
        params = opts.get("TCA_HTB_PARMS") if opts is not None else None
        if params is None:
            continue
        rate64 = opts.get("TCA_HTB_RATE64")
        rate = rate64 if rate64 else params["rate"]
        return {"rate_bps": rate * 8, "ceil_bps": (opts.get("TCA_HTB_CEIL64") or params["ceil"]) * 8}
    return None


def read_htb_stats(ipr, ifindex: int) -> Optional[dict]:
    """The access class's rate now (bit/s; None when it never limits) and its counters: bytes and
    packets it sent, drops and overlimits (cumulative), backlog (bytes queued now); None without
    an HTB class (the fidelity monitor's per-link input)."""
    for msg in ipr.get_classes(index=ifindex):
        if msg.get("kind") != "htb" or msg["handle"] != HTB_CLASS:
            continue
        opts = msg.get("options")
        params = opts.get("TCA_HTB_PARMS") if opts is not None else None
        st = msg.get_attr("TCA_STATS")
        if params is None or st is None:
            return None
        rate = (opts.get("TCA_HTB_RATE64") or params["rate"]) * 8
        return {"rate_bps": None if rate >= UNLIMITED_BPS else rate, "bytes": st["bytes"],
                "packets": st["packets"], "drops": st["drop"], "overlimits": st["overlimits"],
                "backlog": st["backlog"]}
    return None


def htb_stats(rt, ifindex: int) -> Optional[dict]:
    """read_htb_stats's reading by a kernel.rtnl.Rtnl (no pyroute2: a node's own link, read every
    few seconds by each of a fleet's supervisors)."""
    for obj in rt.tc_objects(ifindex, classes=True):
        if obj.kind != "htb" or obj.handle != HTB_CLASS:
            continue
        if obj.rate is None or not obj.stats:
            return None
        rate = obj.rate * 8
        return {"rate_bps": None if rate >= UNLIMITED_BPS else rate, "bytes": obj.stats["bytes"],
                "packets": obj.stats["packets"], "drops": obj.stats["drops"], "overlimits": obj.stats["overlimits"],
                "backlog": obj.stats["backlog"]}
    return None


def qdisc_kinds(ipr, ifindex: int) -> list[str]:
    return [m.get("kind") for m in ipr.get_qdiscs(index=ifindex)]


@lru_cache(maxsize=1)
def probe_kernel() -> KernelCaps:
    """This machine's kernel, tried in a scratch namespace (needs root)."""
    from testbed.kernel.netlink import create_netns, ns_iproute, remove_netns

    name = f"eb-probe-{uuid.uuid4().hex[:8]}"
    create_netns(name)
    try:
        with ns_iproute(name) as ns:
            return probe_links(ns)
    finally:
        try:
            remove_netns(name)
        except FileNotFoundError:
            pass


PROBE_IFACES = ("ebprobe0", "ebprobeifb")  # made and removed by probe_links


def probe_links(ipr) -> KernelCaps:
    """Try each qdisc on a veth pair made (and removed) in the namespace `ipr` is in: a scratch
    namespace of this machine, or a node's own (it needs NET_ADMIN there; the eBPF filter
    also needs CAP_SYS_ADMIN or CAP_BPF, and reads as missing without)."""
    # veth, not dummy: some kernels (this one) lack the dummy driver.
    ipr.link("add", ifname=PROBE_IFACES[0], kind="veth", peer={"ifname": "ebprobe1"})
    try:
        idx = ipr.link_lookup(ifname=PROBE_IFACES[0])[0]
        ipr.link("set", index=idx, state="up")
        return _probe_qdiscs(ipr, idx)
    finally:
        for ifname in PROBE_IFACES:  # the veth's peer goes with it
            for i in ipr.link_lookup(ifname=ifname):
                ipr.link("del", index=i)


def _probe_qdiscs(ipr, idx: int) -> KernelCaps:
    def works(kind: str, **kw) -> bool:
        try:
            ipr.tc("add", kind, index=idx, handle=0x20000, **kw)
        except Exception as e:  # NetlinkError ENOENT: module not in this kernel
            code = getattr(e, "code", None)
            if code not in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL, None):
                raise
            return False
        ipr.tc("del", index=idx, handle=0x20000, parent=0xFFFFFFFF)
        return True

    htb = works("htb", default=0x10)
    netem = works("netem", delay=1000)
    tbf = works("tbf", rate="1mbit", latency="50ms", burst=4000)
    try:
        ipr.link("add", ifname=PROBE_IFACES[1], kind="ifb")
        ifb = True
    except Exception:
        ifb = False
    bpf_loss = False
    if htb:
        try:
            from testbed.kernel.bpf import attach_loss

            ipr.tc("add", "htb", index=idx, handle=HTB_HANDLE, default=0x10)
            attach_loss(ipr, idx, HTB_HANDLE, 0.5)
            bpf_loss = True
        except Exception:
            bpf_loss = False
    return KernelCaps(htb=htb, netem=netem, tbf=tbf, ifb=ifb, bpf_loss=bpf_loss)


def weakest(caps: list[KernelCaps]) -> KernelCaps:
    """What every one of several kernels has (a run's summary when its nodes' kernels differ)."""
    return KernelCaps(**{k: all(getattr(c, k) for c in caps) for k in asdict(caps[0])})
