"""TensorBoard scalars from a run's records (records/tensorboard.py), read back with TensorBoard's
own event reader: after the fact, and while a run goes (`edgebed up --tensorboard DIR`)."""

import json
import subprocess
import time

import pytest

from helpers import REPO, needs_root, start_up, write_scenario

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from testbed.records import metrics  # noqa: E402
from testbed.records.tensorboard import TensorBoardFollower  # noqa: E402


def _scalars(logdir) -> dict:
    ea = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    out = {tag: [(e.step, e.value, e.wall_time) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    out["_text"] = ea.Tags().get("tensors", [])
    return out


def test_records_become_scalars_and_a_half_written_line_waits(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    metrics.init_tables(run)
    (run / "meta.json").write_text(json.dumps({"started": 1000.0}))
    ev, tr = metrics.open_table(run, "eval.csv"), metrics.open_table(run, "traffic.csv")
    ev.write(time=2.0, step=10, updates_received=10, accuracy=0.5, loss=1.5, samples=100)
    tr.write(time=1.0, node="w0", link="access", direction="up", bytes=1000, delta_bytes=1000, packets=1)
    tr.write(time=2.0, node="w0", link="access", direction="up", bytes=251_000, delta_bytes=250_000, packets=9)
    tr.write(time=2.0, node="a", link="wan:b", direction="up", bytes=5, delta_bytes=5, packets=1)
    tr.write(time=3.0, node="a", link="wan:b", direction="up", bytes=125_005, delta_bytes=125_000, packets=9)
    metrics.open_table(run, "steps.csv").write(time=1.5, node="w0", step=3, loss=2.0)
    metrics.open_table(run, "buffer.csv").write(time=1.5, node="w0", buffered=42)
    metrics.open_table(run, "events.csv").write(time=1.2, scheduled_time=1.2, target="w0", action="kill", detail="x")
    with open(run / "eval.csv", "ab") as f:
        f.write(b"4.0,20,20,0.75")  # a line on its way
    tb = TensorBoardFollower(run, tmp_path / "tb")
    tb.poll()
    got = _scalars(tmp_path / "tb")
    assert got["eval/accuracy"] == [(10, 0.5, 1002.0)]  # the model's step, the run's wall clock
    assert got["eval/loss"][0][:2] == (10, 1.5)
    assert got["rate_bps/w0/up"] == [(2000, pytest.approx(2e6), 1002.0)]  # 250 kB in 1 s, at 2000 ms
    assert got["wan_rate_bps/a->b"] == [(3000, pytest.approx(1e6), 1003.0)]
    assert got["train/loss/w0"][0][:2] == (3, 2.0) and got["buffer/w0"][0][:2] == (1500, 42.0)
    assert any(tag.startswith("events") for tag in got["_text"])
    with open(run / "eval.csv", "ab") as f:
        f.write(b",1.0,100,4.5,eval\n")  # the line completed
    tb.close()
    assert [s[:2] for s in _scalars(tmp_path / "tb")["eval/accuracy"]] == [(10, 0.5), (20, 0.75)]


@needs_root
def test_a_run_writes_scalars_while_it_goes(tmp_path, clean_host):
    import yaml

    sc = yaml.safe_load((REPO / "scenarios" / "smoke.yaml").read_text())
    sc.update(runtime="netns", stop={"seconds": 30})
    path = write_scenario(tmp_path, sc)
    logdir = tmp_path / "tb"
    p = start_up(path, tmp_path / "run", "-q", "--tensorboard", str(logdir), stderr=subprocess.PIPE)
    seen_during = []
    try:
        while p.poll() is None:
            time.sleep(2)
            if logdir.exists():
                seen_during = _scalars(logdir).get("eval/accuracy", [])
                if len(seen_during) >= 2:
                    break
        assert p.poll() is None and len(seen_during) >= 2, "no accuracy in TensorBoard while the run went"
    finally:
        out, err = p.communicate(timeout=200)
    assert p.returncode == 0, out[-2000:] + err[-2000:]
    final = _scalars(logdir)
    evals = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(final["eval/accuracy"]) >= len(seen_during) and max(v for _, v, _ in final["eval/accuracy"]) == \
        pytest.approx(evals["best_accuracy"], abs=1e-6)
    assert {"rate_bps/w0/up", "rate_bps/ps/down", "train/loss/w0"} <= set(final)
