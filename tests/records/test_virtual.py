"""Records of a dilated run in the world's units (records.virtual): every table's times / k,
rates x k, counts as measured; on disk and through the control channel alike."""

import csv

import pytest

from testbed.records import metrics
from testbed.records.columns import LINK_RATE_COLUMNS
from testbed.records.virtual import COLUMN_KINDS, to_world, world_row


def test_a_row_is_turned_into_the_worlds_units():
    row = {"time": 8.0, "node": "w0", "step": 3, "compute_seconds": 0.4, "comm_seconds": 1.2, "bytes_sent": 1000}
    assert world_row("steps.csv", row, 4) == {"time": 2.0, "node": "w0", "step": 3, "compute_seconds": 0.1,
                                              "comm_seconds": 0.3, "bytes_sent": 1000}
    shaped = world_row("shaping.csv", {"time": 2.0, "rate_bps": 2.5e6, "bytes": 10, "drops": 1}, 4)
    assert shaped == {"time": 0.5, "rate_bps": 1e7, "bytes": 10, "drops": 1}
    res = world_row("resources.csv", {"time": 4.0, "cpu_seconds": 3.0, "cpu_quota": 0.125, "wait_seconds": 0.4,
                                      "throttled_seconds": 0.8, "nr_periods": 40}, 4)
    assert res == {"time": 1.0, "cpu_seconds": 3.0, "cpu_quota": 0.5, "wait_seconds": 0.1,
                   "throttled_seconds": 0.2, "nr_periods": 40}  # CPU time is the world's already
    assert world_row("rounds.csv", {"report_seconds": "4 8.5", "open_seconds": 10.0}, 2) == \
        {"report_seconds": "2 4.25", "open_seconds": 5.0}
    assert world_row("steps.csv", row, 1) is row


def test_what_is_not_a_number_stays_as_it_is():
    assert to_world(None, "time", 4) is None
    assert to_world("", "time", 4) == ""
    assert to_world(True, "rate", 4) is True


def test_every_table_that_has_a_time_is_converted():
    tables = dict(metrics.TABLES, **{"link_rates.csv": LINK_RATE_COLUMNS})
    for name, columns in tables.items():
        assert "time" not in columns or COLUMN_KINDS.get(name, {}).get("time") == "time", name
        assert set(COLUMN_KINDS.get(name, {})) <= set(columns), name


def test_a_table_of_a_dilated_run_is_written_in_the_worlds_seconds(tmp_path):
    metrics.init_tables(tmp_path)
    log = metrics.open_table(tmp_path, "events.csv", dilation=2.0)
    log.write(time=10.0, scheduled_time=9.0, target="w0", action="kill", detail="x")
    log.close()
    rows = list(csv.DictReader(open(tmp_path / "events.csv")))
    assert (float(rows[0]["time"]), float(rows[0]["scheduled_time"])) == (5.0, 4.5)


def test_a_nodes_remote_table_sends_the_worlds_units():
    from testbed.node.channel import RemoteTable

    sent = []
    table = object.__new__(RemoteTable)
    table.name, table.columns, table.dilation, table._topic = "stream.csv", metrics.TABLES["stream.csv"], 4.0, b"x"

    class Sock:
        def send_multipart(self, frames):
            sent.append(frames[1])

    table._sock = Sock()
    table.write(time=8.0, node="w0", step=1, wait_seconds=2.0, batch_size=32, buffered=5)
    assert sent == [b"2,w0,1,0.5,32,5\n"]


@pytest.mark.parametrize("k", [1.0, 3.0])
def test_a_buffers_rate_is_the_devices_nominal_one_already_the_worlds(k):
    assert world_row("buffer.csv", {"time": 3.0, "rate": 10.0}, k)["rate"] == 10.0
