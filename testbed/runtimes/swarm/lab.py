"""A swarm of N hosts on this one machine (`edgebed lab up --hosts N`), for CI and for users
without a cluster. Each host is a `dockerd` of its own, in a network namespace of its own
(its own containerd, data root, iptables, hostname), and the hosts are joined by an underlay:
a bridge in a namespace of the lab's, with this machine's end at RUNNER_ADDRESS. The first host
is the swarm's manager; the others join it. Nothing in edgebed's swarm runtime knows it runs on
a lab: it talks to the manager's engine as it would to a real cluster's (the recipe measured in
shared/FACTS.md: `nsenter --net`, not `ip netns exec`, which remounts /sys).

Each host's swarm node carries the label `edgebed.engine` (its engine's address), which is how
the runtime loads the node image onto a host; on a real cluster the user sets it (README).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

from testbed.errors import BadInput, HostCannot
from testbed.kernel.netlink import create_netns, ns_iproute, remove_netns

STATE_DIR = Path("/run/edgebed-lab")
DATA_DIR = Path("/var/lib/edgebed-lab")
UNDERLAY = "10.201.0"  # hosts at .1, .2, ...; this machine (the runner) at .254
RUNNER_ADDRESS = f"{UNDERLAY}.254"
UNDERLAY_NETNS = "eb-lab-u"
ADDRESS_POOL = "10.203.0.0/16"  # the swarm's networks (ingress, overlays without a subnet), clear of scenarios'
LOCAL_POOL = "10.204.0.0/16"  # each engine's own (docker_gwbridge): apart from the swarm's, or an overlay the
# swarm picks can collide with a host's bridge (its task is rejected: "Pool overlaps")
ENGINE_LABEL = "edgebed.engine"
LAB_LABEL = "edgebed.lab"
MAX_HOSTS = 8


@dataclass
class LabHost:
    name: str  # its hostname, as the swarm shows it
    netns: str
    address: str  # on the underlay
    socket: str  # its engine: unix://...
    pid: int = 0  # its dockerd

    @property
    def dir(self) -> Path:
        return STATE_DIR / self.name


def state_file() -> Path:
    return STATE_DIR / "lab.json"


def lab_hosts() -> list[LabHost]:
    """The hosts of the lab that is up (empty: none is)."""
    try:
        return [LabHost(**h) for h in json.loads(state_file().read_text())["hosts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _save(hosts: list[LabHost]) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state_file().write_text(json.dumps({"hosts": [asdict(h) for h in hosts], "runner_address": RUNNER_ADDRESS}))


def manager_url() -> Optional[str]:
    hosts = lab_hosts()
    return hosts[0].socket if hosts else None


def _client(url: str, timeout: int = 10):
    import docker

    return docker.DockerClient(base_url=url, timeout=timeout)


# -- the underlay ----------------------------------------------------------------------------
def _underlay(n: int) -> list[LabHost]:
    """The underlay's bridge, this machine's port on it, and one namespace per host plugged in."""
    from pyroute2 import IPRoute

    from testbed.runtimes.control.network import local_mac

    create_netns(UNDERLAY_NETNS)
    with ns_iproute(UNDERLAY_NETNS) as u:
        u.link("add", ifname="u0", kind="bridge", address=local_mac())  # fixed MAC: see control_net
        br = u.link_lookup(ifname="u0")[0]
        u.link("set", index=br, state="up")
    hosts = [LabHost(f"eb-lab-h{i}", f"eb-lab-h{i}", f"{UNDERLAY}.{i}", f"unix://{STATE_DIR}/eb-lab-h{i}/docker.sock")
             for i in range(1, n + 1)]
    with IPRoute() as ipr:
        _plug(ipr, "eb-lab-r", None, RUNNER_ADDRESS)
        for h in hosts:
            _plug(ipr, f"eb-lab-{h.name[-2:]}", h.netns, h.address)
    return hosts


def _plug(ipr, name: str, netns: Optional[str], address: str) -> None:
    """A veth from `netns` (None: this machine's own) to the underlay bridge, `address` on its end."""
    ipr.link("add", ifname=name, kind="veth", peer={"ifname": f"{name}-p"})
    ipr.link("set", index=ipr.link_lookup(ifname=f"{name}-p")[0], net_ns_fd=UNDERLAY_NETNS)
    with ns_iproute(UNDERLAY_NETNS) as u:
        port = u.link_lookup(ifname=f"{name}-p")[0]
        u.link("set", index=port, master=u.link_lookup(ifname="u0")[0], state="up")
    if netns is None:
        idx = ipr.link_lookup(ifname=name)[0]
        ipr.addr("add", index=idx, address=address, prefixlen=24)
        ipr.link("set", index=idx, state="up")
        return
    create_netns(netns)
    ipr.link("set", index=ipr.link_lookup(ifname=name)[0], net_ns_fd=netns)
    with ns_iproute(netns) as ns:
        idx = ns.link_lookup(ifname=name)[0]
        ns.link("set", index=idx, ifname="eth0")
        ns.addr("add", index=idx, address=address, prefixlen=24)
        ns.link("set", index=idx, state="up")
        ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")


# -- the engines -----------------------------------------------------------------------------
def _start_engine(h: LabHost, i: int, gpus: int = 0) -> None:
    h.dir.mkdir(parents=True, exist_ok=True)
    args = ["dockerd", "--data-root", str(DATA_DIR / h.name), "--exec-root", str(h.dir / "exec"),
            "--pidfile", str(h.dir / "docker.pid"), "-H", h.socket, "--cgroup-parent", h.name,
            "--bip", f"10.202.{i}.1/24", "--default-address-pool", f"base={LOCAL_POOL},size=24"]
    if gpus:  # advertised to the swarm only (placement, edgebed place): no device is behind them
        args += ["--node-generic-resource", f"gpu={gpus}"]
    script = f"hostname {h.name} && exec {' '.join(args)}"
    with open(h.dir / "dockerd.log", "ab") as log:
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{h.netns}", "--", "unshare", "--uts", "--",
                                 "sh", "-c", script], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    h.pid = proc.pid


def _wait_engine(h: LabHost, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = _client(h.socket)
            c.ping()
            return c
        except Exception:
            if not _alive(h.pid):
                break
            time.sleep(0.3)
    tail = (h.dir / "dockerd.log").read_text(errors="replace")[-600:] if (h.dir / "dockerd.log").exists() else ""
    raise HostCannot(f"lab host {h.name}: its dockerd did not answer within {timeout:.0f} s: {tail}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _form_swarm(hosts: list[LabHost]) -> None:
    manager = _wait_engine(hosts[0])
    manager.swarm.init(advertise_addr=hosts[0].address, listen_addr=f"{hosts[0].address}:2377",
                       default_addr_pool=[ADDRESS_POOL], subnet_size=24)
    token = manager.swarm.attrs["JoinTokens"]["Worker"]
    for h in hosts[1:]:
        _wait_engine(h).swarm.join(remote_addrs=[f"{hosts[0].address}:2377"], join_token=token,
                                   advertise_addr=h.address, listen_addr=f"{h.address}:2377")
    by_name = {h.name: h for h in hosts}
    deadline = time.monotonic() + 60
    while True:
        nodes = manager.nodes.list()
        ready = [n for n in nodes if n.attrs["Status"]["State"] == "ready"]
        if len(ready) == len(hosts):
            break
        if time.monotonic() > deadline:
            raise HostCannot(f"lab: {len(ready)} of {len(hosts)} hosts ready after 60 s")
        time.sleep(0.5)
    for n in nodes:  # the engine's address: how the runtime loads images onto the host
        h = by_name[n.attrs["Description"]["Hostname"]]
        spec = n.attrs["Spec"]
        spec["Labels"] = {**spec.get("Labels", {}), ENGINE_LABEL: h.socket, LAB_LABEL: "1"}
        n.update(spec)


def lab_up(n: int, say: Callable[[str], None] = lambda s: None, gpus: int = 0) -> list[LabHost]:
    """Bring up a lab of `n` hosts (each advertising `gpus` GPUs to the swarm's scheduler, for
    placement; no device is behind them); on any error, nothing of it is left."""
    if not 1 <= n <= MAX_HOSTS:
        raise BadInput(f"--hosts: 1 to {MAX_HOSTS}, not {n}")
    if lab_hosts():
        raise HostCannot("a lab is up already (`edgebed lab down` removes it)")
    for tool in ("dockerd", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            raise HostCannot(f"the lab needs {tool} (apt install docker.io util-linux)")
    try:
        hosts = _underlay(n)
        _save(hosts)  # recorded before anything runs: `lab down` finds it all should we fail next
        for i, h in enumerate(hosts, 1):
            _start_engine(h, i, gpus)
        _save(hosts)
        _form_swarm(hosts)
        say(f"lab: {n} host(s) up; manager {hosts[0].socket} (DOCKER_HOST for docker's own CLI)")
        return hosts
    except BaseException:
        lab_down()
        raise


def lab_down(say: Callable[[str], None] = lambda s: None) -> list[str]:
    """Remove the lab: the engines (swarm left, containers gone), namespaces, data and cgroups."""
    hosts = lab_hosts() or [LabHost(f"eb-lab-h{i}", f"eb-lab-h{i}", "", f"unix://{STATE_DIR}/eb-lab-h{i}/docker.sock")
                            for i in range(1, MAX_HOSTS + 1) if Path(f"/run/netns/eb-lab-h{i}").exists()]
    problems: list[str] = []
    # the engines stop side by side: each may take its 20 s to exit, and none waits for another
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        list(pool.map(lambda h: _stop_engine(h, problems), hosts))
    for h in hosts:
        _remove_netns(h.netns)
        _remove_cgroups(h.name)
        shutil.rmtree(DATA_DIR / h.name, ignore_errors=True)
        if (DATA_DIR / h.name).exists():
            problems.append(f"{DATA_DIR / h.name} could not be removed")
    _remove_netns(UNDERLAY_NETNS)
    _remove_root_links()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    try:
        DATA_DIR.rmdir()  # once empty: nothing of the lab is left on the machine
    except OSError:
        pass
    if hosts:
        say(f"lab: {len(hosts)} host(s) removed")
    return problems


def _stop_engine(h: LabHost, problems: list[str]) -> None:
    try:
        c = _client(h.socket, timeout=5)
        for ct in c.containers.list(all=True, ignore_removed=True):
            ct.remove(force=True)
        c.swarm.leave(force=True)
    except Exception:
        pass
    pid = h.pid or _pidfile(h)
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    _unmount_under(DATA_DIR / h.name)
    _unmount_under(h.dir)


def _remove_netns(name: str) -> None:
    try:
        remove_netns(name)
    except FileNotFoundError:
        pass


def _pidfile(h: LabHost) -> int:
    try:
        return int((h.dir / "docker.pid").read_text())
    except (OSError, ValueError):
        return 0


def _unmount_under(root: Path) -> None:
    """Lazily unmount whatever a dead engine left mounted under `root` (overlays, netns files)."""
    try:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return
    for m in sorted((m for m in mounts if m.startswith(str(root) + "/") or m == str(root)), reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)


def _remove_cgroups(name: str) -> None:
    from testbed.kernel.cgroups import ROOT

    for d in sorted(ROOT.glob(f"*/{name}"), reverse=True) + [ROOT / name]:
        if d.is_dir():
            for sub in sorted(d.glob("*/"), reverse=True):
                try:
                    sub.rmdir()
                except OSError:
                    pass
            try:
                d.rmdir()
            except OSError:
                pass


# the lab's veth ends that can sit in this machine's namespace: the runner's port, and a host's end
# before it moves into the host's namespace (a bring-up that failed there leaves it behind)
ROOT_LINK = re.compile(r"eb-lab-(r|h[1-9][0-9]?)(-p)?")


def _remove_root_links() -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME") or ""
            if ROOT_LINK.fullmatch(name):
                try:
                    ipr.link("del", index=link["index"])
                except Exception:  # its peer went first: deleting one end of a veth removes both
                    pass
