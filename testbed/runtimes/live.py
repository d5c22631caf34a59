"""Changes to a running cluster (the scenario's timeline, `edgebed link/cpu/kill/...`): every
operation the timeline and the live commands call is declared here. What all runtimes share is
written here: a link change is the old direction with the given fields replaced, planned like at
bring-up and installed in place (`_reshape`: shaping.reshape on the interface `_link_iface`
gives), latency the kernel cannot make goes to the node's transport over the control channel;
a partition is bookkept here and made by `_cut_traffic`. The rest (CPU quota, stress, freeze,
kill, and the two hooks) is each runtime's: a runtime without one says so by name
(runtimes.local_nodes has them for nodes whose namespace and cgroup are on this host).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Optional

from testbed.kernel.shaping import DirectionPlan, htb_burst, plan_direction, reshape
from testbed.scenario.links import Direction, inherit

WHICH = {"up": "uplink", "down": "downlink"}
WAN_PREFIX = "wan:"  # an event's target `wan:A-B`: the WAN link between sites A and B


def wan_sites(target: str) -> tuple[str, str]:
    a, sep, b = target[len(WAN_PREFIX):].partition("-")
    return a, b


class LiveOps:
    """The live changes of runtimes.base.Runtime (its base class), which supplies self.name,
    self.handles (node -> handle with node, uplink, downlink, cgroup, processes), self.caps,
    self.hub and self.fabric."""

    def __init__(self) -> None:
        self._live_directions: dict[str, dict[str, Direction]] = {}  # each node's directions now
        self._cuts: dict[str, set[str]] = {}  # each node's partitioned peers

    def _directions(self, node: str) -> dict[str, Direction]:
        cur = self._live_directions
        if node not in cur:
            link = self.handles[node].node.link
            cur[node] = {"up": link.uplink, "down": link.downlink}
        return cur[node]

    def unsupported(self, what: str) -> NotImplementedError:
        """The error of an operation this runtime does not have."""
        return NotImplementedError(f"runtime {getattr(self, 'name', type(self).__name__)} does not support {what}")

    @contextmanager
    def _link_iface(self, node: str, which: str):
        """(netlink socket, ifindex) where one direction of a node's link is shaped, for `_reshape`."""
        raise self.unsupported("changing a link on this host (no _link_iface)")
        yield

    def set_link(self, node: str, direction: str, fields: dict) -> str:
        """Change rate/latency/jitter/loss of one or both directions of a node's access link (or,
        for `wan:A-B`, of the WAN link between sites A and B)."""
        if node.startswith(WAN_PREFIX):
            a, b = wan_sites(node)
            if self.fabric is None:
                raise ValueError(f"{node}: this run has no sites")
            return self.fabric.set_wan(a, b, direction, fields)
        h = self.handles[node]
        dirs = self._directions(node)
        done = []
        for which in (("up", "down") if direction == "both" else (direction,)):
            old_plan: DirectionPlan = getattr(h, WHICH[which])
            new_dir = inherit(Direction(**fields), dirs[which])  # the change over what is
            peers = getattr(h.node.link, f"{WHICH[which]}_peers")
            new_plan = plan_direction(new_dir, self.caps_of(node), peers)
            self._reshape(node, which, old_plan, new_plan)
            setattr(h, WHICH[which], new_plan)
            dirs[which] = new_dir
            done.append(which)
        self._publish_delays(node)
        return f"{'+'.join(done)}: " + ", ".join(f"{k}={v}" for k, v in fields.items())

    def set_rates(self, node: str, rates: dict[str, float]) -> None:
        """A trace replay's tick (runtimes.replay): each direction's rate changed in place, the
        rest of its plan as it is (no delays to publish, no filters touched)."""
        h = self.handles[node]
        for which, rate in rates.items():
            old: DirectionPlan = getattr(h, WHICH[which])
            self._reshape(node, which, old, replace(old, rate_bps=float(rate), burst_bytes=htb_burst(rate)))
            self.note_rates(node, {which: rate})

    def note_rates(self, node: str, rates: dict[str, float]) -> None:
        """Rates now in force on a node's link, in this object's books only (set by `set_rates`, or
        by a node that replays its own trace): a later `set_link` changes the link from them."""
        h = self.handles[node]
        dirs = self._directions(node)
        for which, rate in rates.items():
            plan: DirectionPlan = getattr(h, WHICH[which])
            setattr(h, WHICH[which], replace(plan, rate_bps=float(rate), burst_bytes=htb_burst(rate)))
            dirs[which] = dirs[which].model_copy(update={"rate": float(rate)})

    def replay_on_node(self, node: str, schedules: dict, t0: float) -> bool:
        """Hand a node its trace schedules (node.trace_replay.schedules_to_wire) to replay itself,
        by its own clock from run time `t0`; False: this runtime's nodes do not (the runner's
        clock drives `set_rates`)."""
        return False

    def _reshape(self, node: str, which: str, old: DirectionPlan, new: DirectionPlan) -> None:
        """Install `new` in place of `old` on one direction of a node's link."""
        with self._link_iface(node, which) as (ipr, ifindex):
            reshape(ipr, ifindex, old, new)

    def _publish_delays(self, node: str) -> None:
        """The node's transport delays (the no-netem fallback) go to it over the control channel."""
        h = self.handles[node]
        if self.hub is not None:
            self.hub.set_delay(node, {"up": h.uplink.transport_delay_s, "up_jitter": h.uplink.transport_jitter_s,
                                      "down": h.downlink.transport_delay_s,
                                      "down_jitter": h.downlink.transport_jitter_s})

    def set_cpus(self, node: str, cpus: Optional[float]) -> str:
        """Change a node's CPU quota (None: no limit)."""
        raise self.unsupported("changing a CPU quota")

    def set_stress(self, node: str, load: float) -> str:
        """Replace the node's background stress with `load` cores' worth (0: none)."""
        raise self.unsupported("changing background stress")

    def freeze(self, node: str, frozen: bool) -> str:
        """Stop every process of the node where it is (frozen) or let it go on."""
        raise self.unsupported("freezing a node")

    def kill_node(self, node: str) -> str:
        """SIGKILL every process of the node (its role, stress, children), as a crash would."""
        raise self.unsupported("killing a node")

    def partition(self, node: str, peers: list[str], cut: bool) -> str:
        """Drop all traffic between `node` and `peers` (cut) or let it through again (heal; no
        peers: every cut of the node), in the node's own namespace (`_cut_traffic`): the rest of
        its traffic is untouched."""
        cuts = self._cuts.setdefault(node, set())
        targets = set(peers) if peers or cut else set(cuts)
        changed = [p for p in sorted(targets) if cut != (p in cuts)]  # not already cut / healed
        if changed:
            self._cut_traffic(node, [self.handles[p].node.address for p in changed], cut)
        for peer in changed:
            (cuts.add if cut else cuts.discard)(peer)
        return ("cut off from " if cut else "healed with ") + _some(changed)

    # The timeline's actions (run/timeline.py, `edgebed link/cpu/...`) and the operation each is:
    # (ops, node, the change's fields) -> what changed. `restart` is the runner's (it starts a role).
    ACTIONS: dict[str, Callable[["LiveOps", str, dict], str]] = {
        "link": lambda ops, n, f: ops.set_link(n, f["direction"], {k: v for k, v in f.items() if k != "direction"}),
        "cpu": lambda ops, n, f: ops.set_cpus(n, f["cpus"]),
        "stress": lambda ops, n, f: ops.set_stress(n, f["load"]),
        "pause": lambda ops, n, f: ops.freeze(n, True),
        "resume": lambda ops, n, f: ops.freeze(n, False),
        "partition": lambda ops, n, f: ops.partition(n, f.get("peers", []), True),
        "heal": lambda ops, n, f: ops.partition(n, f.get("peers", []), False),
        "kill": lambda ops, n, f: ops.kill_node(n),
    }

    def apply_change(self, action: str, node: str, fields: dict) -> str:
        """One change to the running cluster, by its action's name (ACTIONS): what changed, or raises."""
        if action not in self.ACTIONS:
            raise ValueError(f"unknown action {action}")
        return self.ACTIONS[action](self, node, fields)

    def _cut_traffic(self, node: str, addresses: list[str], cut: bool) -> None:
        """Drop (cut) or pass again the node's traffic with `addresses`, in the node's own namespace."""
        raise self.unsupported("partitions")


NAMED = 8  # peers a partition's description names (a device gone offline is cut from thousands)


def _some(names: list[str]) -> str:
    if not names:
        return "nobody (nothing to change)"
    if len(names) <= NAMED:
        return ", ".join(names)
    return f"{len(names)} nodes ({', '.join(names[:NAMED])}, ...)"
