"""Whether a kernel can carry Docker's encrypted overlay (`--opt encrypted`): libnetwork puts an
IPsec ESP security association in transport mode with AES-GCM (`rfc4106(gcm(aes))`, a 128-bit
ICV) between each pair of hosts and marks their VXLAN datagrams for it. A kernel without ESP or
without GCM takes the network and its tasks but cannot program those SAs.

Tried as libnetwork would: one such SA added (and removed) over NETLINK_XFRM in the caller's
network namespace, which needs CAP_NET_ADMIN there (a scratch namespace, or a probe container's
own). A second SA with the null cipher tells a missing ESP apart from a missing GCM. pyroute2
has no XFRM messages, so they are packed here (linux/xfrm.h, 64-bit layout).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys

NETLINK_XFRM = 6
XFRM_MSG_NEWSA, XFRM_MSG_DELSA = 0x10, 0x11
XFRMA_ALG_CRYPT, XFRMA_ALG_AEAD = 2, 18
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 0x2
IPPROTO_ESP = 50
XFRM_MODE_TRANSPORT = 0
XFRM_INF = 0xFFFFFFFFFFFFFFFF
AEAD = "rfc4106(gcm(aes))"  # libnetwork's (drivers/overlay/encryption.go): 32-byte key + 4-byte salt, 128-bit ICV
PROBE_SRC, PROBE_DST = "192.0.2.1", "192.0.2.2"  # TEST-NET-1: an SA is only an entry, nothing is sent
SPI_AEAD, SPI_NULL = 0x0EB0_0001, 0x0EB0_0002

# What the probe found, as the exit status of `python -m testbed.kernel.ipsec` (a probe task's)
SUPPORTED, NO_ESP, NO_GCM, NO_ESP_NO_GCM, NO_XFRM, REFUSED, NOT_ALLOWED = 0, 3, 4, 5, 6, 7, 8
MISSING = {
    NO_ESP: "no IPsec ESP (CONFIG_INET_ESP)",
    NO_GCM: "no AES-GCM for ESP (CONFIG_CRYPTO_GCM)",
    NO_ESP_NO_GCM: "no IPsec ESP (CONFIG_INET_ESP) and no AES-GCM (CONFIG_CRYPTO_GCM)",
    NO_XFRM: "no IPsec netlink interface (CONFIG_XFRM_USER)",
    REFUSED: "it refused an ESP security association (see the probe's log)",
    NOT_ALLOWED: "the probe had no CAP_NET_ADMIN in its namespace to try an SA with",
}


def usersa_info(spi: int) -> bytes:
    """struct xfrm_usersa_info (224 bytes): an ESP SA in transport mode from PROBE_SRC to PROBE_DST."""
    src, dst = (socket.inet_aton(a).ljust(16, b"\0") for a in (PROBE_SRC, PROBE_DST))
    selector = struct.pack("=16s16sHHHHHBBB3xiI", b"", b"", 0, 0, 0, 0, socket.AF_UNSPEC, 0, 0, 0, 0, 0)
    xfrm_id = struct.pack("=16s4sB3x", dst, struct.pack(">I", spi), IPPROTO_ESP)
    lifetime = struct.pack("=8Q", XFRM_INF, XFRM_INF, XFRM_INF, XFRM_INF, 0, 0, 0, 0)
    current = struct.pack("=4Q", 0, 0, 0, 0)
    stats = struct.pack("=3I", 0, 0, 0)
    tail = struct.pack("=IIHBBB7x", 0, 0, socket.AF_INET, XFRM_MODE_TRANSPORT, 0, 0)
    return selector + xfrm_id + src + lifetime + current + stats + tail


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def newsa(spi: int, aead: bool, seq: int = 1) -> bytes:
    """XFRM_MSG_NEWSA: libnetwork's AES-GCM SA (aead), or ESP with the null cipher."""
    if aead:
        key = os.urandom(36)
        algo = _attr(XFRMA_ALG_AEAD, struct.pack("=64sII", AEAD.encode(), len(key) * 8, 128) + key)
    else:
        algo = _attr(XFRMA_ALG_CRYPT, struct.pack("=64sI", b"ecb(cipher_null)", 0))
    return _message(XFRM_MSG_NEWSA, usersa_info(spi) + algo, seq)


def delsa(spi: int, seq: int = 1) -> bytes:
    """XFRM_MSG_DELSA: struct xfrm_usersa_id of an SA newsa() made."""
    dst = socket.inet_aton(PROBE_DST).ljust(16, b"\0")
    return _message(XFRM_MSG_DELSA, struct.pack("=16s4sHB1x", dst, struct.pack(">I", spi), socket.AF_INET,
                                                IPPROTO_ESP), seq)


def _message(kind: int, body: bytes, seq: int) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body


def _ask(sock, message: bytes) -> int:
    """The kernel's answer to one request: 0, or the errno it refused with."""
    sock.send(message)
    answer = sock.recv(65536)
    kind, = struct.unpack_from("=H", answer, 4)
    if kind != NLMSG_ERROR:
        return errno.EPROTO
    return -struct.unpack_from("=i", answer, 16)[0]


def try_sa(sock, spi: int, aead: bool) -> int:
    """Add an SA and remove it again at once; 0 or the errno of the refusal."""
    refused = _ask(sock, newsa(spi, aead))
    if refused == 0:
        _ask(sock, delsa(spi))
    return refused


def esp_support(open_socket=None) -> int:
    """SUPPORTED, or which of MISSING this kernel lacks, tried in the caller's namespace."""
    try:
        sock = (open_socket or _xfrm_socket)()
    except OSError:
        return NO_XFRM
    with sock:
        gcm = try_sa(sock, SPI_AEAD, aead=True)
        if gcm == 0:
            return SUPPORTED
        no_esp = try_sa(sock, SPI_NULL, aead=False) == errno.EPROTONOSUPPORT
    if gcm == errno.EPERM:
        return NOT_ALLOWED
    no_gcm = gcm == errno.ENOSYS  # attach_aead(): "Requested AEAD algorithm not found"
    if no_esp or no_gcm:
        return NO_ESP_NO_GCM if no_esp and no_gcm else NO_ESP if no_esp else NO_GCM
    print(f"xfrm: an ESP SA with {AEAD} was refused: {os.strerror(gcm)}", file=sys.stderr)
    return REFUSED


def _xfrm_socket():
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_XFRM)
    sock.settimeout(5)
    sock.bind((0, 0))
    return sock


if __name__ == "__main__":  # a probe task (runtimes.swarm.ipsec): edgebed's own code, with NET_ADMIN
    sys.exit(esp_support())
