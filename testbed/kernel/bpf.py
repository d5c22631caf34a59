"""Random packet loss without sch_netem: a 7-instruction eBPF classifier on the HTB root; and
a node cut from every address but a few, one classifier each way (cut_program).

Kernels built without netem (this project's CI machine) often still have the bpf
classifier. In direct-action mode it returns TC_ACT_SHOT (drop) when a fresh 16-bit
random number falls below p * 65536, else TC_ACT_UNSPEC: the next filter classifies the
packet (a per-destination u32 filter of `links:`), or HTB's default class. This is
independent per-packet (Bernoulli) loss, netem's `loss p` model.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import platform
import struct

from testbed.errors import HostCannot

BPF_PROG_LOAD = 5
BPF_PROG_TYPE_SCHED_CLS = 3
_NR_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "ppc64le": 361, "s390x": 351, "riscv64": 280}
TC_ACT_UNSPEC = -1  # "no verdict": classification goes on with the next filter
TC_ACT_SHOT = 2
RESOLUTION = 1 << 16


class BpfError(OSError, HostCannot):
    pass


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def loss_program(probability: float) -> bytes:
    """The program's bytecode (exposed for tests)."""
    threshold = int(round(probability * RESOLUTION))
    return b"".join([
        _insn(0x85, imm=7),  # call bpf_get_prandom_u32
        _insn(0x57, imm=0xFFFF),  # r0 &= 0xffff
        _insn(0x35, off=2, imm=threshold),  # if r0 >= threshold goto keep
        _insn(0xB7, imm=TC_ACT_SHOT),  # r0 = drop
        _insn(0x95),  # exit
        _insn(0xB7, imm=TC_ACT_UNSPEC),  # keep: r0 = no verdict, classify on
        _insn(0x95),  # exit
    ])


def cut_program(offset: int, spared: list[str]) -> bytes:
    """Drop every IPv4 packet whose address at `offset` from the frame's start (16 + 14: the
    destination, on egress; 12 + 14: the source, on ingress) is none of `spared`; the rest go on
    to the next filter. The classifier's protocol (IPv4) keeps other frames away from it."""
    addresses = [struct.unpack("=i", ipaddress.IPv4Address(a).packed)[0] for a in spared]  # as loaded from the packet
    n = len(addresses)
    return b"".join([
        _insn(0xB7, dst=2, imm=offset),  # r2 = offset (r1: the skb)
        _insn(0xBF, dst=3, src=10),  # r3 = the stack's top
        _insn(0x07, dst=3, imm=-4),  # r3 -= 4
        _insn(0xB7, dst=4, imm=4),  # r4 = 4 bytes
        _insn(0x85, imm=26),  # call bpf_skb_load_bytes(skb, offset, r3, 4)
        _insn(0x55, dst=0, off=n + 3, imm=0),  # if r0 != 0 (a short packet) goto keep
        _insn(0x61, dst=0, src=10, off=-4),  # w0 = the address
        *[_insn(0x16, dst=0, off=n - i + 1, imm=a) for i, a in enumerate(addresses)],  # if w0 == spared goto keep
        _insn(0xB7, imm=TC_ACT_SHOT),  # r0 = drop
        _insn(0x95),  # exit
        _insn(0xB7, imm=TC_ACT_UNSPEC),  # keep: r0 = no verdict, classify on
        _insn(0x95),  # exit
    ])


def load_loss_program(probability: float) -> int:
    """Load the program; returns its fd (close it once a filter holds the program)."""
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"loss probability {probability} outside [0, 1]")
    return load_program(loss_program(probability))


def load_program(program: bytes) -> int:
    """Load a SCHED_CLS program; returns its fd (close it once a filter holds the program)."""
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise BpfError(0, f"bpf syscall number unknown for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(program)
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = struct.pack("<IIQQIIQII", BPF_PROG_TYPE_SCHED_CLS, (len(code.raw) - 1) // 8,
                       ctypes.addressof(code), ctypes.addressof(lic), 1, len(log), ctypes.addressof(log), 0, 0)
    buf = ctypes.create_string_buffer(attr, 128)
    fd = libc.syscall(nr, BPF_PROG_LOAD, buf, 128)
    if fd < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"BPF_PROG_LOAD: {os.strerror(err)}: {log.value.decode(errors='replace')[:200]}")
    return fd


def attach_cut(ipr, ifindex: int, parent: int, prio: int, offset: int, spared: list[str]) -> None:
    """Attach a cut_program filter at `prio` of `parent` (a clsact hook) on `ifindex`."""
    fd = load_program(cut_program(offset, spared))
    try:
        ipr.tc("add-filter", "bpf", index=ifindex, handle=1, fd=fd, name="edgebed-cut", parent=parent,
               prio=prio, protocol=0x0800, direct_action=True)  # IPv4 only, as the u32 cuts
    finally:
        os.close(fd)


def attach_loss(ipr, ifindex: int, parent: int, probability: float) -> None:
    """Attach a loss filter to the classful qdisc `parent` (e.g. HTB 1:) on `ifindex`."""
    fd = load_loss_program(probability)
    try:
        ipr.tc("add-filter", "bpf", index=ifindex, handle=1, fd=fd, name="edgebed-loss", parent=parent,
               prio=1, protocol=3, direct_action=True)  # protocol 3 = ETH_P_ALL
    finally:
        os.close(fd)
