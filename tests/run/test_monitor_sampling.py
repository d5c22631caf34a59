"""The monitor's sampling at fleet scale (run/monitor.py's Sampler): a shaped link's HTB class is
read when its link carried bytes since its last reading, or when that reading is
IDLE_READ_EVERY_S old; shaping.csv still gets a row per class each sample."""

from types import SimpleNamespace

import pandas as pd

from testbed.records import metrics
from testbed.run import monitor
from testbed.run.monitor import STALE_READS, Sampler


class FleetRuntime:
    """n nodes, each link shaped; `busy` nodes move bytes both ways between samples."""

    def __init__(self, n: int):
        self.nodes = [f"w{i}" for i in range(n)]
        self.bytes = {k: 0 for k in self.nodes}
        self.asked: list = []  # each link_stats call's keys (None: every link)

    def counters(self):
        return {n: {"up_bytes": b, "up_packets": 0, "down_bytes": b, "down_packets": 0} for n, b in self.bytes.items()}

    def link_stats(self, links=None):
        self.asked.append(None if links is None else list(links))
        keys = [f"{n}/{d}" for n in self.nodes for d in ("up", "down")] if links is None else links
        return {k: {"rate_bps": 1e6, "bytes": self.bytes[k.split("/")[0]], "packets": 0, "drops": 0,
                    "overlimits": 0, "backlog": 0} for k in keys}

    def wan_counters(self):
        return {}

    def usage(self):
        return {}


def _sampled(tmp_path, monkeypatch, n: int, t: float = 0.0):
    """A fleet of n nodes, its sampler on a clock the test moves, and its first sample taken."""
    clock = SimpleNamespace(t=t)
    monkeypatch.setattr(monitor.time, "time", lambda: clock.t)
    rt = FleetRuntime(n)
    metrics.init_tables(tmp_path)
    s = Sampler(rt, tmp_path, 0.0, {})
    s.sample()
    return clock, rt, s


def test_idle_links_are_read_once_a_period_and_busy_ones_each_second(tmp_path, monkeypatch):
    clock, rt, s = _sampled(tmp_path, monkeypatch, 150, t=100.0)  # 300 classes
    assert len(rt.asked[0]) == STALE_READS  # never read: the oldest first, a budget a sample
    reads = {}
    for k in rt.asked[0]:
        reads[k] = 1
    for _second in range(1, 35):
        clock.t += 1.0
        rt.bytes["w0"] += 1000  # w0 busy, the rest idle
        s.sample()
        for k in rt.asked[-1]:
            reads[k] = reads.get(k, 0) + 1
        assert {"w0/up", "w0/down"} <= set(rt.asked[-1])
        assert len(rt.asked[-1]) <= STALE_READS + 2  # never all at once
    assert reads["w0/up"] == 35
    idle = [f"w{i}/{d}" for i in range(1, 150) for d in ("up", "down")]
    assert all(reads.get(k, 0) == 2 for k in idle)  # once as the sampler got to it, again 30 s on
    rows = pd.read_csv(tmp_path / "shaping.csv")
    per_sample = rows.groupby("time").size()
    assert (per_sample[per_sample.index >= 105.0] == 300).all()  # every class read by the 5th sample: a row each
    w0 = rows[(rows.node == "w0") & (rows.direction == "up")].sort_values("time")
    assert list(w0.bytes.diff().dropna().unique()) == [1000]  # the busy class's readings are fresh


def test_a_link_that_starts_moving_is_read_at_the_next_sample(tmp_path, monkeypatch):
    clock, rt, s = _sampled(tmp_path, monkeypatch, 30)
    clock.t += 1.0
    s.sample()
    assert "w17/up" not in rt.asked[-1]
    rt.bytes["w17"] += 1
    clock.t += 1.0
    s.sample()
    assert {"w17/up", "w17/down"} <= set(rt.asked[-1])


class CountingCgroup:
    """A node's cgroup whose processes the test sets; counts its CPU readings."""

    def __init__(self):
        self.pids: set = set()
        self.cpu = 1.0
        self.reads = 0

    def idle(self):
        return not self.pids

    def cpu_seconds(self):
        self.reads += 1
        return self.cpu

    def memory_bytes(self):
        return 1 << 20

    def throttled(self):
        return {"nr_periods": 1, "nr_throttled": 0, "throttled_time": 0}

    def quota_cores(self):
        return 0.05

    def wait_seconds(self):
        return 0.0


def test_a_node_with_no_process_is_read_once_then_its_reading_repeats():
    from testbed.runtimes.base import Runtime

    cg = CountingCgroup()
    rt = SimpleNamespace(handles={"d0": SimpleNamespace(cgroup=cg, compute={})}, _node_usage=Runtime._node_usage,
                         _idle_usage={})
    first = Runtime.usage(rt)["d0"]
    assert cg.reads == 1 and Runtime.usage(rt)["d0"] == first and cg.reads == 1  # idle: no read
    cg.pids, cg.cpu = {42}, 3.0  # a trainer starts
    assert Runtime.usage(rt)["d0"].cpu_seconds == 3.0 and Runtime.usage(rt)["d0"].cpu_seconds == 3.0
    assert cg.reads == 3  # read each time while it has a process
    cg.pids, cg.cpu = set(), 4.5  # it ended: read once more, then repeated
    assert Runtime.usage(rt)["d0"].cpu_seconds == 4.5 and Runtime.usage(rt)["d0"].cpu_seconds == 4.5
    assert cg.reads == 4


def test_a_node_whose_processes_this_host_cannot_see_is_read_every_time():
    """A swarm node's usage comes over the control channel (runtimes/swarm/services.py's HubCgroup):
    it is never taken for idle, so its readings are never repeated."""
    from testbed.runtimes.base import Runtime
    from testbed.runtimes.swarm.services import HubCgroup

    stats = {"d0": {"cpu_seconds": 1.0}}
    cg = HubCgroup(stats, "d0")
    assert cg.idle() is False
    rt = SimpleNamespace(handles={"d0": SimpleNamespace(cgroup=cg, compute={})}, _node_usage=Runtime._node_usage,
                         _idle_usage={})
    assert Runtime.usage(rt)["d0"].cpu_seconds == 1.0
    stats["d0"]["cpu_seconds"] = 2.5
    assert Runtime.usage(rt)["d0"].cpu_seconds == 2.5
