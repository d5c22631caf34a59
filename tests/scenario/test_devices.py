"""Device profiles: the catalog, its unit, users' entries, the bad-input lines, and the
quota that follows from a calibration (a fake one: no node, no torch run)."""

import math
from importlib import metadata

import pytest
import yaml

from testbed.plan import parse_scenario
from testbed.plan.cluster import build_cluster
from testbed.run import devices as run_devices
from testbed.scenario.checks import ScenarioError, validate_schema
from testbed.scenario.devices import catalog as cat
from testbed.scenario.scenario_file import read_scenario_file, scenario_to_yaml


def errors(data) -> list[str]:
    with pytest.raises(ScenarioError) as e:
        validate_schema(data)
    return e.value.lines


def one_profile(**profile) -> dict:
    return {"profiles": {"edge": profile}, "workers": [{"count": 1, "profile": "edge"}]}


# --- the catalog ------------------------------------------------------------------------------


def test_catalog_has_the_devices_the_issue_names_each_cited():
    devices = cat.builtin()
    assert len(devices) >= 8
    for name in ("raspberry-pi-4", "raspberry-pi-3b", "jetson-nano-cpu"):
        assert name in devices
    assert sum(n.startswith("pixel-") for n in devices) >= 2
    assert any(n.startswith("laptop-") for n in devices) and any(n.startswith("server-") for n in devices)
    for name, d in devices.items():
        assert len(d.source) > 40, name  # a citation, not a word
        assert d.derivation.strip(), name
        assert d.memory is not None and d.memory >= 2**30, name
        assert d.estimate, f"{name}: every shipped speed is derived, not measured on the device"


def test_every_derivation_ends_in_the_entry_s_number():
    """The derivation's arithmetic gives the catalog's number (no number without its working)."""
    for name, d in cat.builtin().items():
        if d.accelerator is None:
            assert f"= {d.gflops:g}" in d.derivation, name
        else:  # an accelerator's per-core rate follows from its roofline, rounded in the text
            stated = float(d.derivation.rsplit("= ", 1)[1].split()[0])
            assert stated == pytest.approx(d.speed.gflops, rel=0.005), name


def test_catalog_readme_lists_every_source():
    from importlib import resources

    readme = resources.files("testbed.scenario.devices").joinpath("README.md").read_text()
    for name in cat.builtin():
        assert f"| {name} |" in readme, name


def test_the_unit_s_arithmetic():
    s = cat.Speed(gflops=1.8, cores=4)
    assert s.total_gflops == pytest.approx(7.2)
    # a 72 MFLOP step on 7.2 GFLOP/s takes 10 ms
    assert s.step_seconds(72e6) == pytest.approx(0.010)
    pi3, pi4 = cat.builtin()["raspberry-pi-3b"].speed, cat.builtin()["raspberry-pi-4"].speed
    assert pi3.step_seconds(1e9) / pi4.step_seconds(1e9) == pytest.approx(1.8 / 0.72)


# --- profiles ------------------------------------------------------------------------------


def test_device_profile_takes_the_device_s_memory_unless_set():
    sc = validate_schema(one_profile(device="raspberry-pi-3b"))
    assert sc.profiles["edge"].memory == 2**30
    sc = validate_schema(one_profile(device="raspberry-pi-3b", memory="512MiB"))
    assert sc.profiles["edge"].memory == 512 * 2**20
    # the resolved scenario (RUN/scenario.yaml) validates again, unchanged
    again = validate_schema(yaml.safe_load(scenario_to_yaml(sc)))
    assert again.profiles["edge"].device == "raspberry-pi-3b" and again.profiles["edge"].memory == 512 * 2**20


def test_inline_worker_profile_with_a_device():
    sc = validate_schema({"workers": [{"count": 2, "profile": {"device": "pixel-4"}}]})
    assert sc.workers[0].profile.memory == 6 * 2**30


def test_unknown_device_names_the_field_and_the_closest():
    assert errors(one_profile(device="raspbery-pi-4")) == [
        "profiles.edge.device: unknown device 'raspbery-pi-4' (closest: raspberry-pi-4, raspberry-pi-3b)"]
    line, = errors({"workers": [{"profile": {"device": "zzzz"}}]})
    assert line.startswith("workers[0].profile.device: unknown device 'zzzz' (known: ")
    assert "raspberry-pi-4" in line


def test_device_name_of_the_wrong_shape_is_not_quoted():
    line, = errors(one_profile(device="../../etc/passwd"))
    assert line.startswith("profiles.edge.device: ") and "passwd" not in line


def test_device_or_speed_with_cpus_is_one_line():
    line, = errors(one_profile(device="raspberry-pi-4", cpus=0.5))
    assert line.startswith("profiles.edge: device: ") and "cpus" in line
    line, = errors(one_profile(speed={"gflops": 2, "cores": 2}, cpus=0.5))
    assert line.startswith("profiles.edge: speed: ")
    line, = errors(one_profile(speed={"gflops": 2, "cores": 2}, device="pixel-4"))
    assert line.startswith("profiles.edge: speed: ")
    line, = errors(one_profile(device="pixel-4", cpu_period="20ms"))
    assert line.startswith("profiles.edge: cpu_period: ")


def test_speed_in_the_unit_directly():
    sc = validate_schema(one_profile(speed={"gflops": 2.5, "cores": 2}))
    assert sc.profiles["edge"].speed.total_gflops == 5.0
    assert sc.profiles["edge"].memory is None  # a bare speed names no memory
    line, = errors(one_profile(speed={"gflops": -1}))
    assert line.startswith("profiles.edge.speed.gflops: ")


# --- users' entries ------------------------------------------------------------------------

BOARD = {"cores": 2, "memory": "1GiB", "gflops": 1.5, "source": "timed on the board, 2026-11-27",
         "derivation": "FlopCounterMode FLOPs / median step time"}


def test_inline_user_entry():
    sc = validate_schema({**one_profile(device="my-board"), "devices": {"my-board": BOARD}})
    assert sc.profiles["edge"].memory == 2**30
    assert cat.catalog(sc.devices)["my-board"].speed.total_gflops == 3.0


def test_user_entry_without_a_source_is_one_line():
    board = {k: v for k, v in BOARD.items() if k != "source"}
    line, = errors({**one_profile(device="my-board"), "devices": {"my-board": board}})
    assert line.startswith("devices.my-board: source: missing")


def test_user_entry_may_not_shadow_the_catalog():
    assert errors({"devices": {"raspberry-pi-4": BOARD}}) == [
        "devices.raspberry-pi-4: a device of that name is in the catalog already; give yours another name"]


def test_malformed_entries_name_their_field():
    lines = errors({"devices": {"b": {**BOARD, "gflops": "fast", "colour": "red"}}})
    assert any(x.startswith("devices.b.gflops: ") for x in lines)
    assert "devices.b.colour: unknown field" in lines
    line, = errors({"devices": {"Bad Name": BOARD}})
    assert line.startswith("devices: an entry's name is not a device name")


def test_devices_file_beside_the_scenario(tmp_path):
    (tmp_path / "devices.yaml").write_text(yaml.safe_dump({"my-board": BOARD}))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"devices": "devices.yaml", **one_profile(device="my-board")}))
    sc = validate_schema(read_scenario_file(tmp_path / "s.yaml"))
    assert sc.devices["my-board"].gflops == 1.5
    # carried into the resolved scenario: RUN/scenario.yaml needs no file
    assert "my-board" in yaml.safe_load(scenario_to_yaml(sc))["devices"]


def test_devices_file_errors_name_file_line_and_field(tmp_path):
    good = yaml.safe_dump({"my-board": BOARD})
    bad = yaml.safe_dump({"other": {**BOARD, "source": ""}})
    (tmp_path / "devices.yaml").write_text(good + bad)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"devices": "devices.yaml"}))
    with pytest.raises(ScenarioError) as e:
        read_scenario_file(tmp_path / "s.yaml")
    line, = e.value.lines
    other_line = (good + bad).splitlines().index("other:") + 1
    assert line.startswith(f"devices.yaml line {other_line}: devices.other.source: missing")


def test_devices_file_outside_the_folder_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text("devices: ../../etc/passwd\n")
    with pytest.raises(ScenarioError) as e:
        read_scenario_file(tmp_path / "s.yaml")
    assert e.value.lines[0].startswith("devices: '../../etc/passwd' is outside the scenario's folder")


def test_devices_file_that_is_not_yaml_or_too_big(tmp_path):
    (tmp_path / "devices.yaml").write_text("a: [\n")
    (tmp_path / "s.yaml").write_text("devices: devices.yaml\n")
    with pytest.raises(ScenarioError) as e:
        read_scenario_file(tmp_path / "s.yaml")
    assert e.value.lines[0].startswith("devices: devices.yaml: not valid YAML")
    (tmp_path / "devices.yaml").write_text("#" * (cat.MAX_FILE_BYTES + 1))
    with pytest.raises(ScenarioError) as e:
        read_scenario_file(tmp_path / "s.yaml")
    assert "larger than" in e.value.lines[0]


def test_plugin_entries(monkeypatch):
    class EP:
        name, value = "acme", "acme.devices:CATALOG"

        def load(self):
            return lambda: {"acme-board": BOARD}

    real = metadata.entry_points
    monkeypatch.setattr(cat.metadata, "entry_points",
                        lambda group=None, **kw: [EP()] if group == cat.ENTRY_POINT_GROUP else real(group=group, **kw))
    cat.plugins.cache_clear()
    try:
        sc = validate_schema(one_profile(device="acme-board"))
        assert sc.profiles["edge"].memory == 2**30
        assert "acme-board" in cat.catalog()
    finally:
        cat.plugins.cache_clear()


# --- quota from a calibration (fake) ---------------------------------------------------------


def fake_cal(cpu_s: float, wall_s: float, flops: int = 10**8, cpus: int = 2, node: str = "w0", host: str = "h1"):
    return run_devices.Calibration(node=node, host=host, device="raspberry-pi-4", gflops_per_core=1.8, cores=4,
                                   model="adacomp_cnn", flops_per_step=flops, step_s=[wall_s] * 5,
                                   cpu_s=[cpu_s * 0.98, cpu_s, cpu_s, cpu_s * 1.02, cpu_s], host_cpus=cpus)


def test_quota_from_a_calibration():
    speed = cat.builtin()["raspberry-pi-4"].speed  # 7.2 GFLOP/s in all
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.004, wall_s=0.004), speed)
    target = 1e8 / 7.2e9  # 13.9 ms
    assert cal.target_step_s == pytest.approx(target)
    assert cal.quota_cores == pytest.approx(0.004 / target)  # 0.288 cores
    assert cal.threads == 1
    assert cal.available_cores == pytest.approx(2.0)
    assert run_devices.shortfall_line(cal) is None
    meta = cal.meta()
    assert meta["calibration"]["repetitions"] == 5
    assert meta["calibration"]["cpu_s_median"] == pytest.approx(0.004)
    assert meta["calibration"]["cpu_s_spread"] == pytest.approx(0.04)
    assert meta["quota_cores"] == pytest.approx(cal.quota_cores)


def test_a_slower_host_gets_a_larger_quota_a_shared_one_the_same():
    speed = cat.Speed(gflops=1.0, cores=1)
    fast = run_devices.plan_quota(fake_cal(cpu_s=0.01, wall_s=0.01), speed)
    slow = run_devices.plan_quota(fake_cal(cpu_s=0.02, wall_s=0.02), speed)  # half the work per CPU second
    shared = run_devices.plan_quota(fake_cal(cpu_s=0.01, wall_s=0.02), speed)  # half a CPU free
    assert slow.quota_cores == pytest.approx(2 * fast.quota_cores)
    assert shared.quota_cores == pytest.approx(fast.quota_cores)
    assert shared.available_cores == pytest.approx(0.5)  # a one-core device: one of the 2 CPUs, at half
    two_cores = run_devices.plan_quota(fake_cal(cpu_s=0.01, wall_s=0.02), cat.Speed(gflops=0.5, cores=2))
    assert two_cores.available_cores == pytest.approx(1.0)  # 2 CPUs at half each


def test_multicore_device_threads():
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.1, wall_s=0.1, flops=10**9, cpus=8), cat.Speed(gflops=5, cores=4))
    assert cal.quota_cores == pytest.approx(2.0)  # 20 GFLOP/s from a 10 GFLOP/s core
    assert cal.threads == 2
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.1, wall_s=0.1, flops=10**9, cpus=8), cat.Speed(gflops=6, cores=4))
    assert cal.threads == math.ceil(2.4)
    # never more threads than the device has cores, nor than the host has CPUs
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.1, wall_s=0.1, flops=10**9, cpus=8), cat.Speed(gflops=12, cores=2))
    assert cal.threads == 2 and cal.available_cores == pytest.approx(2.0)
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.1, wall_s=0.1, flops=10**9, cpus=2), cat.Speed(gflops=6, cores=4))
    assert cal.threads == 2
    # a paced device's headroom is not a need: 0.72 cores needed, 1.44 of quota, one thread
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.01, wall_s=0.01), cat.builtin()["raspberry-pi-4"].speed, paced=True)
    assert cal.quota_cores > 1 and cal.threads == 1


def test_a_one_core_device_on_slower_cores_is_refused_not_spread_over_two():
    # 10 GFLOP/s from a host core of 6.7: a core and a half, which one thread cannot take
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.15, wall_s=0.15, flops=10**9, cpus=8), cat.Speed(gflops=10, cores=1))
    assert cal.threads == 1 and cal.available_cores == pytest.approx(1.0)
    assert "it needs 1.50 cores of this host" in run_devices.shortfall_line(cal)


def test_a_device_that_needs_two_cores_is_measured_again_on_two_threads_before_its_quota():
    sc = parse_scenario({"profiles": {"board": {"speed": {"gflops": 5, "cores": 4}, "pace_steps": False}},
                         "workers": [{"count": 1, "profile": "board"}]})
    spec = build_cluster(sc, "abc123")
    target = 1e8 / 20e9  # 5 ms
    rt = FakeRuntime(cpu_s=0.008, wall_s=0.008, under_quota=target)  # one thread: 1.6 cores' worth
    cals, _ = run_devices.calibrate_devices(rt, sc, spec, say=lambda s: None, host_cores={"": 2})
    # one thread, then two (no quota on either), then the check on two threads under the quota
    assert rt.jobs == [("w0", "calibrate", 1, False), ("w0", "calibrate", 2, False), ("w0", "check", 2, True)]
    assert cals["w0"]["threads"] == 2 and cals["w0"]["calibration"]["threads"] == 2
    assert cals["w0"]["one_thread"] == {"needed_cores": pytest.approx(1.6), "cpu_s_median": pytest.approx(0.008)}
    # the quota is two threads' CPU per step (10% dearer than one's) over the device's step time
    assert rt.quotas["w0"] == pytest.approx(0.008 * 1.1 / target)
    assert spec.node("w0").threads == 2 and spec.node("w0").device_cpus == pytest.approx(1.76)


def test_device_faster_than_its_host_is_one_line():
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.1, wall_s=0.2, flops=10**9, cpus=2), cat.Speed(gflops=5, cores=4))
    # needs 2.0 cores; 2 CPUs at the half it got while calibrating: 1.0
    assert run_devices.shortfall_line(cal) == (
        "w0: device raspberry-pi-4 is faster than host h1 can give: it needs 2.00 cores of this host for "
        "adacomp_cnn, the node can get 1.00 (short by 1.00 cores, 50%); run it dilated (dilation: 2 or auto), "
            "or pick a slower device or a faster host")


def test_quota_under_the_kernel_s_floor_is_one_line():
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.0001, wall_s=0.0001, flops=10**9), cat.Speed(gflops=1, cores=1))
    assert cal.quota_cores < 0.01
    assert run_devices.floor_line(cal).startswith("w0: device raspberry-pi-4 is too slow to emulate on host h1")


def test_quotas_adding_up_past_the_host_warn_once_per_host():
    speed = cat.Speed(gflops=1.0, cores=1)
    cals = [run_devices.plan_quota(fake_cal(cpu_s=0.08, wall_s=0.08, node=f"w{i}"), speed) for i in range(4)]
    assert all(c.quota_cores == pytest.approx(0.8) for c in cals)
    line, = run_devices.oversubscribed_lines(cals)
    assert line.startswith("host h1: the device quotas of 4 node(s) add up to 3.20 cores, more than its 2")
    assert run_devices.oversubscribed_lines(cals[:2]) == []


class FakeRuntime:
    """A runtime whose calibration job answers at once with a fixed measurement."""

    PARALLEL_COST = 0.1  # each thread past the first costs a step this much more CPU time

    def __init__(self, cpu_s: float, wall_s: float, under_quota: float = 0.0):
        self.cpu_s, self.wall_s, self.quotas, self.puts = cpu_s, wall_s, {}, {}
        self.under_quota = under_quota  # the step time the check under the quota measures
        self.jobs: list[tuple[str, str, int, bool]] = []  # node, calibrate or check, threads, under a quota

    def mailbox(self, name):
        rt = self

        class Slot:
            def __init__(self, key):
                self.key = key

            def __str__(self):
                return self.key

            def exists(self):
                return self.key in rt.puts

            def arrived(self, timeout=None):  # the job answered at once: nothing on its way
                return self.exists()

            def read_text(self):
                return rt.puts[self.key]

        class Box:
            def __truediv__(self, key):
                return Slot(f"{name}/{key}")

        return Box()

    def start(self, node, target, kwargs, label=""):
        import json

        assert target == run_devices.CALIBRATE_TARGET
        check, threads = kwargs["result_path"].endswith("-verify.json"), kwargs["threads"]
        self.jobs.append((node, "check" if check else "calibrate", threads, node in self.quotas))
        cpu = self.cpu_s * (1 + self.PARALLEL_COST * (threads - 1))
        wall = self.under_quota if check else cpu / threads * self.wall_s / self.cpu_s
        self.puts[kwargs["result_path"]] = json.dumps({
            "model": kwargs["model"], "flops_per_step": 10**8, "step_s": [wall] * 5, "cpu_s": [cpu] * 5,
            "cpus": 2, "host": "h1"})

        class Done:
            exitcode = 0

            def join(self, timeout=None):
                pass

        return Done()

    def set_cpus(self, node, cpus):
        self.quotas[node] = cpus


def test_calibrate_devices_sets_quotas_threads_and_meta():
    # the quota alone (pace_steps: false; the paced quota's headroom: the pacing tests below)
    sc = parse_scenario({"profiles": {"pi": {"device": "raspberry-pi-4", "pace_steps": False}, "fixed": {"cpus": 0.5}},
                         "workers": [{"count": 1, "profile": "pi"}, {"count": 1, "profile": "fixed", "name": "f"}]})
    spec = build_cluster(sc, "abc123")
    rt = FakeRuntime(cpu_s=0.004, wall_s=0.004)
    cals, warnings = run_devices.calibrate_devices(rt, sc, spec, say=lambda s: None, verify=False)
    assert set(cals) == {"w0"} and warnings == []
    assert rt.quotas == {"w0": pytest.approx(0.004 * 7.2e9 / 1e8)}
    assert spec.node("w0").device_cpus == rt.quotas["w0"] and spec.node("w0").threads == 1
    nodes = {n.name: {} for n in spec.nodes}
    run_devices.describe(spec, cals, nodes)
    assert nodes["w0"]["device"]["calibration"]["model"] == sc.workload.model
    assert nodes["w0"]["cpu_basis"].startswith("device")
    assert nodes["f0"]["cpu_basis"].startswith("host-relative")
    assert "device" not in nodes["f0"] and "cpu_basis" not in nodes["ps"]


def test_calibrate_devices_refuses_before_any_quota_is_set():
    sc = parse_scenario({"profiles": {"big": {"device": "laptop-apple-m1"}},
                         "workers": [{"count": 1, "profile": "big"}]})
    rt = FakeRuntime(cpu_s=0.05, wall_s=0.05)  # a 2 GFLOP/s host core: the M1 needs 30 of them
    with pytest.raises(run_devices.DeviceRefused, match=r"^w0: device laptop-apple-m1 is faster than host"):
        run_devices.calibrate_devices(rt, sc, build_cluster(sc, "abc123"), say=lambda s: None)
    assert rt.quotas == {}


def test_measure_steps_counts_the_flops_of_forward_and_backward():
    """The node's job (testbed/node/calibrate.py) on a small MLP, outside any node: its FLOPs are
    the dense layers' multiply-adds, x2, forward and backward (no input gradient at layer 1)."""
    from testbed.node.calibrate import measure_steps

    r = measure_steps("mlp", "mnist5k", batch_size=8, repetitions=3, min_rep_s=0.005)
    macs = 784 * 200 + 200 * 200 + 200 * 10  # 1x28x28, 10 classes
    backward = 2 * macs + 2 * (200 * 200 + 200 * 10)  # weight grads of all three, input grads of two
    assert r["flops_per_step"] == 8 * (2 * macs + backward)
    assert r["repetitions"] == 3 and len(r["step_s"]) == 3 and len(r["cpu_s"]) == 3
    assert all(x > 0 for x in r["step_s"] + r["cpu_s"])
    assert r["threads"] == 1 and r["batch_size"] == 8 and r["cpus"] >= 1


def test_the_check_under_the_quota_corrects_it_once():
    sc = parse_scenario({"profiles": {"pi": {"device": "raspberry-pi-4", "pace_steps": False}},
                         "workers": [{"count": 1, "profile": "pi"}]})
    target = 1e8 / 7.2e9
    rt = FakeRuntime(cpu_s=0.004, wall_s=0.004, under_quota=1.1 * target)  # 10% slow under the quota
    cals, _ = run_devices.calibrate_devices(rt, sc, build_cluster(sc, "abc123"), say=lambda s: None)
    first = 0.004 / target
    assert cals["w0"]["first_quota_cores"] == pytest.approx(first)
    assert cals["w0"]["correction"] == pytest.approx(1.1)
    assert rt.quotas["w0"] == pytest.approx(1.1 * first) and cals["w0"]["quota_cores"] == rt.quotas["w0"]
    rt = FakeRuntime(cpu_s=0.004, wall_s=0.004, under_quota=10 * target)  # a wild check: bounded
    cals, _ = run_devices.calibrate_devices(rt, sc, build_cluster(sc, "abc123"), say=lambda s: None)
    assert cals["w0"]["correction"] == run_devices.MAX_CORRECTION


class SideBySideRuntime(FakeRuntime):
    """A FakeRuntime whose jobs run until joined: it notes which ran at the same time, per phase."""

    def __init__(self, cpu_s: float, wall_s: float, under_quota: float = 0.0):
        super().__init__(cpu_s, wall_s, under_quota)
        self.running: set[str] = set()
        self.together: dict[str, list[set[str]]] = {"calibrate": [], "check": []}

    def start(self, node, target, kwargs, label=""):
        super().start(node, target, kwargs, label)
        phase = "check" if kwargs["result_path"].endswith("-verify.json") else "calibrate"
        self.running.add(node)
        self.together[phase].append(set(self.running))
        rt = self

        class Running:
            exitcode = 0

            def join(self, timeout=None):
                rt.running.discard(node)

        return Running()


def _fleet(count: int, **profile):
    sc = parse_scenario({"profiles": {"pi": {"device": "raspberry-pi-4", **profile}},
                         "workers": [{"count": count, "profile": "pi"}]})
    return sc, build_cluster(sc, "abc123")


def test_devices_calibrate_side_by_side_while_their_cores_fit_the_host():
    sc, spec = _fleet(5)
    target = 1e8 / 7.2e9
    rt = SideBySideRuntime(cpu_s=0.004, wall_s=0.004, under_quota=target)  # quota 0.288 cores each
    serial_rt = SideBySideRuntime(cpu_s=0.004, wall_s=0.004, under_quota=target)
    cals, _ = run_devices.calibrate_devices(rt, sc, spec, say=lambda s: None, host_cores={"": 2})
    # a core each with no quota: two at a time on 2 CPUs (was one at a time)
    assert [len(s) for s in rt.together["calibrate"]] == [1, 2, 1, 2, 1]
    assert [len(s) for s in rt.together["check"]] == [1, 2, 1, 2, 1]  # 0.288 cores each, but a CPU each
    assert cals["w0"]["calibrated_beside"] == ["w1"] and cals["w4"]["calibrated_beside"] == []
    assert cals["w2"]["checked_beside"] == ["w3"]
    # the same quotas and meta as one at a time (a host whose CPUs are not known: each node alone)
    serial, _ = run_devices.calibrate_devices(serial_rt, sc, _fleet(5)[1], say=lambda s: None, host_cores={})
    assert max(len(s) for p in serial_rt.together.values() for s in p) == 1
    strip = ("calibrated_beside", "checked_beside")
    assert {n: {k: v for k, v in m.items() if k not in strip} for n, m in cals.items()} == \
        {n: {k: v for k, v in m.items() if k not in strip} for n, m in serial.items()}
    assert rt.quotas == serial_rt.quotas


def test_calibration_groups_keep_each_host_within_its_cpus():
    sc, spec = _fleet(4)
    nodes = spec.workers
    groups = run_devices.calibration_batches([(n, q) for n, q in zip(nodes, (0.9, 0.9, 0.5, 0.3))], {"": 2})
    assert [[n.name for n in g] for g in groups] == [["w0", "w1"], ["w2", "w3"]]  # a job per CPU
    groups = run_devices.calibration_batches([(n, q) for n, q in zip(nodes, (1.5, 1.5, 1.0, 1.5))], {"": 4})
    assert [[n.name for n in g] for g in groups] == [["w0", "w1", "w2"], ["w3"]]  # their cores within 4
    for n in nodes[2:]:
        n.host = "lab-2"  # CPUs not known here: alone
    groups = run_devices.calibration_batches([(n, 0.1) for n in nodes], {"": 2})
    assert [[n.name for n in g] for g in groups] == [["w0", "w1"], ["w2"], ["w3"]]
    sc, spec = _fleet(2, cpuset="0")  # pinned to the same CPU: they would share it
    assert len(run_devices.calibration_batches([(n, 0.1) for n in spec.workers], {"": 2})) == 2


def test_a_refused_device_in_a_group_sets_no_quota_of_that_group():
    sc = parse_scenario({"profiles": {"pi": {"device": "raspberry-pi-4"}, "big": {"device": "laptop-apple-m1"}},
                         "workers": [{"count": 1, "profile": "pi"}, {"count": 1, "profile": "big", "name": "m"}]})
    rt = SideBySideRuntime(cpu_s=0.004, wall_s=0.004)  # the pi needs 0.29 cores, the M1 2.4 of 2
    with pytest.raises(run_devices.DeviceRefused, match=r"^m0: device laptop-apple-m1 is faster than host"):
        run_devices.calibrate_devices(rt, sc, build_cluster(sc, "abc123"), say=lambda s: None, host_cores={"": 2})
    assert rt.quotas == {} and rt.running == set()  # both measured together, both waited for


# --- paced devices (pace_steps: node/pacing.py) ------------------------------------------------


def test_pace_steps_belongs_to_a_device_profile():
    line, = errors(one_profile(cpus=0.5, pace_steps=True))
    assert line.startswith("profiles.edge: pace_steps: ")
    sc = parse_scenario(one_profile(device="raspberry-pi-4", pace_steps=True))
    assert sc.profiles["edge"].pace_steps is True and sc.profiles["edge"].paces_steps()


def test_a_device_profile_is_paced_unless_it_says_not():
    assert parse_scenario(one_profile(device="raspberry-pi-4")).profiles["edge"].paces_steps()
    assert parse_scenario(one_profile(speed={"gflops": 2, "cores": 1})).profiles["edge"].paces_steps()
    assert not parse_scenario(one_profile(device="raspberry-pi-4", pace_steps=False)).profiles["edge"].paces_steps()
    assert not parse_scenario(one_profile(cpus=0.5)).profiles["edge"].paces_steps()  # a host share is not paced


def test_a_paced_step_is_held_to_the_device_s_time_and_an_overrun_is_made_up_once():
    from testbed.node.pacing import DevicePace

    slept: list[float] = []
    pace = DevicePace(0.1, 32, sleep=slept.append)
    assert pace.after(0.04, 32) == pytest.approx(0.06)  # 40 ms of work, held to 100 ms
    assert pace.after(0.02, 16) == pytest.approx(0.03)  # half the batch: half the time
    assert pace.after(0.17, 32) == 0.0 and pace.owed == pytest.approx(0.07)  # a throttled stretch
    assert pace.after(0.04, 32) == pytest.approx(0.0)  # 60 ms spare repay 60 of the 70 owed
    assert pace.after(0.04, 32) == pytest.approx(0.05)  # the last 10 ms, then on time again
    assert sum(slept) == pytest.approx(0.06 + 0.03 + 0.05)
    assert pace.after(0.5, 32) == 0.0 and pace.owed == pytest.approx(0.1)  # at most one step carried
    with pytest.raises(ValueError):
        DevicePace(0.0, 32)


def test_a_paced_quota_has_headroom_within_the_host_and_its_need_decides_a_refusal():
    speed = cat.builtin()["raspberry-pi-4"].speed  # target 13.9 ms for 1e8 FLOPs
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.004, wall_s=0.004), speed, paced=True)
    need = 0.004 / (1e8 / 7.2e9)
    assert cal.paced and cal.needed_cores == pytest.approx(need)
    assert cal.quota_cores == pytest.approx(run_devices.PACE_HEADROOM * need)
    # needs 0.72 of the 1.0 core the node can get: headroom only up to that, and no refusal
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.01, wall_s=0.02), speed, paced=True)
    assert cal.quota_cores == pytest.approx(1.0) and run_devices.shortfall_line(cal) is None
    cal = run_devices.plan_quota(fake_cal(cpu_s=0.1, wall_s=0.2, flops=10**9, cpus=2), cat.Speed(gflops=5, cores=4),
                                 paced=True)
    assert run_devices.shortfall_line(cal).startswith("w0: device raspberry-pi-4 is faster than host h1 can give: "
                                                      "it needs 2.00 cores")


def test_a_paced_device_s_check_only_raises_its_quota_and_its_role_gets_the_step_time():
    sc = parse_scenario({"profiles": {"pi": {"device": "raspberry-pi-4", "pace_steps": True}},
                         "workers": [{"count": 1, "profile": "pi"}]})
    target = 1e8 / 7.2e9
    first = run_devices.PACE_HEADROOM * 0.004 / target
    rt = FakeRuntime(cpu_s=0.004, wall_s=0.004, under_quota=0.5 * target)  # well under: kept
    spec = build_cluster(sc, "abc123")
    cals, _ = run_devices.calibrate_devices(rt, sc, spec, say=lambda s: None)
    assert rt.quotas["w0"] == pytest.approx(first) and cals["w0"]["paced"] is True
    assert spec.node("w0").device_step_s == pytest.approx(target) and spec.node("w0").device_step_batch == 32
    rt = FakeRuntime(cpu_s=0.004, wall_s=0.004, under_quota=0.96 * target)  # too close to the device's time
    cals, _ = run_devices.calibrate_devices(rt, sc, build_cluster(sc, "abc123"), say=lambda s: None)
    assert rt.quotas["w0"] == pytest.approx(first * 0.96 / run_devices.PACE_FILL)


def test_measure_steps_paced_holds_each_step_to_its_time():
    from testbed.node.calibrate import measure_steps

    r = measure_steps("mlp", "mnist5k", batch_size=8, repetitions=3, min_rep_s=0.1, pace_s=0.02)
    assert r["paced_s"] == 0.02
    assert all(0.02 <= s < 0.03 for s in r["step_s"]), r["step_s"]


def test_a_worker_s_step_is_paced_by_its_samples():
    import time

    import torch

    from testbed.node.gpu import StepPacer
    from testbed.node.pacing import DevicePace
    from testbed.node.roles.common import WorkerData, device_step

    cpu = torch.device("cpu")
    data = WorkerData(None, None, cpu, None, None, None, StepPacer(cpu), DevicePace(0.04, 8))
    t = time.perf_counter()
    with device_step(data, "w0", 4):  # half the calibrated batch: half its time
        pass
    assert 0.02 <= time.perf_counter() - t < 0.035
    data.pace = None  # not a paced device: no pause
    t = time.perf_counter()
    with device_step(data, "w0", 4):
        pass
    assert time.perf_counter() - t < 0.01
