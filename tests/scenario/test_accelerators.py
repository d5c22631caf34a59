"""Accelerator entries: the roofline step-time model, every entry's sources, and a paced step of
three batch sizes held to the roofline's time for each."""

from __future__ import annotations

import pytest

from testbed.node.pacing import DevicePace
from testbed.scenario.devices import catalog as cat
from testbed.scenario.devices.step_time import StepCost, StepTime, proportional, roofline

ACCELERATORS = ("jetson-nano", "jetson-tx2", "jetson-xavier-nx", "jetson-agx-orin", "k80", "t4", "v100", "a100",
                "h100")
# adacomp_cnn at batch 32, as the calibration counts it
CNN = StepCost(flops=414_498_816, batch=32, params=211_690, activations=2_316_608)


def test_the_roofline_is_overhead_plus_the_slower_of_compute_and_memory():
    cost = StepCost(flops=1e9, batch=10, params=1_000_000, activations=10 * 250_000)
    # 1e8 FLOPs a sample at 1 TFLOP/s x 0.5 = 0.2 ms a sample; bytes: 4 x (6 x 1e6 + 4 x 2.5e5 a sample)
    t = roofline(cost, peak_flops=1e12, efficiency=0.5, bandwidth_bytes=100e9, overhead_s=0.001)
    assert t.compute_s_per_sample == pytest.approx(2e-4)
    assert t.memory_s == pytest.approx(24e6 / 100e9) and t.memory_s_per_sample == pytest.approx(4e6 / 100e9)
    assert t.seconds(10) == pytest.approx(0.001 + max(10 * 2e-4, 2.4e-4 + 10 * 4e-5))  # compute-bound: 3 ms
    slow_memory = roofline(cost, peak_flops=1e12, efficiency=0.5, bandwidth_bytes=1e9, overhead_s=0.001)
    assert slow_memory.seconds(10) == pytest.approx(0.001 + 0.024 + 0.04)  # memory-bound: 65 ms
    assert t.seconds(0) == pytest.approx(0.001 + 2.4e-4)  # an empty step still costs its fixed part


def test_a_cpu_entry_keeps_its_proportional_step():
    pi4 = cat.builtin()["raspberry-pi-4"].speed
    shape = pi4.step_time(CNN)
    assert shape == proportional(CNN.flops / 32, 7.2e9)
    assert shape.seconds(32) == pytest.approx(pi4.step_seconds(CNN.flops))
    assert shape.seconds(128) == pytest.approx(4 * shape.seconds(32))


def test_an_accelerator_s_step_grows_less_than_its_batch():
    nano, a100 = cat.builtin()["jetson-nano"].speed, cat.builtin()["a100"].speed
    n8, n128 = nano.step_time(CNN).seconds(8), nano.step_time(CNN).seconds(128)
    # 4 ms fixed, then 12.95 MFLOP a sample at 0.236 TFLOP/s x 0.3
    assert n8 == pytest.approx(0.004 + 8 * (CNN.flops / 32) / (0.236e12 * 0.3))
    assert 1 < n128 / n8 < 16  # far from proportional
    assert a100.step_time(CNN).seconds(128) < n128 / 10
    assert a100.step_time(CNN).seconds(32) == pytest.approx(0.001 + 32 * (CNN.flops / 32) / (19.5e12 * 0.4))


def test_a_dilated_device_takes_k_times_as_long_at_every_batch():
    for name in ("t4", "raspberry-pi-4"):
        speed = cat.builtin()[name].speed
        slow = speed.dilated(8)
        for b in (1, 32, 512):
            assert slow.step_time(CNN).seconds(b) == pytest.approx(8 * speed.step_time(CNN).seconds(b)), (name, b)


def test_every_accelerator_entry_is_sourced_and_stated_as_an_estimate():
    devices = cat.builtin()
    for name in ACCELERATORS:
        d = devices[name]
        assert d.accelerator is not None and d.gflops is None, name
        assert "data sheet" in d.source or "specification" in d.source or "technical brief" in d.source, name
        assert f"{d.accelerator.memory_gbps:g}" in (d.source + d.derivation).replace(",", ""), name  # cited
        assert "estimate" in d.derivation and d.estimate, name  # efficiency and overhead are estimates
        assert d.power is not None and d.power.active_w > d.power.idle_w > 0 and len(d.power.source) > 30, name
    for name, d in devices.items():
        assert d.power is not None, f"{name}: every shipped entry states its power"
        assert d.power.estimate or "measure" in d.power.source, name


def test_an_entry_is_a_cpu_or_an_accelerator_not_both():
    base = dict(cores=1, memory="1GiB", source="a data sheet, cited", derivation="arithmetic = 1")
    acc = {"peak_tflops": 1, "memory_gbps": 10, "efficiency": 0.5, "overhead_ms": 1}
    with pytest.raises(ValueError, match="gflops"):
        cat.parse_entries({"x": {**base, "gflops": 1, "accelerator": acc}}, "devices")
    with pytest.raises(ValueError, match="gflops"):
        cat.parse_entries({"x": base}, "devices")
    with pytest.raises(ValueError, match="active_w"):
        cat.parse_entries({"x": {**base, "gflops": 1, "power": {"idle_w": 5, "active_w": 2,
                                                               "source": "a measurement, cited"}}}, "devices")
    d = cat.parse_entries({"x": {**base, "accelerator": acc}}, "devices")["x"]
    assert d.speed.gflops == pytest.approx(500)  # 1 TFLOP/s x 0.5 on its one core


def test_a_paced_accelerator_step_of_three_batches_is_held_to_the_roofline():
    shape = cat.builtin()["t4"].speed.dilated(50).step_time(CNN)
    slept: list[float] = []
    pace = DevicePace(shape.seconds(32), 32, sleep=slept.append, shape=shape)
    for b in (8, 32, 128):
        busy = 0.01 * b / 32  # the host's work grows with the batch, well under the device's time
        assert busy + pace.after(busy, b) == pytest.approx(shape.seconds(b)), b
    assert shape.seconds(128) / shape.seconds(8) < 2  # a proportional pace would give 16


def test_the_shape_crosses_to_a_node_as_plain_numbers():
    shape = cat.builtin()["v100"].speed.step_time(CNN)
    assert StepTime.from_dict(shape.as_dict()) == shape
    assert StepTime.from_dict({}) is None and StepTime.from_dict(None) is None
    pace = DevicePace(0.2, 32, shape=None)  # no shape: in proportion, as a CPU entry
    assert pace.want(64) == pytest.approx(0.4)


def test_plan_quota_targets_the_roofline_and_keeps_the_shape_for_the_node():
    from testbed.run import devices as run_devices

    cal = run_devices.Calibration(node="w0", host="h", device="t4", gflops_per_core=810, cores=4, model="adacomp_cnn",
                                  flops_per_step=CNN.flops, step_s=[0.02], cpu_s=[0.02], host_cpus=2, batch_size=32,
                                  params=CNN.params, activations=CNN.activations)
    speed = cat.builtin()["t4"].speed.dilated(100)
    run_devices.plan_quota(cal, speed, paced=True)
    assert cal.target_step_s == pytest.approx(100 * cat.builtin()["t4"].speed.step_time(CNN).seconds(32))
    assert StepTime.from_dict(cal.step_shape).seconds(32) == pytest.approx(cal.target_step_s)
    assert cal.needed_cores == pytest.approx(0.02 / cal.target_step_s)
