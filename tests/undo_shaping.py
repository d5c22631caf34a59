"""A command workload's program that tries to undo its node's emulation (SECURITY.md: user code
without the node's powers), run by tests as `{python} -c ... {address} {master_addr} {rank}`.

Each worker tries, on the interface holding its address, what `tc qdisc del dev IF root` and
`ip addr add 10.99.0.9/32 dev IF` ask the kernel for (netlink, pyroute2: node images have no
iproute2), and the two programs too where the node has them; it reports the errno of each
(0: it worked) and whether its root qdisc is still HTB. Then rank 1 sends to rank 0 over TCP for
SECONDS and rank 0 reports the rate it received, over the last SECONDS - WARM seconds: the test's
profile shapes only the uplink, so rank 1's own qdisc is all that holds that rate down.
"""

import shutil
import socket
import subprocess
import sys
import time

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

import edgebed

PORT, SECONDS, WARM = 29501, 5.0, 1.5
TC_H_ROOT = 0xFFFFFFFF
STOLEN = "10.99.0.9"


def netlink_errno(call) -> int:
    try:
        call()
        return 0
    except NetlinkError as e:
        return e.code


def program_status(argv: list[str]) -> int:
    """The program's exit status, or -1 where the node has no such program."""
    if shutil.which(argv[0]) is None:
        return -1
    return subprocess.run(argv, capture_output=True).returncode


def try_to_unshape(address: str) -> dict:
    with IPRoute() as ipr:
        idx = next(a["index"] for a in ipr.get_addr(family=2) if a.get_attr("IFA_ADDRESS") == address)
        ifname = ipr.get_links(idx)[0].get_attr("IFLA_IFNAME")
        out = {"tc_del_errno": netlink_errno(lambda: ipr.tc("del", index=idx, parent=TC_H_ROOT)),
               "addr_add_errno": netlink_errno(lambda: ipr.addr("add", index=idx, address=STOLEN, prefixlen=32)),
               "tc_program_status": program_status(["tc", "qdisc", "del", "dev", ifname, "root"]),
               "ip_program_status": program_status(["ip", "addr", "add", f"{STOLEN}/32", "dev", ifname])}
        roots = [q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=idx) if q["parent"] == TC_H_ROOT]
        out["root_is_htb"] = float(roots == ["htb"])
        out["holds_stolen_address"] = float(any(a.get_attr("IFA_ADDRESS") == STOLEN for a in ipr.get_addr(index=idx)))
    return out


def receive(address: str) -> float:
    """Mbit/s received from rank 1 after WARM seconds (the first burst left out)."""
    srv = socket.create_server((address, PORT))
    srv.settimeout(60)
    conn, _ = srv.accept()
    conn.settimeout(30)  # a sender gone silent fails the program, not the run's stop
    start, counted = time.monotonic(), 0
    while True:
        data = conn.recv(1 << 16)
        if not data:
            break
        if time.monotonic() - start >= WARM:
            counted += len(data)
    took = time.monotonic() - start - WARM
    conn.close()  # the sender's sign that all arrived
    return counted * 8 / 1e6 / took


def send(master: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((master, PORT), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    chunk, end = b"x" * (1 << 16), time.monotonic() + SECONDS
    while time.monotonic() < end:
        conn.sendall(chunk)
    conn.shutdown(socket.SHUT_WR)
    conn.settimeout(60)
    conn.recv(1)  # until rank 0 has read everything: a container ends with its program, and its queue too
    conn.close()


def main(address: str, master: str, rank: int) -> None:
    tried = try_to_unshape(address)
    print("tried:", tried, flush=True)
    edgebed.report(step=1, **tried)
    if rank == 0:
        rate = receive(address)
        print(f"received {rate:.2f} Mbit/s", flush=True)
        edgebed.report(step=1, received_mbit=rate)
    else:
        send(master)
        print("sent", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
