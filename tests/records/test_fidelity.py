"""The fidelity monitor's rules on synthetic counters (records.fidelity), its records (resources.csv
-> summary, fidelity.csv, the figure), the cgroup readers on fake cgroup files, and the pre-start
warning when a host's nodes are promised more CPU than it has (run.cpu_fit)."""

import json
import socket
from pathlib import Path

import pytest

from testbed.records import fidelity as F

HERE = socket.gethostname()


def cpu_run(per_second):
    """Cumulative samples from per-second (cores got, share waiting) pairs, quota 0.5."""
    out, used, waited = [F.CpuSample(0.0, 0.0, 0.5, 0.0)], 0.0, 0.0
    for t, (got, wait) in enumerate(per_second, start=1):
        used, waited = used + got, waited + wait
        out.append(F.CpuSample(float(t), used, 0.5, waited))
    return out


def test_a_node_throttled_at_its_quota_is_faithful_though_it_waits():
    ivs = F.node_intervals("w0", cpu_run([(0.5, 0.6)] * 5))  # waiting: throttled tasks stay runnable
    assert [iv.verdict for iv in ivs] == ["faithful"] * 5
    assert ivs[0].got == pytest.approx(0.5) and ivs[0].promised == 0.5


def test_a_node_that_wanted_cpu_and_got_less_than_its_quota_is_starved():
    ivs = F.node_intervals("w0", cpu_run([(0.5, 0.1), (0.3, 0.5), (0.25, 0.7)]))
    assert [iv.verdict for iv in ivs] == ["faithful", "starved", "starved"]
    assert ivs[1].wait == pytest.approx(0.5)


def test_a_node_that_bursts_at_its_quota_then_idles_is_not_starved():
    # a BSP worker at quota 0.2: 0.6 s computing (throttled 0.48 s of it), 0.4 s at the barrier
    s = [F.CpuSample(0, 0.0, 0.2, 0.0, 0.0), F.CpuSample(1, 0.12, 0.2, 0.5, 0.48),
         F.CpuSample(2, 0.24, 0.2, 1.2, 0.96)]  # then the host made it wait 0.2 s more
    ivs = F.node_intervals("w3", s)
    assert ivs[0].verdict == "idle" and ivs[0].wait == pytest.approx(0.02)
    assert ivs[1].verdict == "starved" and ivs[1].wait == pytest.approx(0.22)


def test_an_idle_node_is_not_flagged():
    ivs = F.node_intervals("w0", cpu_run([(0.02, 0.0), (0.1, 0.05), (0.0, 0.0)]))
    assert [iv.verdict for iv in ivs] == ["idle"] * 3
    assert not any(iv.flagged for iv in ivs)


def test_the_thresholds_are_where_the_rule_says():
    assert F.node_verdict(0.9 * 0.5, 0.5, 1.0) == "faithful"
    assert F.node_verdict(0.89 * 0.5, 0.5, F.WANT_WAIT) == "starved"
    assert F.node_verdict(0.89 * 0.5, 0.5, F.WANT_WAIT - 0.01) == "idle"
    assert F.node_verdict(0.1, None, 1.0) == "unlimited"
    assert F.node_verdict(0.1, 0.5, None) == "unknown"


def test_a_restarted_node_and_a_short_interval_are_left_out():
    s = [F.CpuSample(0, 5.0, 0.5, 1.0), F.CpuSample(1, 0.1, 0.5, 0.0),  # counters back to zero: new cgroup
         F.CpuSample(1.2, 0.2, 0.5, 0.1), F.CpuSample(2.2, 0.7, 0.5, 0.2)]
    ivs = F.node_intervals("w0", s)
    assert [(iv.start, iv.end) for iv in ivs] == [(1.2, 2.2)]  # 1 -> 1.2 is under MIN_INTERVAL_S
    assert ivs[0].verdict == "faithful"


def link_run(carried_bps, rate=20e6, over=True):
    """Samples of a link carrying `carried_bps` per second; `over`: its queue overflowed each second."""
    out, total, ol, drops = [F.LinkSample(0.0, 0, rate, backlog=3000 if over else 0)], 0, 0, 0
    for t, bps in enumerate(carried_bps, start=1):
        total, ol, drops = total + int(bps / 8), ol + (5 if over else 0), drops + (2 if over else 0)
        out.append(F.LinkSample(float(t), total, rate, overlimits=ol, backlog=3000 if over else 0, drops=drops))
    return out


def test_a_saturated_link_short_of_its_rate_is_a_shortfall():
    ivs = F.link_intervals("w0/up", link_run([19.5e6, 12e6]))
    assert [iv.verdict for iv in ivs] == ["faithful", "shortfall"]
    assert ivs[1].got == pytest.approx(12e6, rel=1e-6) and ivs[1].promised == 20e6


def test_an_idle_link_is_not_flagged():
    ivs = F.link_intervals("w0/up", link_run([1e5, 0, 3e6], over=False))
    assert [iv.verdict for iv in ivs] == ["unsaturated"] * 3
    drops = [F.LinkSample(0, 0, 20e6), F.LinkSample(1, 10**6, 20e6, drops=3)]  # drops alone: saturated
    assert F.link_intervals("w0/up", drops)[0].verdict == "shortfall"
    # one burst over the rate inside the interval (queue empty at a sample): not saturated
    burst = [F.LinkSample(0, 0, 20e6), F.LinkSample(1, 10**6, 20e6, overlimits=9, backlog=4000)]
    assert F.link_intervals("w0/up", burst)[0].verdict == "unsaturated"
    # pushes with idle gaps between them, a backlog at both samples, no drop (a healthy BSP
    # uplink's 1 s samples looked like this): not saturated, not a shortfall
    pushes = [F.LinkSample(0, 0, 20e6, backlog=5000), F.LinkSample(1, 10**6, 20e6, overlimits=300, backlog=8000)]
    assert F.link_intervals("w0/up", pushes)[0].verdict == "unsaturated"
    assert F.link_intervals("x", [F.LinkSample(0, 0, None), F.LinkSample(1, 10, None)])[0].verdict == "unshaped"


def test_summary_names_the_starved_seconds_and_the_run_unfaithful():
    ivs = F.node_intervals("w0", cpu_run([(0.3, 0.5)] * 3)) + F.node_intervals("ps", cpu_run([(0.0, 0.0)] * 3))
    fid = F.summarize(ivs)
    assert fid["faithful"] is False
    assert fid["nodes"]["w0"]["starved_seconds"] == pytest.approx(3.0)
    assert fid["nodes"]["w0"]["judged"] == 3 and len(fid["nodes"]["w0"]["intervals"]) == 3
    assert fid["nodes"]["ps"]["starved_seconds"] == 0
    assert "w0 3s" in F.one_line(fid) and "NOT faithful" in F.one_line(fid)
    ok = F.summarize(F.node_intervals("w0", cpu_run([(0.5, 0.5)] * 3)))
    assert ok["faithful"] is True and F.one_line(ok).startswith("fidelity: faithful")


def test_a_fleet_s_verdict_names_the_worst_few_and_counts_the_rest():
    fid = {"nodes": {f"d{i}": {"starved_seconds": float(i)} for i in range(200)}, "links": {}}
    line = F.one_line(fid)
    assert "d199 199s, d198 198s" in line and "d192 192s and 191 more" in line and "d191" not in line  # d0: 0 s


def write_resources(run_dir: Path, rows):
    from testbed.records.columns import RESOURCE_COLUMNS
    from testbed.records.metrics import format_row

    with open(run_dir / "resources.csv", "wb") as f:
        f.write((",".join(RESOURCE_COLUMNS) + "\n").encode())
        for r in rows:
            f.write(format_row(RESOURCE_COLUMNS, r))


def test_a_run_dir_gives_summary_table_and_figure(tmp_path):
    rows = []
    for t in range(6):
        rows.append({"time": float(t), "node": "w0", "cpu_seconds": 0.3 * t, "cpu_quota": 0.5, "wait_seconds": 0.6 * t})
        rows.append({"time": float(t), "node": "ps", "cpu_seconds": 0.5 * t, "cpu_quota": 0.5, "wait_seconds": 0.0})
    write_resources(tmp_path, rows)
    from testbed.run.summary import fidelity_of

    fid = fidelity_of(tmp_path)
    assert fid["nodes"]["w0"]["starved_seconds"] == pytest.approx(5.0) and fid["nodes"]["ps"]["starved_seconds"] == 0
    lines = (tmp_path / F.FIDELITY_FILE).read_text().splitlines()
    assert lines[0] == "kind,name,start,end,got,promised,wait,verdict" and len(lines) == 11
    assert sum(line.endswith(",starved") for line in lines) == 5
    json.dumps(fid)  # summary.json takes it as it is
    from testbed.records.plot_fidelity import draw_fidelity

    fig = draw_fidelity(F.assess_run(tmp_path))
    assert fig is not None and len(fig.axes) == 2


def test_an_old_run_without_the_new_columns_is_judged_unknown_or_unlimited(tmp_path):
    (tmp_path / "resources.csv").write_text("time,node,cpu_seconds,memory_bytes,throttled_seconds\n"
                                            "0,w0,0,1,0\n1,w0,0.1,1,0\n2,w0,0.2,1,0\n")
    ivs = F.assess_run(tmp_path)
    assert [iv.verdict for iv in ivs] == ["unlimited", "unlimited"]
    from testbed.records.plot_fidelity import draw_fidelity

    assert draw_fidelity(ivs) is None  # nothing promised: no figure


# -- the cgroup readers, on fake cgroup files ------------------------------------------------
class FakeCgroup:
    def __init__(self, d: Path):
        from testbed.kernel.cgroups import CgroupUsage

        class C(CgroupUsage):
            def _file(self, ctrl, name):
                return d / name
        self.cg = C()


def test_quota_and_waiting_read_from_v1_files(tmp_path, monkeypatch):
    from testbed.kernel import cgroups

    monkeypatch.setattr(cgroups, "is_v2", lambda: False)
    (tmp_path / "cpu.cfs_quota_us").write_text("80000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    import os
    (tmp_path / "tasks").write_text(f"{os.getpid()}\n999999999\n")  # the second ended already
    cg = FakeCgroup(tmp_path).cg
    assert cg.quota_cores() == pytest.approx(0.8)
    own = int(Path(f"/proc/{os.getpid()}/schedstat").read_text().split()[1]) / 1e9
    assert cg.wait_seconds() == pytest.approx(own, abs=0.5)
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    assert cg.quota_cores() is None


def test_quota_and_pressure_read_from_v2_files(tmp_path, monkeypatch):
    from testbed.kernel import cgroups

    monkeypatch.setattr(cgroups, "is_v2", lambda: True)
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "cpu.pressure").write_text("some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\n"
                                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    cg = FakeCgroup(tmp_path).cg
    assert cg.quota_cores() == pytest.approx(0.5) and cg.wait_seconds() == pytest.approx(2.5)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cg.quota_cores() is None


# -- before the start: promised CPU against the host's cores ----------------------------------
def spec_of(cpus: list, stress=None):
    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster

    profiles = {f"p{i}": {"cpus": c} if c is not None else {} for i, c in enumerate(cpus)}
    if stress is not None:
        profiles["p0"]["stress"] = {"cpu": stress}
    sc = parse_scenario({"name": "t", "workload": {"model": "adacomp_cnn", "dataset": "digits"}, "stop": {"steps": 1},
                         "algorithm": {"name": "asgd"}, "profiles": profiles,
                         "ps": {"profile": "p0"}, "evaluator": {"profile": "p0"},
                         "workers": [{"count": 1, "profile": f"p{i}"} for i in range(1, len(cpus))]})
    return build_cluster(sc, "t")


def test_four_workers_at_0_8_cores_on_two_cores_are_warned_with_host_sum_and_cores():
    from testbed.run.cpu_fit import oversubscription_warnings

    spec = spec_of([0.1] + [0.8] * 4)
    lines = oversubscription_warnings(spec, {HERE: 2})
    assert len(lines) == 1
    assert "host " in lines[0] and "3.4 cores" in lines[0] and "has 2" in lines[0]  # 4 x 0.8 + ps + evaluator
    assert oversubscription_warnings(spec, {HERE: 2}, workers_at_once=2) == []  # per-round: 2 x 0.8 + 0.2
    assert oversubscription_warnings(spec, {HERE: 1}, workers_at_once=2)  # 2 x 0.8 + 0.2 > 1


def test_quotas_that_fit_are_not_warned_and_stress_counts_without_a_quota():
    from testbed.run.cpu_fit import oversubscription_warnings, promised_cpus

    spec = spec_of([0.5, 0.3, 0.2])  # ps and evaluator 0.5 each, workers 0.8: 1.8 of 2 cores
    assert oversubscription_warnings(spec, {HERE: 2}) == []
    spec = spec_of([None, 0.3], stress=1.5)  # ps and evaluator unbounded, each busy 1.5 cores
    assert promised_cpus(spec.ps) == 1.5
    assert oversubscription_warnings(spec, {HERE: 2})  # 3 x 1.5 + 0.3
    assert oversubscription_warnings(spec, {"elsewhere": 2}) == []  # a host whose cores are unknown


def test_a_promise_source_added_first_wins():
    from testbed.run import cpu_fit as R

    spec = spec_of([0.5, 0.5])
    R.PROMISE_SOURCES.insert(0, lambda n: 1.5 if n.role == "worker" else None)
    try:
        assert R.promised_cpus(spec.workers[0]) == 1.5 and R.promised_cpus(spec.ps) == 0.5
    finally:
        R.PROMISE_SOURCES.pop(0)


def test_shaping_csv_gives_the_links_intervals(tmp_path):
    from testbed.records.columns import SHAPING_COLUMNS
    from testbed.records.metrics import format_row

    up = {"node": "w0", "direction": "up", "rate_bps": 20e6, "backlog": 9000}
    rows = [{"time": 0.0, "bytes": 0, "overlimits": 0, "drops": 0, **up},
            {"time": 1.0, "bytes": 2_450_000, "overlimits": 40, "drops": 3, **up},
            {"time": 2.0, "bytes": 3_700_000, "overlimits": 90, "drops": 7, **up},
            {"time": 0.0, "node": "w0", "direction": "down", "rate_bps": None, "bytes": 0},
            {"time": 1.0, "node": "w0", "direction": "down", "rate_bps": None, "bytes": 100}]
    with open(tmp_path / "shaping.csv", "wb") as f:
        f.write((",".join(SHAPING_COLUMNS) + "\n").encode())
        for r in rows:
            f.write(format_row(SHAPING_COLUMNS, r))
    ivs = {(iv.name, iv.start): iv for iv in F.assess_run(tmp_path)}
    assert ivs[("w0/up", 0.0)].verdict == "faithful" and ivs[("w0/up", 0.0)].got == pytest.approx(19.6e6)
    assert ivs[("w0/up", 1.0)].verdict == "shortfall" and ivs[("w0/up", 1.0)].got == pytest.approx(10e6)
    assert ivs[("w0/down", 0.0)].verdict == "unshaped"
    fid = F.summarize(list(ivs.values()))
    assert fid["links"]["w0/up"]["shortfall_seconds"] == pytest.approx(1.0) and not fid["faithful"]
    assert "w0/up 1s" in F.one_line(fid)


def test_a_swarm_node_reports_its_quota_and_waiting_with_its_stats():
    from testbed.runtimes.swarm.services import HubCgroup

    stats = {"w0": {"cpu_seconds": 3.0, "throttled_seconds": 0.5, "cpu_quota": 0.8, "wait_seconds": 1.25,
                    "nr_periods": 40, "nr_throttled": 7}}
    cg = HubCgroup(stats, "w0")
    assert cg.quota_cores() == 0.8 and cg.wait_seconds() == 1.25
    assert cg.throttled() == {"throttled_time": 500_000_000, "nr_periods": 40, "nr_throttled": 7}
    assert HubCgroup({"w0": {"cpu_seconds": 1.0}}, "w0").quota_cores() is None  # an older node: not judged


def test_a_calibrated_device_quota_is_what_a_node_is_promised():
    from testbed.run.cpu_fit import oversubscription_warnings, promised_cpus

    spec = spec_of([0.1, 0.1, 0.1])  # ps and evaluator 0.1 each, two workers
    assert oversubscription_warnings(spec, {HERE: 2}) == []
    for w in spec.workers:
        w.device_cpus = 1.0  # set by calibration at bring-up (run/devices.py)
    assert promised_cpus(spec.workers[0]) == 1.0 and promised_cpus(spec.ps) == 0.1
    line, = oversubscription_warnings(spec, {HERE: 2})
    assert "2.2 cores" in line  # 2 x 1.0 + ps + evaluator


def test_intervals_over_before_the_first_training_step_are_the_nodes_start():
    from testbed.records.fidelity import Interval, before_training, summarize

    early = Interval("node", "w0", 0.8, 1.3, 0.05, 0.3, 0.2, "starved")
    late = Interval("node", "w0", 1.3, 1.8, 0.05, 0.3, 0.2, "starved")
    assert before_training(early, 1.6).verdict == "startup"
    assert before_training(late, 1.6) is late  # it straddles the first step: judged
    assert before_training(early, None) is early  # no training step: everything judged
    fid = summarize([before_training(early, 1.6), late])
    assert fid["nodes"]["w0"]["judged"] == 1 and fid["nodes"]["w0"]["startup"] == 1
    assert fid["nodes"]["w0"]["starved_seconds"] == 0.5 and fid["faithful"] is False
    assert summarize([before_training(early, 1.6)])["faithful"] is True


def test_the_line_says_which_dilation_fits_the_load():
    from testbed.records.fidelity import one_line

    fid = {"nodes": {"w0": {"starved_seconds": 0.0, "judged": 9}}, "links": {},
           "dilation": {"k": 2.0, "enough": 1.5}}
    assert one_line(fid).endswith("no link short of its rate); dilation: k 2 ran, k 1.5 fits this load")
    fid["dilation"] = {"k": 1.0, "enough": 1.0}
    assert one_line(fid).endswith("of its rate)")
    fid["dilation"] = {"k": 1.0, "enough": 3.0}
    assert one_line(fid).endswith("; dilation: k 1 ran, k 3 fits this load")
    flagged = {"nodes": {"w2": {"starved_seconds": 2.0, "judged": 9}}, "links": {}, "faithful": False,
               "dilation": {"k": 1.5, "enough": 1.0}}
    assert one_line(flagged).endswith("; dilation: k 1.5 ran and the load fits k 1: a larger k does not help the "
                                      "intervals flagged (bursts at the host's speed contend at every k)")
