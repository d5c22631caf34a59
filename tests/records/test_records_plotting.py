"""Reader side of the run records, and the figures built from them, on synthetic runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.records.plotting import PLOT_FILES, plot_compare, plot_run
from testbed.records.reader import (
    EVAL_COLUMNS,
    EVENT_COLUMNS,
    STEP_COLUMNS,
    TRAFFIC_COLUMNS,
    RunNotFound,
    load_run,
    traffic_rates,
)

from helpers import DURATION, STEP_BYTES, WORKER_SPEED, _write_csv, make_run

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- records ------------------------------------------------------------------------------


def test_load_realistic_run(tmp_path: Path) -> None:
    rec = load_run(make_run(tmp_path))
    assert list(rec.steps.columns) == STEP_COLUMNS
    assert list(rec.evals.columns) == EVAL_COLUMNS
    assert list(rec.traffic.columns) == TRAFFIC_COLUMNS
    assert list(rec.events.columns) == EVENT_COLUMNS

    s = rec.steps
    assert len(s) == sum(int(DURATION * v) for v in WORKER_SPEED.values())
    for col in ("step", "batch_size", "bytes_sent", "bytes_received", "model_version"):
        assert s[col].dtype == "int64", col
    for col in ("time", "loss", "lr", "compute_seconds", "comm_seconds"):
        assert s[col].dtype == "float64", col
    assert pd.api.types.is_string_dtype(s["node"])
    assert s["time"].is_monotonic_increasing
    assert s.groupby("node")["step"].max().to_dict() == {"w0": 80, "w1": 40, "w2": 10}
    assert int(s["bytes_sent"].sum()) == len(s) * STEP_BYTES

    assert rec.evals["step"].dtype == "int64" and rec.evals["samples"].dtype == "int64"
    assert rec.evals["accuracy"].between(0, 1).all()

    t = rec.traffic
    assert t["delta_bytes"].dtype == "int64" and t["bytes"].dtype == "int64"
    ps_in = t[(t["node"] == "ps") & (t["direction"] == "down")]
    assert int(ps_in["delta_bytes"].sum()) == 125_000 * 3 * DURATION == rec.summary["ps_ingress_bytes"]
    assert int(ps_in["bytes"].iloc[-1]) == int(ps_in["delta_bytes"].sum())

    assert rec.events.loc[0, "action"] == "set_link" and rec.events.loc[0, "time"] == pytest.approx(20.02)
    assert rec.name == "run-a"  # run_id equals the directory name here
    assert rec.ps_nodes == ["ps"]
    assert rec.node_roles["w2"] == "worker"
    assert rec.target_accuracy == pytest.approx(0.9)
    assert rec.summary["status"] == "completed"


def test_traffic_rates_known_numbers() -> None:
    traffic = pd.DataFrame(
        {
            "time": [0.0, 1.0, 3.0, 0.0, 1.0, 2.0],
            "node": ["ps", "ps", "ps", "w0", "w0", "w0"],
            "link": ["access"] * 6,
            "direction": ["down", "down", "down", "up", "up", "up"],
            "bytes": [0, 1_250_000, 3_750_000, 100, 200, 50],
            "delta_bytes": [0, 1_250_000, 2_500_000, 100, 100, -150],
            "packets": [0, 1000, 3000, 1, 2, 3],
        }
    )
    r = traffic_rates(traffic)
    ps = r[r["node"] == "ps"]["mbps"].tolist()
    assert math.isnan(ps[0])  # first sample: no interval yet
    assert ps[1] == pytest.approx(10.0)  # 1,250,000 B in 1 s = 10 Mbit/s
    assert ps[2] == pytest.approx(10.0)  # 2,500,000 B in 2 s
    w0 = r[r["node"] == "w0"]["mbps"].tolist()
    assert w0[1] == pytest.approx(100 * 8 / 1e6)
    assert math.isnan(w0[2])  # counter went backwards: no rate
    assert traffic_rates(traffic.iloc[:0]).empty


def test_traffic_rates_on_loaded_run(tmp_path: Path) -> None:
    r = traffic_rates(load_run(make_run(tmp_path)).traffic)
    ps_in = r[(r["node"] == "ps") & (r["direction"] == "down")]["mbps"].dropna()
    assert len(ps_in) == DURATION - 1
    assert ps_in.to_numpy() == pytest.approx(3.0)


def test_header_only_run(tmp_path: Path) -> None:
    run = tmp_path / "crashed"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    tables = [("steps.csv", STEP_COLUMNS), ("eval.csv", EVAL_COLUMNS), ("traffic.csv", TRAFFIC_COLUMNS)]
    for name, cols in tables:
        _write_csv(run / name, cols, [])
    rec = load_run(run)
    for df, cols in [(rec.steps, STEP_COLUMNS), (rec.evals, EVAL_COLUMNS), (rec.traffic, TRAFFIC_COLUMNS)]:
        assert df.empty and list(df.columns) == cols
    assert rec.steps["step"].dtype == "int64" and rec.steps["time"].dtype == "float64"
    assert rec.events.empty and list(rec.events.columns) == EVENT_COLUMNS  # events.csv absent
    assert rec.summary == {} and rec.scenario == {} and rec.target_accuracy is None
    assert traffic_rates(rec.traffic).empty
    assert plot_run(run) == []
    assert not (run / "plots").exists()


def test_truncated_and_malformed_lines_are_skipped(tmp_path: Path) -> None:
    run = tmp_path / "torn"
    run.mkdir()
    header = ",".join(STEP_COLUMNS)
    good = [
        "1.0,w0,1,2.30,32,0.05,100,100,0.8,0.2,0",
        "2.0,w0,2,nan,32,0.05,100,100,0.8,0.2,1",  # diverged loss is data, not damage
        "2.5,w1,1,2.20,32,0.05,100,100,0.8,0.2,",  # empty int field
        "2.7,w1,x,2.20,32,0.05,100,100,0.8,0.2,0",  # garbage in an int column
        "2.9,w1,1,2.20,32",  # too few fields
        "3.0,w1,1,2.10,32,0.05,100,100,0.8,0.2,1",
    ]
    # The last line lost its tail in a crash: "...,12" of what would have been "...,125\n".
    torn = "4.0,w0,3,2.0,32,0.05,100,100,0.8,0.2,12"
    (run / "steps.csv").write_text(header + "\n" + "\n".join(good) + "\n" + torn)
    (run / "eval.csv").write_text(",".join(EVAL_COLUMNS) + "\n5.0,3,3,0.5,1.9,1000\n6.0,4,4,0.")
    (run / "summary.json").write_text('{"final_accuracy": 0.5, "sta')  # half-written
    rec = load_run(run)
    assert rec.steps["time"].tolist() == [1.0, 2.0, 3.0]
    assert math.isnan(rec.steps["loss"].iloc[1])
    assert rec.steps["model_version"].dtype == "int64"
    assert rec.evals["time"].tolist() == [5.0]
    assert rec.summary == {}
    assert rec.meta == {}  # no meta.json: steps.csv alone makes it a run dir
    assert rec.name == "torn"
    assert {p.name for p in plot_run(run)} == {"accuracy.png", "loss.png", "steps.png"}


@pytest.mark.parametrize(
    "body, expected_times",
    [
        (b"1.0,,w0,kill,\n2.0,,w1,kill,\n", [1.0, 2.0]),
        (b"1.0,,w0,kill,\r\n2.0,,w1,kill,\r\n", [1.0, 2.0]),  # CRLF
        (b"1.0,,w0,kill,\n2.0,,w1,\n", [1.0]),  # short row: no action
        (b"1.0,,w0,kill,x,y\n2.0,,w1,kill,\n", [2.0]),  # too many fields
        (b'0.5,,w0,kill,ok\n1.0,,w0,kill,"never closed\n2.0,,w1,kill,\n', [0.5, 1.0]),  # fallback parser
        (b"1.0,,w0,kill,\n\x00\x00\x00\x00", [1.0]),  # preallocated tail
        (b"\xff\xfe garbage \x80\n1.0,,w0,kill,\n", [1.0]),  # not UTF-8
    ],
)
def test_damaged_events_never_raise(tmp_path: Path, body: bytes, expected_times: list[float]) -> None:
    run = make_run(tmp_path, steps=False, evals=False, traffic=False, events=False)
    header = "\ufeff" + ",".join(EVENT_COLUMNS) + "\n"  # with a BOM, as some editors save
    (run / "events.csv").write_bytes(header.encode() + body)
    ev = load_run(run).events
    assert list(ev.columns) == EVENT_COLUMNS
    assert ev["time"].tolist() == expected_times


def test_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(RunNotFound, match="not an edgebed run directory"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path / "does-not-exist")


# --- plotting -----------------------------------------------------------------------------


def _assert_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 10_000, path
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_run_writes_all_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    written = plot_run(run)
    # streaming.png needs a streaming run's buffer.csv, wan.png WAN links, links.png worker-to-worker
    # traffic (peers.csv), link_check.png a --verify-links run, link_rates.png a traced link,
    # fidelity.png quotas in resources.csv, devices.png device profiles, fleet.png rounds or
    # availability, energy.png a device's power: this run has none of them
    assert [p.name for p in written] == [f for f in PLOT_FILES if f not in ("streaming.png", "wan.png", "links.png",
                                                                            "link_check.png", "link_rates.png",
                                                                            "fidelity.png", "devices.png", "fleet.png",
                                                                            "energy.png")]
    for p in written:
        assert p.parent == run / "plots"
        _assert_png(p)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_plot_run_skips_missing_tables(tmp_path: Path) -> None:
    run = make_run(tmp_path, evals=False, traffic=False, events=False, target=None)
    out_dir = tmp_path / "figs"
    written = plot_run(run, out_dir)
    assert [p.name for p in written] == ["loss.png", "steps.png", "topology.png"]  # topology: from meta.json
    for p in written:
        assert p.parent == out_dir
        _assert_png(p)
    assert not (run / "plots").exists()


def test_plot_compare_and_script(tmp_path: Path) -> None:
    a = make_run(tmp_path, "run-a")
    b = make_run(tmp_path, "run-b", target=None)
    c = make_run(tmp_path, "run-c", evals=False)
    path = plot_compare([a, b, c], tmp_path / "cmp" / "compare_accuracy.png")
    assert path is not None
    _assert_png(path)
    assert plot_compare([c], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()

    result = subprocess.run(
        [sys.executable, str(REPO / "analysis" / "run_overview.py"), str(a), str(b)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    _assert_png(tmp_path / "compare_accuracy.png")
    _assert_png(tmp_path / "compare_progress.png")
    _assert_png(b / "plots" / "traffic.png")


def test_streaming_figure_from_buffer_records(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "buffer.csv").write_text("time,node,arrived,trained,dropped,buffered,buffered_bytes\n"
                                    + "".join(f"{t},w0,{20 * t},{20 * t - 5},0,5,15680\n" for t in range(1, 20)))
    (run / "stream.csv").write_text("time,node,step,wait_seconds,batch_size,buffered\n"
                                    + "".join(f"{t},w0,{t},0.2,20,5\n" for t in range(1, 20)))
    written = plot_run(run)
    assert "streaming.png" in [p.name for p in written]
    _assert_png(run / "plots" / "streaming.png")


def test_links_figure_from_peers_csv(tmp_path: Path) -> None:
    """A decentralized run's peers.csv becomes links.png; a run without worker-to-worker rows has none."""
    from testbed.records.columns import PEER_COLUMNS
    from testbed.records.plotting import plot_run

    run = make_run(tmp_path)
    workers = list(WORKER_SPEED)
    lines = [",".join(PEER_COLUMNS)]
    for step in range(1, 30):
        for a in workers[:3]:
            for b in workers[:3]:
                if a != b:
                    lines.append(f"{step * 0.5},{a},{b},{step},grad,{8000 if 'w2' in (a, b) else 80000},"
                                 f"{1000 if 'w2' in (a, b) else 10000},0.01")
    (run / "peers.csv").write_text("\n".join(lines) + "\n")
    written = [p.name for p in plot_run(run)]
    assert "links.png" in written
    assert (run / "plots" / "links.png").stat().st_size > 10_000
    (run / "peers.csv").write_text(",".join(PEER_COLUMNS) + "\n")
    assert "links.png" not in [p.name for p in plot_run(run, tmp_path / "again")]


def test_link_check_figure_and_the_accuracy_title_say_which_link_was_off(tmp_path: Path) -> None:
    from testbed.records.plotting import accuracy_figure, style_for
    from testbed.records.reader import load_run
    from testbed.run import verify

    run = make_run(tmp_path)
    rows = [{"node": "w0", "direction": "up", "configured_bps": 10e6, "measured_bps": 9.98e6, "ratio": 0.998,
             "expected_rtt_s": None, "measured_rtt_s": None, "ok": True, "note": ""},
            {"node": "w1", "direction": "down", "configured_bps": 10e6, "measured_bps": 7.0e6, "ratio": 0.7,
             "expected_rtt_s": None, "measured_rtt_s": None, "ok": False, "note": ""},
            {"node": "w1", "direction": "rtt", "configured_bps": None, "measured_bps": None, "ratio": 1.02,
             "expected_rtt_s": 0.04, "measured_rtt_s": 0.0408, "ok": True, "note": ""}]
    meta = json.loads((run / "meta.json").read_text())
    meta["link_check"] = verify.summary(rows, 0.10, 5.0)
    (run / "meta.json").write_text(json.dumps(meta))
    assert meta["link_check"]["off"] == ["w1 down"] and meta["link_check"]["all_ok"] is False
    assert verify.warnings_for(rows) == ["LINK CHECK: w1 down: configured 10mbit, measured 7.00 Mbit/s at the wire "
                                         "(70.0%)  [OFF by more than 10%]"]
    written = plot_run(run)
    assert "link_check.png" in [p.name for p in written]
    _assert_png(run / "plots" / "link_check.png")
    rec = load_run(run)
    assert "1 OFF: w1 down" in accuracy_figure(rec, style_for(rec))._suptitle.get_text()


def test_a_programs_reported_rows_read_back_without_the_counts_it_does_not_have(tmp_path: Path) -> None:
    """A command workload's edgebed.report writes eval and steps rows without a built-in's counts
    (updates received, samples, bytes): they read back with those empty; garbage in them is
    still damage, and a complete table keeps its int64 columns."""
    run = tmp_path / "reported"
    run.mkdir()
    (run / "eval.csv").write_text(",".join(EVAL_COLUMNS) + "\n1.0,0,,0.1,2.3,\n2.0,1,,0.9,0.4,\n3.0,2,x,0.95,0.2,\n")
    (run / "steps.csv").write_text(",".join(STEP_COLUMNS) + "\n1.5,w0,1,0.5,,,,,,,1,\n")
    rec = load_run(run)
    assert rec.evals["step"].tolist() == [0, 1] and rec.evals["accuracy"].tolist() == [0.1, 0.9]
    assert rec.evals["samples"].isna().all() and rec.evals["updates_received"].isna().all()
    assert rec.steps["loss"].tolist() == [0.5] and rec.steps["batch_size"].isna().all()
    assert {p.name for p in plot_run(run)} >= {"accuracy.png", "loss.png"}


def test_eval_rows_say_which_node_wrote_them_and_older_runs_still_read(tmp_path: Path) -> None:
    """eval.csv's last column names the node that wrote each row; a run recorded before it had
    that column reads back whole, its node empty."""
    from testbed.records import metrics

    new, old = tmp_path / "new", tmp_path / "old"
    for run in (new, old):
        run.mkdir()
        (run / "steps.csv").touch()
    table = metrics.open_table(new, "eval.csv")
    (new / "eval.csv").write_text(",".join(EVAL_COLUMNS) + "\n")
    table.write(time=1.0, node="eval", step=3, accuracy=0.5, loss=1.0)
    table.close()
    (old / "eval.csv").write_text("time,step,updates_received,accuracy,loss,samples,evaluated_at\n"
                                  "1.0,3,3,0.5,1.0,100,1.2\n2.0,4,4,0.6,0.9,100,2.1\n")
    assert EVAL_COLUMNS[-1] == "node" and load_run(new).evals["node"].tolist() == ["eval"]
    evals = load_run(old).evals
    assert evals["accuracy"].tolist() == [0.5, 0.6] and evals["node"].tolist() == ["", ""]
