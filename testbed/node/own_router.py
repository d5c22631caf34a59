"""A site's router as a container of its own (runtime swarm: runtimes.swarm.sites): it forwards
between its site's network and one network per WAN link, and shapes each WAN link's direction
away from it on the egress of that link's interface, by the same plans as the other runtimes'
routers (kernel.shaping). Needs CAP_NET_ADMIN and net.ipv4.ip_forward=1 (the service's sysctl).
"""

from __future__ import annotations

import time

from testbed.kernel.netlink import disable_offloads
from testbed.kernel.shaping import apply_direction, reshape
from testbed.node.own_link import iface_with, plan_from_dict, root_qdisc_bytes


class OwnRouter:
    def __init__(self):
        self.wan: dict[str, int] = {}  # peer site -> ifindex of the WAN link's interface

    def route(self, lan: str, wan: list[dict], routes: dict[str, str]) -> str:
        """`wan`: [{peer, address (this router's on that link), plan}]; `routes`: other sites'
        subnets -> the next router's address."""
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ifnames = [ipr.get_links(iface_with(ipr, lan))[0].get_attr("IFLA_IFNAME")]
            for w in wan:
                idx = iface_with(ipr, w["address"])
                apply_direction(ipr, idx, plan_from_dict(w["plan"]))
                self.wan[w["peer"]] = idx
                ifnames.append(ipr.get_links(idx)[0].get_attr("IFLA_IFNAME"))
            for subnet, via in routes.items():
                ipr.route("add", dst=subnet, gateway=via)
        disable_offloads(None, ifnames)  # forwarded packets MTU-sized, counted per packet
        return f"routing {len(routes)} subnet(s) over {len(wan)} WAN link(s)"

    def reshape(self, peer: str, old: dict, new: dict) -> str:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            reshape(ipr, self.wan[peer], plan_from_dict(old), plan_from_dict(new))
        return f"wan to {peer} reshaped"

    def counters(self) -> dict[str, dict]:
        """Per peer site: what the WAN link carried towards it (up) and from it (down)."""
        from testbed.kernel.netlink import link_counters
        from testbed.kernel.rtnl import Rtnl

        out = {}
        links = link_counters(None)
        with Rtnl() as rt:
            for peer, idx in self.wan.items():
                up = root_qdisc_bytes(rt, idx)
                rx_bytes, rx_packets, _, _ = links[idx]
                out[peer] = {"up_bytes": up["bytes"], "up_packets": up["packets"],
                             "down_bytes": rx_bytes, "down_packets": rx_packets, "time": time.time()}
        return out
