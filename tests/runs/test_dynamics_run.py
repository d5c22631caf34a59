"""The timeline on a real cluster (netns): link changes, kill/restart, CPU changes, fault modes,
interactive control, and a PS killed mid-run."""

import json
import subprocess
import time

import pandas as pd
import pytest
import yaml
from helpers import REPO, _docker_or_skip, _rates, edgebed_cmd, needs_root, our_netns, run_up, start_up, write_scenario

from testbed.records.columns import LINK_RATES_FILE
from testbed.records.fidelity import FIDELITY_FILE
from testbed.records.energy import ENERGY_FILE
from testbed.records.metrics import TABLES

pytestmark = [needs_root, pytest.mark.root, pytest.mark.slow]


def _leftovers(run_dir) -> list[str]:
    """The run's namespaces and containers still there (only this run's: tests run side by side)."""
    from testbed.runtimes.engine.client import docker_client

    run_id = json.loads((run_dir / "meta.json").read_text())["run_id"]
    client = docker_client(timeout=3)
    containers = [c.name for c in client.containers.list(all=True, filters={"label": "edgebed"})] if client else []
    return [n for n in our_netns() + containers if run_id in n]


def _dynamics_smoke(tmp_path, shift: int) -> str:
    """scenarios/dynamics-smoke.yaml with every event and the stop `shift` seconds later."""
    sc = yaml.safe_load((REPO / "scenarios" / "dynamics-smoke.yaml").read_text())
    for e in sc["events"]:
        e["at"] = f"{float(str(e['at']).rstrip('s')) + shift:g}s"
    sc["stop"]["seconds"] += shift
    return str(write_scenario(tmp_path, sc))


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_dynamics_smoke_records_every_effect(tmp_path, clean_host, runtime):
    if runtime == "docker":
        _docker_or_skip()
    # on docker every event 8 s later: a 0.3-CPU container's role takes longer to its first step
    # (it imports torch under its quota), more on a loaded host
    s = 0 if runtime == "netns" else 8
    run_dir = tmp_path / "run"
    run_up(_dynamics_smoke(tmp_path, s), run_dir, "--runtime", runtime, timeout=400)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    events = pd.read_csv(run_dir / "events.csv")
    applied = events[events.scheduled_time.notna()]
    assert len(applied) == 5 and not applied.detail.str.contains("FAILED").any(), applied.to_dict("records")
    # each done within 100 ms of its time; on docker a kill or restart goes through the engine's API,
    # slower on a loaded host
    late = 0.1 if runtime == "netns" else 0.5
    assert ((applied.time - applied.scheduled_time).abs() < late).all(), applied[["time", "scheduled_time"]]
    assert "rejoined" in set(events.action)  # the PS saw w1 come back
    # w0's link, both directions: held to 2 Mbit/s between 10 s and 25 s (within 10%), well above outside
    traffic = pd.read_csv(run_dir / "traffic.csv")
    for direction in ("up", "down"):
        rates = _rates(traffic, "w0", direction)
        # windows of 3 samples that end after 14 s: ~1 s apart with up to 0.25 s of jitter, one
        # ending at 13.07 s began at 9.93 s, before the change at 10 s, and read 2.28 Mbit/s
        slow = rates[(rates.time > 14 + s) & (rates.time < 25 + s)]
        fast = rates[(rates.time < 10 + s) | (rates.time > 29 + s)]
        # at most the scheduled rate, and near it while a push or pull keeps the link busy (loose
        # below: on docker under a loaded CI host the busiest window carried 0.89x; a change that
        # did not happen reads 6x, one that cut too deep far less)
        assert 2e6 * 0.75 <= slow.bps.max() <= 2e6 * 1.10, slow.bps.describe()
        assert fast.bps.max() > 5 * 2e6
    # w1's steps stop at the kill and resume after the restart (its step count starts again)
    steps = pd.read_csv(run_dir / "steps.csv")
    w1 = steps[steps.node == "w1"]
    assert not ((w1.time > 12.5 + s) & (w1.time < 22 + s)).any()
    assert (w1.time > 23 + s).sum() >= 3 and (w1.time < 12 + s).sum() >= 3, w1.time.describe()
    # w2's CPU halved: a step's compute takes longer (by less than 2x: w2 also waits on the
    # network, so a step's CPU burst is throttled more or less depending on where in the
    # 100 ms CFS period it starts), and the cgroup is throttled more
    w2 = steps[steps.node == "w2"]
    before, after = w2[w2.time < 14 + s].compute_seconds.median(), w2[w2.time > 17 + s].compute_seconds.median()
    assert after > 1.25 * before, (before, after)
    res = pd.read_csv(run_dir / "resources.csv")
    thr = res[res.node == "w2"].sort_values("time").set_index("time").throttled_seconds

    def throttled_per_s(a: float, b: float) -> float:
        t = thr[(thr.index >= a) & (thr.index <= b)]
        return (t.iloc[-1] - t.iloc[0]) / (t.index[-1] - t.index[0])

    # from w2's first step: a container imports torch under its quota first, throttled all along
    # (the bound only a quota that did not change fails)
    assert throttled_per_s(16 + s, 40 + s) > 1.2 * throttled_per_s(max(3.0, float(w2.time.min())), 14.5 + s)
    p = subprocess.run(edgebed_cmd() + ["plot", str(run_dir)], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _scenario(tmp_path, algorithm: dict, events: list, faults: dict | None = None, seconds: int = 25,
              runtime: str = "netns", steps: int | None = None) -> str:
    data = {"name": "faults", "seed": 1, "runtime": runtime,
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_interval": 20},
            "stop": {"seconds": seconds, **({"steps": steps} if steps else {})}, "algorithm": algorithm,
            "profiles": {"edge": {"cpus": 0.3, "bandwidth": "100mbit"}},
            "workers": [{"count": 3, "profile": "edge"}], "events": events}
    if faults:
        data["faults"] = faults
    path = write_scenario(tmp_path, data)
    return str(path)


@pytest.mark.parametrize("name", ["bsp", "selsync", "ssp", "asgd", "adsp"])
def test_a_killed_worker_does_not_stop_training(tmp_path, clean_host, name):
    """Every PS algorithm goes on without a killed worker (BSP/SelSync/SSP after the timeout),
    and takes it back when it restarts."""
    params = {"adsp": {"check_period": 2.0}, "ssp": {"staleness": 2}, "selsync": {"delta": 0.3}}.get(name, {})
    path = _scenario(tmp_path, {"name": name, "params": params},
                     [{"at": "6s", "target": "w1", "action": "kill"}, {"at": "14s", "target": "w1", "action": "restart"}],
                     faults={"worker_timeout": "2s"})
    run_dir = tmp_path / "run"
    run_up(path, run_dir, "-q", timeout=200)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    steps = pd.read_csv(run_dir / "steps.csv")
    others = steps[steps.node != "w1"]
    assert ((others.time > 9) & (others.time < 14)).sum() >= 5  # the survivors trained while w1 was down
    w1 = steps[steps.node == "w1"]
    assert (w1.time > 15).sum() >= 3  # ...and w1 trained again after its restart
    events = pd.read_csv(run_dir / "events.csv")
    assert "rejoined" in set(events.action)
    if name in ("bsp", "selsync", "ssp"):  # they wait on every worker: the PS had to give up on w1
        lost = events[events.action == "lost"]
        assert len(lost) == 1 and lost.target.iloc[0] == "w1"
        assert 6 < lost.time.iloc[0] <= 6 + 2 + 1.5  # its last message + the 2 s timeout


def _mounts_while_running(cmd: list[str], client) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """Run `cmd` (an `edgebed up`); every edgebed container seen meanwhile (with a Docker `client`)
    -> the host folders mounted into it."""
    seen: dict[str, list[str]] = {}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while proc.poll() is None and time.monotonic() < deadline:
        for c in client.containers.list(filters={"label": "edgebed"}) if client is not None else []:
            seen[c.name] = [m["Source"] for m in c.attrs.get("Mounts", [])]
        time.sleep(0.5)
    out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), seen


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_a_node_killed_with_sigkill_keeps_its_rows_up_to_the_kill(tmp_path, clean_host, runtime):
    """kill -9 mid-step: every row the worker wrote before is there and whole, none after. With
    docker, the run directory is mounted into no container: every row came over the network."""
    import csv

    from testbed.records.columns import STEP_COLUMNS

    if runtime == "docker":
        _docker_or_skip()
    # killed at a model version, not a time: when a 0.3-CPU container's role takes its first step
    # depends on the host's load; three equal workers make some 20 steps each by version 60
    path = _scenario(tmp_path, {"name": "asgd"}, [{"at_step": 60, "target": "w1", "action": "kill"}],
                     seconds=90, steps=150, runtime=runtime)
    run_dir = tmp_path / "run"
    from testbed.runtimes.engine.client import docker_client

    client = docker_client(timeout=3) if runtime == "docker" else None
    r, mounts = _mounts_while_running(edgebed_cmd() + ["up", path, "--out", str(run_dir), "-q"], client)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if runtime == "docker":
        assert len(mounts) >= 5, mounts  # ps, evaluator, 3 workers were seen running
        for name, sources in mounts.items():
            assert not [s for s in sources if str(run_dir).startswith(s) or s.startswith(str(run_dir))], (name, sources)
        assert {e.name for e in run_dir.iterdir()} <= {"scenario.yaml", "meta.json", "summary.json", "ps.json",
                                                       "logs", FIDELITY_FILE, ENERGY_FILE, LINK_RATES_FILE,
                                                       *TABLES}  # the runner's files only
    with open(run_dir / "steps.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == STEP_COLUMNS and all(len(row) == len(STEP_COLUMNS) for row in rows[1:])
    w1 = [float(row[0]) for row in rows[1:] if row[1] == "w1"]
    killed = pd.read_csv(run_dir / "events.csv").query("action == 'kill'").time.iloc[0]
    assert len([t for t in w1 if t < killed]) >= 5 and max(w1) < killed + 0.5
    gaps = sorted(b - a for a, b in zip(w1, w1[1:]))
    assert killed - max(w1) < 2 * gaps[len(gaps) // 2] + 0.5  # its rows reach the kill, not an earlier flush
    # they came over the control network: the runner wrote them, whole
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["record_rows"]["received"] >= len(rows) - 1 and summary["record_rows"]["dropped"] == 0
    assert summary["status"] == "completed" and summary["final_accuracy"] > 0.5  # eval rows and ps.json came too


def test_bsp_stops_cleanly_when_told_to(tmp_path, clean_host):
    path = _scenario(tmp_path, {"name": "bsp"}, [{"at": "5s", "target": "w2", "action": "kill"}],
                     faults={"worker_timeout": "2s", "on_worker_loss": "stop"})
    run_dir = tmp_path / "run"
    r = run_up(path, run_dir, "-q", expect=None, timeout=200)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "stopped" and "worker w2 lost" in summary["reason"], summary
    assert r.returncode == 3  # stopped by a condition the scenario set: not 0, not a failure
    assert summary["wall_seconds"] < 20


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_killing_the_ps_ends_the_run_with_records_and_no_leftovers(tmp_path, clean_host, runtime):
    if runtime == "docker":
        _docker_or_skip()
    # containers import torch under their quotas first: their workers start stepping seconds later
    kill_at = 6 if runtime == "netns" else 16
    path = _scenario(tmp_path, {"name": "asgd"}, [{"at": f"{kill_at - 3}s", "target": "w0", "action": "stress",
                                                   "load": 1.5},
                                                  {"at": f"{kill_at}s", "target": "ps", "action": "kill"}],
                     seconds=60, runtime=runtime)
    run_dir = tmp_path / "run"
    r = run_up(path, run_dir, "-q", expect=None, timeout=200)
    assert r.returncode != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "parameter server was killed" in summary["reason"]
    from testbed.records.reader import load_run

    rec = load_run(run_dir)
    assert len(rec.steps) > 10 and rec.steps.time.max() < kill_at + 2  # records up to the crash, readable
    assert "stress 1.5 cores in 2 process(es)" in rec.events.detail.iloc[0]
    assert _leftovers(run_dir) == []


def test_interactive_control_acts_on_the_running_cluster(tmp_path, clean_host):
    path = _scenario(tmp_path, {"name": "asgd"}, [], seconds=30)
    run_dir = tmp_path / "run"
    p = start_up(path, run_dir, "-q", stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while not (run_dir / "meta.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        run_id = json.loads((run_dir / "meta.json").read_text())["run_id"]
        time.sleep(4)
        bad = subprocess.run(edgebed_cmd() + ["link", "w0", "--rate", "-5mbit", "--run", run_id], cwd=REPO,
                             capture_output=True, text=True)
        assert bad.returncode != 0 and "link.rate: '-5mbit' is not a rate" in bad.stderr
        ok = subprocess.run(edgebed_cmd() + ["link", "w0", "--rate", "3mbit", "--direction", "up", "--run", run_id],
                            cwd=REPO, capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        assert "up: rate=3000000.0" in ok.stdout
        cpu = subprocess.run(edgebed_cmd() + ["cpu", "w", "0.2", "--run", run_id], cwd=REPO, capture_output=True,
                             text=True)
        assert cpu.returncode == 0 and cpu.stdout.count("cpu quota 0.2") == 3  # the group: all three workers
        from testbed.kernel.netlink import ns_iproute
        from testbed.kernel.shaping import read_htb_class

        with ns_iproute(f"eb-{run_id}-w0") as ns:
            assert read_htb_class(ns, ns.link_lookup(ifname="eth0")[0])["rate_bps"] == pytest.approx(3e6, rel=0.01)
    finally:
        p.wait(timeout=120)
    assert p.returncode == 0
    events = pd.read_csv(run_dir / "events.csv")
    assert len(events[events.detail.str.contains("command line", na=False)]) == 4


def test_partition_and_heal(tmp_path, clean_host):
    """w1 cut off from the PS: its steps stop (ASGD: the others go on); healed, it goes on."""
    path = _scenario(tmp_path, {"name": "asgd"}, [{"at": "5s", "target": "w1", "action": "partition", "peers": ["ps"]},
                                                  {"at": "9s", "target": "w1", "action": "heal"}], seconds=25)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, "-q", timeout=200)
    events = pd.read_csv(run_dir / "events.csv")
    assert list(events.detail.str.split("-> ").str[-1]) == ["cut off from ps", "healed with ps"]
    steps = pd.read_csv(run_dir / "steps.csv")
    w1, others = steps[steps.node == "w1"], steps[steps.node != "w1"]
    assert ((w1.time > 5.6) & (w1.time < 9)).sum() <= 1  # at most the step that was on its way
    assert ((others.time > 5.6) & (others.time < 9)).sum() >= 10
    assert (w1.time > 16).sum() >= 3  # TCP retransmits once healed: it trains again


def test_an_offline_worker_is_cut_off_and_frozen_then_rejoins(tmp_path, clean_host):
    """availability from a trace: w1 online until 6 s, offline until 12 s, then online again. Its
    offline stretch is a cut from every node and a freeze (events.csv says why), BSP loses it and
    goes on with the others, and back online it rejoins and trains."""
    (tmp_path / "avail.csv").write_text("node,start,end\nw1,0,6\nw1,12,1000\n")
    data = {"name": "availability", "seed": 1, "runtime": "netns",
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_interval": 20},
            "stop": {"seconds": 24}, "algorithm": {"name": "bsp"}, "faults": {"worker_timeout": "2s"},
            "profiles": {"edge": {"cpus": 0.3, "bandwidth": "100mbit"}},
            "workers": [{"count": 3, "profile": "edge"}], "availability": [{"target": "w1", "trace": "avail.csv"}]}
    path = write_scenario(tmp_path, data)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, "-q", timeout=200)
    events = pd.read_csv(run_dir / "events.csv")
    ours = events[events.target == "w1"].sort_values("time", kind="stable")
    timeline = ours[ours.action.isin(["partition", "pause", "heal", "resume"])]
    assert list(timeline.action) == ["partition", "pause", "heal", "resume"], ours.to_dict("records")
    assert list(timeline.scheduled_time) == [6, 6, 12, 12], ours.to_dict("records")
    assert (timeline.time - timeline.scheduled_time).abs().max() < 1.0, ours.to_dict("records")
    assert {"lost", "rejoined"} <= set(ours.action), ours.to_dict("records")  # the PS's side of it
    assert not ours.detail.str.contains("FAILED", na=False).any(), ours.to_dict("records")
    assert ours[ours.action == "pause"].detail.str.contains("availability: offline").all()
    steps = pd.read_csv(run_dir / "steps.csv")
    w1, others = steps[steps.node == "w1"], steps[steps.node != "w1"]
    assert ((w1.time > 6.6) & (w1.time < 12)).sum() == 0  # frozen: no step ends while offline
    assert ((others.time > 9) & (others.time < 12)).sum() >= 4  # the others went on without it
    assert (w1.time > 14).sum() >= 3  # back online, it rejoined and trains


def test_crash_per_push_freezes_workers_and_training_goes_on(tmp_path, clean_host):
    """AdaComp's fail-stop crashes: after a push a worker crashes with probability p; the runner
    freezes it (recorded in events.csv), its steps stop, ASGD trains on with the others."""
    path = _scenario(tmp_path, {"name": "asgd"}, [], faults={"crash_per_push": 0.05}, seconds=20)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, "-q", timeout=200)
    events = pd.read_csv(run_dir / "events.csv")
    crashes = events[events.detail.str.contains("crash after push", na=False)]
    assert len(crashes) >= 1 and set(crashes.action) == {"pause"}
    assert (crashes.detail.str.contains("frozen")).all()
    steps = pd.read_csv(run_dir / "steps.csv")
    for _, c in crashes.iterrows():  # no step of a crashed worker ends after its crash (one may be on its way)
        assert (steps[(steps.node == c.target)].time > c.time + 0.5).sum() == 0
    if crashes.target.nunique() < 3:
        alive = steps[~steps.node.isin(crashes.target)]
        assert (alive.time > crashes.time.max() + 1).sum() >= 3
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_wan_link_event_changes_the_rate_between_sites(tmp_path, clean_host):
    """`target: wan:a-b` reshapes the WAN link between the sites in place: w3 (site b) pushes to
    the PS (site a) across it, at 100 Mbit/s before and at most 4 Mbit/s after."""
    data = yaml.safe_load((REPO / "scenarios/topologies/dlion-p-network.yaml").read_text())
    data.update(runtime="netns", stop={"seconds": 22},
                events=[{"at": "8s", "target": "wan:a-b", "action": "link", "rate": "4mbit"}])
    path = write_scenario(tmp_path, data)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, "-q", timeout=200)
    events = pd.read_csv(run_dir / "events.csv")
    assert events.detail.iloc[0].endswith("a->b+b->a: rate=4000000.0"), events.detail.iloc[0]
    traffic = pd.read_csv(run_dir / "traffic.csv")
    wan = traffic[traffic.link.str.startswith("wan")]
    for link, t in wan.groupby("link"):
        t = t.sort_values("time")
        bps = t.delta_bytes.rolling(3).sum() * 8 / t.time.diff(3)
        # windows that begin after the change: 3 samples ~1 s apart (jittered) ending past 12 s (CI:
        # the window ending at 11.0 s began at 7.89 s and read 4.61 Mbit/s of the 100 Mbit/s before)
        after = bps[t.time > 12]
        assert after.max() <= 4e6 * 1.1, (link, after.describe())
        assert bps[t.time < 8].max() > 4 * 4e6, link  # well above the new rate before


def test_killing_the_broker_ends_the_run_clearly(tmp_path, clean_host):
    data = yaml.safe_load((REPO / "scenarios/streaming-smoke.yaml").read_text())
    # at a step, not at 8 s: on a loaded machine (two test lanes) no step had been taken by then
    data.update(runtime="netns", stop={"seconds": 60}, events=[{"at_step": 5, "target": "broker", "action": "kill"}])
    path = write_scenario(tmp_path, data)
    run_dir = tmp_path / "run"
    r = run_up(path, run_dir, "-q", expect=None, timeout=200)
    assert r.returncode != 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "stream broker was killed" in summary["reason"], summary
    killed = pd.read_csv(run_dir / "events.csv").query("action == 'kill'").time.iloc[0]
    assert summary["wall_seconds"] < killed + 37  # it ends, not runs on to its 60 s
    steps = pd.read_csv(run_dir / "steps.csv")
    assert len(steps) > 0 and steps.time.max() < killed + 4  # records up to the kill, readable
    assert _leftovers(run_dir) == []


def test_fedavg_rounds_select_from_the_online_and_drop_the_offline(tmp_path, clean_host):
    """fedavg, K = 2 of 5 workers with over-selection 1.5 (3 selected a round), a 3-s deadline; w1
    offline from 8 to 16 s (a trace; the first round can take 6 s to come on a loaded host, and w1
    must have joined before it goes). Rounds go on while it is away, none counts it as finished,
    the PS stops drawing it once it lost it, and back online it finishes rounds again; every row
    of rounds.csv agrees with itself."""
    (tmp_path / "avail.csv").write_text("node,start,end\nw1,0,8\nw1,16,1000\n")
    data = {"name": "fedavg-availability", "seed": 1, "runtime": "netns",
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_seconds": 2},
            "stop": {"seconds": 27}, "faults": {"worker_timeout": "2s"},
            "algorithm": {"name": "fedavg", "params": {"period": 4, "clients": 2, "over_selection": 1.5,
                                                       "deadline_s": 3}},
            "profiles": {"edge": {"cpus": 0.3, "bandwidth": "100mbit"}},
            "workers": [{"count": 5, "profile": "edge"}], "availability": [{"target": "w1", "trace": "avail.csv"}]}
    path = write_scenario(tmp_path, data)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, "-q", timeout=200)
    rounds = pd.read_csv(run_dir / "rounds.csv", keep_default_na=False)
    assert len(rounds) >= 10, rounds
    names = {c: rounds[c].map(lambda s: set(s.split())) for c in ("online", "selected", "finished", "dropped")}
    for i in rounds.index:  # each row agrees with itself
        sel, fin = names["selected"][i], names["finished"][i]
        assert len(sel) == min(3, rounds.n_online[i]) == rounds.n_selected[i] and sel <= names["online"][i]
        assert fin <= sel and len(fin) <= 2 and names["dropped"][i] == sel - fin, rounds.loc[i].to_dict()
    assert set(rounds.reason) <= {"reports", "deadline", "abandoned at deadline", "no selected client left"}
    w1_finished = rounds.time[names["finished"].map(lambda s: "w1" in s)]
    assert not ((w1_finished > 8.7) & (w1_finished < 16)).any(), list(w1_finished)  # offline: never reports
    away = rounds[(rounds.time > 12) & (rounds.time < 16)]
    assert len(away) >= 3, rounds  # training goes on without it
    assert (~away.online.str.contains("w1")).any(), away  # lost: no longer online as the PS sees it
    assert (w1_finished > 16).any(), rounds  # back online, it is drawn and reports again
    ps = json.loads((run_dir / "ps.json").read_text())
    assert sum(ps["strategy"]["rounds_closed"].values()) == len(rounds)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_accuracy"] > 0.6, summary


@pytest.mark.parametrize("runtime", ["netns", "docker"])
def test_per_round_trainers_run_only_for_the_rounds_that_select_them(tmp_path, clean_host, runtime):
    """fedavg `trainers: per_round`, K = 2 of 8 devices, a 4-s deadline; w1 offline the whole run.
    No worker's trainer starts with the run: the runner starts a round's selected ones when the PS
    asks, each trains only on the models of rounds that selected it, w1 is never online, never
    drawn, never started; the rounds go on and the model learns. Docker: a device's container
    stays up the whole run, its trainer a role its supervisor starts and ends."""
    if runtime == "docker":
        _docker_or_skip()
    (tmp_path / "avail.csv").write_text("node,start,end\nw1,1000,2000\n")
    data = {"name": "per-round", "seed": 1, "runtime": runtime,
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_seconds": 2},
            "stop": {"seconds": 25},
            "algorithm": {"name": "fedavg", "params": {"period": 4, "clients": 2, "deadline_s": 4,
                                                       "trainers": "per_round"}},
            "profiles": {"edge": {"cpus": 0.3, "bandwidth": "100mbit"}},
            "workers": [{"count": 8, "profile": "edge"}], "availability": [{"target": "w1", "trace": "avail.csv"}]}
    run_dir = tmp_path / "run"
    run_up(write_scenario(tmp_path, data), run_dir, "-q", timeout=200)
    rounds = pd.read_csv(run_dir / "rounds.csv", keep_default_na=False)
    assert len(rounds) >= 5, rounds
    selected = {int(r): set(s.split()) for r, s in zip(rounds["round"], rounds.selected)}
    during = rounds[rounds.time < 24.5]  # the plan ends at the run's 25 s: w1 is online again from then
    assert all(len(s) == 2 for s in selected.values()) and not any("w1" in s.split() for s in during.online)
    steps = pd.read_csv(run_dir / "steps.csv")
    assert "w1" not in set(steps[steps.time < 24.5].node) and len(steps) > 0
    for version, nodes in steps.groupby("model_version").node:  # only a round's clients train on its model
        if int(version) in selected:
            assert set(nodes) <= selected[int(version)], (version, set(nodes), selected[int(version)])
    summary = json.loads((run_dir / "summary.json").read_text())
    trainers = summary["trainers"]
    chosen = sum(len(s) for s in selected.values())
    assert trainers["offline"] == trainers["not a worker"] == trainers["failed"] == 0, trainers
    # one ask a selection; the last round's may be cut
    asked = trainers["started"] + trainers["running already"] + trainers["cut off by the end"]
    assert trainers["started"] >= 2 and chosen <= asked <= chosen + 2, (trainers, chosen)
    assert summary["status"] == "completed", summary
    if runtime == "netns":
        assert summary["final_accuracy"] > 0.6, summary
    else:  # a device's first trainer in its container imports torch and loads its data (up to 6.5 s at 0.3
        # of a core, against the 4-s deadline: those rounds close empty); later ones fork warm
        assert (rounds.n_finished > 0).sum() >= 2 and summary["final_accuracy"] > 0.2, (rounds, summary)


def test_an_offline_worker_s_trainer_stopped_then_started_again(tmp_path, clean_host):
    """while_offline: stop: w1's trainer is killed when it goes offline (its memory freed) and
    started again when it is back; the PS loses it and takes it back as a restarted worker."""
    (tmp_path / "avail.csv").write_text("node,start,end\nw1,0,6\nw1,12,1000\n")
    data = {"name": "availability-stop", "seed": 1, "runtime": "netns",
            "workload": {"model": "mlp", "dataset": "mnist5k", "batch_size": 32, "lr": 0.05, "eval_interval": 20},
            "stop": {"seconds": 24}, "algorithm": {"name": "asgd"},
            "profiles": {"edge": {"cpus": 0.3, "bandwidth": "100mbit"}}, "workers": [{"count": 3, "profile": "edge"}],
            "availability": [{"target": "w1", "trace": "avail.csv", "while_offline": "stop"}]}
    run_dir = tmp_path / "run"
    run_up(write_scenario(tmp_path, data), run_dir, "-q", timeout=200)
    events = pd.read_csv(run_dir / "events.csv")
    ours = events[events.target == "w1"].sort_values("time", kind="stable")
    timeline = ours[ours.action.isin(["partition", "kill", "heal", "restart"])]
    assert list(timeline.action) == ["kill", "partition", "heal", "restart"], ours.to_dict("records")
    assert "started again" in timeline[timeline.action == "restart"].detail.iloc[0]
    steps = pd.read_csv(run_dir / "steps.csv")
    w1 = steps[steps.node == "w1"]
    assert ((w1.time > 6.6) & (w1.time < 12)).sum() == 0  # no trainer while offline
    assert (w1.time > 14).sum() >= 3, w1.tail()  # a new trainer, back in the run
    res = pd.read_csv(run_dir / "resources.csv")
    away = res[(res.node == "w1") & (res.time > 8) & (res.time < 11.5)]
    assert away.empty or (away.memory_bytes < 4 * 2**20).all(), away  # nothing left in its cgroup
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
