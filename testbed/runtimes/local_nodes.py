"""Live changes for nodes whose network namespace and cgroup are on the runner's host (the netns
runtime's nodes, the docker runtime's containers): CPU quota and freeze by the node's cgroup, a
kill by its cgroup's member processes, a partition by netfilter rules inside its namespace.
A runtime whose nodes are elsewhere (swarm) asks them instead."""

from __future__ import annotations

import os
import signal
from typing import Iterable, Optional

from testbed.errors import HostCannot
from testbed.runtimes.live import LiveOps


def netns_name(run_id: str, node: str) -> str:
    """The named network namespace of a node on this host (`down` finds it by this shape)."""
    return f"eb-{run_id}-{node}"


class LocalNodeOps(LiveOps):
    """Mixed into a runtime (before Runtime) whose handles have `cgroup` (kernel.cgroups) and `netns`."""

    def set_cpus(self, node: str, cpus: Optional[float]) -> str:
        self.handles[node].cgroup.set_cpus(cpus)
        return f"cpu quota {cpus} cores"

    def freeze(self, node: str, frozen: bool) -> str:
        self.handles[node].cgroup.freeze(frozen)
        return "frozen" if frozen else "thawed"

    def kill_node(self, node: str) -> str:
        """SIGKILL every process of the node (its role, stress, children), as a crash would."""
        h = self.handles[node]
        pids = h.cgroup.member_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return f"killed {len(pids)} process(es)"

    def link_stats(self, links: Optional[Iterable[str]] = None) -> dict[str, dict]:
        """Per node and direction ("w0/up"; `links`: those alone): its access class's rate and
        counters, where it has an HTB class (kernel.shaping.read_htb_stats; the fidelity monitor
        reads them each second)."""
        from testbed.kernel.shaping import read_htb_stats

        keys = [f"{n}/{w}" for n in list(self.handles) for w in ("up", "down")] if links is None else links
        out = {}
        for key in keys:
            node, which = key.rsplit("/", 1)
            try:
                with self._link_iface(node, which) as (ipr, ifindex):
                    st = read_htb_stats(ipr, ifindex)
            except Exception:  # a node being removed, a namespace gone: no reading this time
                continue
            if st is not None:
                out[key] = st
        return out

    def _cut_traffic(self, node: str, addresses: list[str], cut: bool) -> None:
        """netfilter rules in the node's namespace: the host's tables never see them."""
        import shutil
        import subprocess

        if shutil.which("iptables-restore") is None:
            raise HostCannot("partition/heal need iptables (apt install iptables)")
        if not addresses:
            return
        # one iptables-restore for every rule (a process per rule took seconds for a node cut
        # off from a fleet: availability cuts a worker from every other node)
        op = "-A" if cut else "-D"
        rules = [f"{op} {chain} {flag} {addr} -j DROP" for addr in addresses
                 for chain, flag in (("OUTPUT", "-d"), ("INPUT", "-s"))]
        subprocess.run(["ip", "netns", "exec", self.handles[node].netns, "iptables-restore", "-w", "--noflush"],
                       input="*filter\n" + "\n".join(rules) + "\nCOMMIT\n", check=True, capture_output=True,
                       text=True)


def unencrypted_problems(sc) -> list[str]:
    """network.encrypt asks for what links on one machine do not have (runtime swarm's overlays do)."""
    if not sc.network.encrypt:
        return []
    return ["network.encrypt: encrypts runtime swarm's overlay between hosts (runtime: swarm); a netns or docker "
            "run's links never leave this machine, so there is no wire to encrypt"]
