"""Records over the control network: a node's rows reach the runner's collector, which is the
only writer of the tables and drops what is not a row of one."""
import socket
import time

import zmq

from testbed.node import channel
from testbed.node.roles.common import RoleConfig
from testbed.records import metrics
from testbed.records.columns import STEP_COLUMNS
from testbed.run.collector import RecordCollector


def _cfg(run_dir, records=""):
    return RoleConfig(node="w0", role="worker", rank=0, run_dir=str(run_dir), t0=time.time(), scenario={},
                      ps_address="127.0.0.1", threads=1, records=records)


def test_rows_travel_to_the_collector_and_bad_ones_are_dropped(tmp_path):
    metrics.init_tables(tmp_path)
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    collector = RecordCollector(None, "127.0.0.1", port, tmp_path)
    try:
        steps = channel.open_table(_cfg(tmp_path, f"tcp://127.0.0.1:{port}"), "steps.csv")
        assert isinstance(steps, channel.RemoteTable)
        for k in range(3):
            steps.write(time=float(k), node="w0", step=k, loss=0.5, note_not_a_column="ignored")
        ctx = zmq.Context()
        rogue = ctx.socket(zmq.PUSH)
        rogue.connect(f"tcp://127.0.0.1:{port}")
        for frames in ([b"steps.csv", b"1,2\n"], [b"../etc/passwd", b"x\n"], [b"steps.csv"],
                       [b"steps.csv", metrics.format_row(STEP_COLUMNS, {"node": "w9"}) * 2],
                       [b"steps.csv", b"\xff" * 10 + b"\n"]):
            rogue.send_multipart(frames)
        rogue.send_multipart([b"steps.csv", b"x" * (100 * 1024)])  # over the size limit: its sender is cut off
        deadline = time.monotonic() + 5
        while collector.rows + collector.dropped < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        rogue.close(linger=0)
        ctx.term()
        channel.flush()
        collector.drain(quiet=0.3)
    finally:
        collector.close()
    lines = (tmp_path / "steps.csv").read_text().splitlines()
    assert lines[0] == ",".join(STEP_COLUMNS)
    assert [line.split(",")[:3] for line in lines[1:]] == [["0", "w0", "0"], ["1", "w0", "1"], ["2", "w0", "2"]]
    assert collector.rows == 3 and collector.dropped == 5


def test_without_a_control_network_a_node_writes_the_table_itself(tmp_path):
    metrics.init_tables(tmp_path)
    table = channel.open_table(_cfg(tmp_path), "eval.csv")
    assert isinstance(table, metrics.CsvLog)
    table.write(time=1.0, step=5, accuracy=0.5)
    table.close()
    assert (tmp_path / "eval.csv").read_text().splitlines()[1].startswith("1,5,")
