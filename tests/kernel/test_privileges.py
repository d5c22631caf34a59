"""kernel.privileges.drop_privileges: what a role, a command's program, a plugin or a job keeps of
its node's powers (nothing), checked in forked children: the sets the kernel reports, netlink
changes refused as root, and no way back through exec (root's, or a file with capabilities)."""

import errno
import os
import shutil
import subprocess
import threading

import pytest

from testbed.kernel.privileges import PrivilegeError, drop_privileges, process_status

from helpers import in_child, needs_root

CLONE_NEWNET = 0x40000000


def _status_of(argv: list[str]) -> dict:
    """The capability lines of a program's own /proc/self/status (what exec gave it)."""
    out = subprocess.run(argv + ["/proc/self/status"], capture_output=True, text=True).stdout
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in out.splitlines()) if k.startswith("Cap")}


def test_a_child_that_drops_has_no_capability_and_no_new_privileges():
    got = in_child(lambda: {"returned": drop_privileges(), "read": process_status(),
                            "exec": _status_of(["cat"])})
    sets = ("CapInh", "CapPrm", "CapEff", "CapAmb") + (("CapBnd",) if os.geteuid() == 0 else ())
    assert "error" not in got, got
    assert all(got["read"][k] == 0 for k in sets) and got["read"]["NoNewPrivs"] == 1, got
    assert got["returned"] == got["read"]
    # what it execs (as root: a root exec would otherwise get the bounding set) starts with nothing
    assert {got["exec"][k] for k in sets} == {"0000000000000000"}, got["exec"]


def test_the_parent_keeps_its_capabilities():
    def powers():  # a pytest worker's own threads come and go meanwhile: only the powers count
        return {k: v for k, v in process_status().items() if k != "Threads"}

    before = powers()
    in_child(drop_privileges)
    assert powers() == before and before["CapEff"] == process_status()["CapEff"]


def test_a_process_with_a_second_thread_is_refused():
    """Capabilities are per thread: a thread that did not drop would keep them."""
    def with_thread():
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            drop_privileges()
            return {"dropped": True}
        except PrivilegeError as e:
            return {"refused": str(e)}
        finally:
            stop.set()
            t.join()

    got = in_child(with_thread)
    assert "capabilities are per thread" in got.get("refused", ""), got


def _try_netlink_changes(capped_ip: str) -> dict:
    """In a namespace of its own: a veth with an HTB root, then drop, then try to undo it."""
    import ctypes

    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
        return {"error": "unshare"}
    with IPRoute() as ipr:
        ipr.link("add", ifname="d0", kind="veth", peer="d1")
        idx = ipr.link_lookup(ifname="d0")[0]
        ipr.link("set", index=idx, state="up")
        ipr.tc("add", "htb", index=idx, handle="1:", default=1)
        drop_privileges()
        out = {}
        for name, call in (("tc_del", lambda: ipr.tc("del", index=idx, parent=0xFFFFFFFF)),
                           ("addr_add", lambda: ipr.addr("add", index=idx, address="10.99.0.9", prefixlen=32))):
            try:
                call()
                out[name] = 0
            except NetlinkError as e:
                out[name] = e.code
        out["roots"] = [q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=idx) if q["parent"] == 0xFFFFFFFF]
        out["addresses"] = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=idx)]
    out["tc"] = subprocess.run(["tc", "qdisc", "del", "dev", "d0", "root"], capture_output=True, text=True).stderr
    out["ip"] = subprocess.run(["ip", "addr", "add", "10.99.0.9/32", "dev", "d0"], capture_output=True,
                               text=True).stderr
    if capped_ip:  # a copy of `ip` granted CAP_NET_ADMIN as a file capability
        try:
            out["capped_ip"] = subprocess.run([capped_ip, "addr", "add", "10.99.0.9/32", "dev", "d0"],
                                              capture_output=True, text=True).stderr
        except PermissionError:  # the kernel refuses the exec: it could not give the file its capability
            out["capped_ip"] = "exec refused"
    return out


@needs_root
@pytest.mark.skipif(not (shutil.which("tc") and shutil.which("ip")), reason="needs iproute2's tc and ip")
def test_root_without_capabilities_cannot_delete_a_qdisc_or_add_an_address(tmp_path):
    capped_ip = ""
    if shutil.which("setcap"):
        capped_ip = str(tmp_path / "ip")
        shutil.copy(shutil.which("ip"), capped_ip)
        os.chmod(tmp_path, 0o755)
        subprocess.run(["setcap", "cap_net_admin+ep", capped_ip], check=True)
    got = in_child(lambda: _try_netlink_changes(capped_ip))
    assert "error" not in got, got
    assert (got["tc_del"], got["addr_add"]) == (errno.EPERM, errno.EPERM), got
    assert got["roots"] == ["htb"] and "10.99.0.9" not in got["addresses"], got
    assert "Operation not permitted" in got["tc"] and "Operation not permitted" in got["ip"], got
    if capped_ip:
        assert got["capped_ip"] == "exec refused", got

