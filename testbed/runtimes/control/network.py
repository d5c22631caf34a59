"""The run's control network: how nodes reach the runner, apart from the links under study.

Every node gets a second interface, `ctl0`, on a bridge in a namespace of the run's own
(eb-<run>-ctl), where the runner's hub listens (runtimes.control.hub): the nodes' records, reports and
acks go up to RECORDS_PORT, heartbeats, the stop and requests come down from CONTROL_PORT
(testbed.node.channel). It is not shaped and not counted: the emulated links carry training
traffic only, as a testbed's management network is kept apart from its experiment network.
Its bridge ports are isolated: a node reaches the runner over it, never another node (past
1,023 nodes the bridge is a tree, kernel/bridges.py, isolated at the root too).
Link-local addresses (169.254.0.0/16) never overlap a scenario's subnets (validation refuses
link-local ones), and each run's control network is its own, so two runs do not collide.
"""

from __future__ import annotations

import ipaddress
import secrets

from testbed.kernel.bridges import BridgeTree
from testbed.kernel.netlink import create_netns, ns_iproute
from testbed.kernel.rtnl import Rtnl
from testbed.runtimes.state import RunState
from testbed.runtimes.ticks import Tick, no_ticks

CONTROL_SUBNET = ipaddress.IPv4Network("169.254.0.0/16")
RUNNER_ADDRESS = "169.254.0.1"  # the hub, on the control bridge
RECORDS_PORT = 7000  # up: nodes PUSH
CONTROL_PORT = 7001  # down: the hub PUBlishes
BRIDGE = "ctl"


def local_mac() -> str:
    """A random unicast, locally administered MAC address."""
    b = bytearray(secrets.token_bytes(6))
    b[0] = (b[0] & 0xFC) | 0x02
    return ":".join(f"{x:02x}" for x in b)


def control_netns(run_id: str) -> str:
    return f"eb-{run_id}-ctl"


class ControlNetwork:
    def __init__(self, state: RunState):
        self.state, self.run_id = state, state.run_id
        self.netns = control_netns(self.run_id)
        self.addresses: dict[str, str] = {}  # node -> its ctl0 address

    def build(self, node_netns: dict[str, str], progress: Tick = no_ticks) -> None:
        """The control bridge, and every node's ctl0 plugged into it."""
        self.state.netns.append(self.netns)  # recorded first: `down` finds it even if we crash next
        self.state.save()
        create_netns(self.netns, ipv6=False)
        hosts = CONTROL_SUBNET.hosts()
        if str(next(hosts)) != RUNNER_ADDRESS:
            raise AssertionError("the runner takes the control subnet's first address")
        with ns_iproute(self.netns) as c:
            # A bridge's own MAC is its lowest port's unless set: it would change as ports are
            # plugged in, and a container that resolved the runner's address before that sends
            # to the old one, which the bridge drops, until its ARP entry ages (tens of seconds
            # without an answer).
            c.link("add", ifname=BRIDGE, kind="bridge", address=local_mac())
            br = c.link_lookup(ifname=BRIDGE)[0]
            c.addr("add", index=br, address=RUNNER_ADDRESS, prefixlen=CONTROL_SUBNET.prefixlen)
            c.link("set", index=br, state="up")
            tree = BridgeTree(c, br, BRIDGE, len(node_netns), isolated=True)  # its leaves made as they fill
            with Rtnl(self.netns) as rt:  # kernel.rtnl: pyroute2's cost a request adds up over a fleet
                for i, (node, netns) in enumerate(node_netns.items()):
                    self.addresses[node] = str(next(hosts))
                    self._plug(rt, tree.bridge_for(i), i, netns, self.addresses[node])
                    progress("control links", i + 1, len(node_netns))

    @staticmethod
    def _plug(rt: Rtnl, br: int, i: int, netns: str, address: str) -> None:
        pidx = rt.add_veth(f"n{i}", netns, "ctl0", master=br, up=True)
        with Rtnl(netns) as n:
            idx = n.index("ctl0")
            n.add_address(idx, address, CONTROL_SUBNET.prefixlen)
            n.set_link(idx, up=True)
        rt.isolate_port(pidx)  # a node reaches the runner only, never another node

    def open_hub(self, run_dir, keys):
        """The hub, listening on the bridge (keys: the run's, runtimes.control.channel_auth.RunKeys)."""
        from testbed.runtimes.control.hub import ControlHub

        return ControlHub(self.netns, RUNNER_ADDRESS, RECORDS_PORT, CONTROL_PORT, run_dir, keys)

    @staticmethod
    def urls() -> tuple[str, str]:
        """(up, down): where a node sends to the hub, and where it listens to it."""
        return f"tcp://{RUNNER_ADDRESS}:{RECORDS_PORT}", f"tcp://{RUNNER_ADDRESS}:{CONTROL_PORT}"
