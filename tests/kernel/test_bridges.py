"""A switch past one bridge (kernel/bridges.py): a Linux bridge holds 1,023 ports, so the netns
runtime's switches become trees of bridges; the runtimes whose nodes share one Docker network
refuse more nodes than one bridge holds, before anything starts."""

from __future__ import annotations

import pytest

from testbed import runtimes
from testbed.kernel.bridges import BRIDGE_PORTS, LEAF_PORTS, BridgeTree, leaf_count
from testbed.plan import parse_scenario


class FakeIPRoute:
    """What BridgeTree asks of pyroute2's IPRoute, recorded: links by name, masters, isolation."""

    def __init__(self):
        self.links: dict[str, dict] = {"br0": {"index": 1, "kind": "bridge"}}
        self.isolated: set[int] = set()

    def _name(self, index: int) -> str:
        return next(n for n, link in self.links.items() if link["index"] == index)

    def link(self, op, index=None, ifname=None, kind=None, peer=None, master=None, state=None):
        if op == "add":
            for name in [ifname] + ([peer["ifname"]] if peer else []):
                self.links[name] = {"index": len(self.links) + 1, "kind": kind}
        elif op == "set":
            link = self.links[self._name(index)]
            if master is not None:
                link["master"] = master
            if state is not None:
                link["state"] = state

    def link_lookup(self, ifname):
        return [self.links[ifname]["index"]] if ifname in self.links else []

    def brport(self, op, index, isolated):
        self.isolated.add(index)


def test_a_switch_that_fits_one_bridge_stays_one():
    assert leaf_count(1023) == 0 and leaf_count(1022, extra=1) == 0
    assert leaf_count(1023, extra=1) == 2 and leaf_count(1024) == 2 and leaf_count(2500) == 3
    ipr = FakeIPRoute()
    tree = BridgeTree(ipr, 1, "br0", 1022, extra=1)
    assert {tree.bridge_for(j) for j in range(1022)} == {1} and list(ipr.links) == ["br0"] and not tree.links


def test_past_one_bridge_every_leaf_holds_at_most_leaf_ports_and_hangs_off_the_root():
    ipr = FakeIPRoute()
    tree = BridgeTree(ipr, 1, "br0", 2500)
    bridges = [tree.bridge_for(j) for j in range(2500)]
    names = [ipr._name(b) for b in bridges]
    assert names[0] == names[LEAF_PORTS - 1] == "br0-1" and names[LEAF_PORTS] == "br0-2" and names[-1] == "br0-3"
    assert max(names.count(n) for n in set(names)) == LEAF_PORTS <= BRIDGE_PORTS
    for k in (1, 2, 3):  # each leaf's uplink on the leaf, its other end on the root
        assert ipr.links[f"br0-{k}u"]["master"] == ipr.links[f"br0-{k}"]["index"]
        assert ipr.links[f"br0-{k}d"]["master"] == 1 and ipr.links[f"br0-{k}"]["state"] == "up"
    assert tree.links == ["br0-1u", "br0-1d", "br0-2u", "br0-2d", "br0-3u", "br0-3d"]
    assert not ipr.isolated  # the data switch: nodes reach each other
    # the root holds the leaves' ends only: 3 ports
    assert sum(1 for link in ipr.links.values() if link.get("master") == 1) == 3


def test_the_control_switch_s_leaves_are_isolated_at_the_root():
    """Node ports are isolated on their leaf (control_net); the root's ends of the leaves are
    isolated too, so a node on one leaf cannot reach a node on another through the root, while
    the runner (the root bridge's own address) is reached from every leaf."""
    ipr = FakeIPRoute()
    tree = BridgeTree(ipr, 1, "br0", 1500, isolated=True)
    for j in range(1500):
        tree.bridge_for(j)
    assert ipr.isolated == {ipr.links["br0-1d"]["index"], ipr.links["br0-2d"]["index"]}
    assert ipr.links["br0-1u"]["index"] not in ipr.isolated  # the leaf's way up is not


@pytest.mark.parametrize("runtime", ["docker", "swarm"])
def test_runtimes_on_one_docker_network_refuse_more_nodes_than_a_bridge_holds(runtime):
    # 1,023 workers once passed validation and failed 87 s into bring-up ("Exchange full")
    sc = parse_scenario({"runtime": runtime, "workers": [{"count": 1021}]})
    line, = runtimes.scenario_problems(sc)
    assert line.startswith(f"workers: 1023 nodes and the runner on one network of runtime {runtime}")
    assert "at most 1022 nodes" in line
    assert runtimes.scenario_problems(parse_scenario({"runtime": runtime, "workers": [{"count": 1020}]})) == []
    assert runtimes.scenario_problems(parse_scenario({"runtime": "netns", "workers": [{"count": 1500}]})) == []


def test_a_run_past_the_machine_s_memory_or_open_files_is_one_line_naming_the_limit():
    from testbed.runtimes.preflight import NODE_FILES, NODE_PROCESS_MIB, capacity_problems

    sc = parse_scenario({"runtime": "netns", "workers": [{"count": 1000}]})  # 1,002 nodes with ps and eval
    assert capacity_problems(sc, memory_mib=64 * 1024, files=20_000) == []
    line, = capacity_problems(sc, memory_mib=24 * 1024, files=20_000)
    assert line.startswith("workers: 1002 nodes need about 37.2 GiB (1002 training processes at once") \
        and "24.0 GiB available" in line
    per_round = parse_scenario({"runtime": "netns", "workers": [{"count": 4000}], "algorithm": {
        "name": "fedavg", "params": {"clients": 50, "over_selection": 1.3, "deadline_s": 10, "trainers": "per_round"}}})
    assert capacity_problems(per_round, memory_mib=24 * 1024, files=100_000) == []  # 132 trainers + 2, idle the rest
    assert capacity_problems(per_round, memory_mib=24 * 1024, files=6_000) == []  # idle nodes hold about a file
    line, = capacity_problems(per_round, memory_mib=24 * 1024, files=5_000)
    assert "4002 nodes need about 5182 open files" in line, line  # 132 busy x 8 + 3,870 idle + 256
    line, = capacity_problems(per_round, memory_mib=4 * 1024, files=100_000)
    assert line.startswith("workers: 4002 nodes need about 8.0 GiB (132 training processes at once"), line
    assert NODE_PROCESS_MIB == 37.0  # a node process (BENCHMARKS.md: 256 workers at once)
    line, = capacity_problems(sc, memory_mib=64 * 1024, files=4096)
    assert line == (f"workers: 1002 nodes need about {1002 * NODE_FILES + 256} open files in the runner, and its "
                    "limit is 4096 (ulimit -Hn; raise nofile)")


def test_the_runner_counts_the_open_files_it_can_raise_itself_to():
    """With CAP_SYS_RESOURCE the runner raises its own hard limit up to fs.nr_open (4,096 devices
    need about 33,000 files where a hard limit of 20,000 is common), and preflight counts what it
    can reach; without it (this project's machines: root without the capability), the hard limit."""
    import resource
    from pathlib import Path

    from testbed.run.runner import raise_open_files
    from testbed.runtimes.preflight import files_needed, may_raise_limits, reachable_open_files

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = before[1]
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1))
        can = True
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    except (ValueError, OSError):
        can = False
    assert may_raise_limits() == can  # the capability read from /proc agrees with the kernel
    if not can:
        assert reachable_open_files() == hard
        return
    nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
    assert reachable_open_files() == max(hard, nr_open)
    try:
        need = files_needed(4098)
        raise_open_files(need)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == ((need, need) if need > before[1] else (before[1],) * 2)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
