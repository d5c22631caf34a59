"""Every file validation reads is bounded in time and memory: availability traces (FedScale's
pickle, FLASH's JSON, the CSV), link and latency traces and their gzip, the datasets' gzip files.
Each refusal is one line naming the file. A read that could hang (a loop that never ends, a FIFO)
runs in a child process with a time limit, so that a hang fails the test instead of the suite."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys

import pytest

from testbed.plan import parse_scenario
from testbed.plan.availability import MAX_INTERVALS, model_offline, plan_offline
from testbed.scenario.checks import ScenarioError
from testbed.scenario.document import Availability

from helpers import edgebed_cmd, write_scenario

HANG = 120  # seconds: far above what any of these reads takes; only a loop that never ends gets there


def _lines(data) -> list[str]:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(data)
    return e.value.lines


def _trace_line(path, fmt: str, workers: int = 1, seconds: float = 600, **entry) -> str:
    line, = _lines({"workers": [{"count": workers}], "stop": {"seconds": seconds},
                    "availability": [{"trace": str(path), "trace_format": fmt, **entry}]})
    assert line.startswith(f"availability[0].trace: {path}: ") and len(line) < 300, line
    return line


def _validate(tmp_path, availability: dict, seconds: float = 600) -> subprocess.CompletedProcess:
    """`edgebed validate` on a one-worker scenario, in a child process that may not outlive HANG."""
    path = write_scenario(tmp_path, {"workers": [{"count": 1}], "stop": {"seconds": seconds},
                                     "availability": [availability]})
    try:
        return subprocess.run(edgebed_cmd() + ["validate", str(path)], capture_output=True, text=True,
                              timeout=HANG)
    except subprocess.TimeoutExpired:
        pytest.fail(f"edgebed validate still ran after {HANG} s")


def _pickle(tmp_path, data, name: str = "client_behave_trace") -> str:
    f = tmp_path / name
    f.write_bytes(data if isinstance(data, bytes) else pickle.dumps(data))
    return str(f)


def _bounded(code: str) -> str:
    """What `code` (Python, in a child process that may not outlive HANG) prints last on stderr."""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still reading after {HANG} s")
    return (done.stderr.strip().splitlines() or [""])[-1]


# --- gzip and plain pickles, as every reader takes them -----------------------------------------


def test_gzip_members_past_the_first_are_read_in_time_proportional_to_their_bytes(tmp_path):
    """16 MiB of empty gzip members: gzip.decompress copies the rest of the file at each of its
    838,860 members (about 10 minutes); read in chunks, they take seconds. A dataset's IDX file."""
    from testbed.data.textfile import gunzip_capped

    member = gzip.compress(b"", mtime=0)
    assert gunzip_capped(gzip.compress(b"1\n") + member * 1000 + b"\0\0" + gzip.compress(b"2\n"), 4) == b"1\n2\n"
    with pytest.raises(ValueError, match="larger than"):
        gunzip_capped(gzip.compress(b"1\n") + gzip.compress(b"2\n"), 3)
    (tmp_path / "members.gz").write_bytes(member * ((16 << 20) // len(member)))
    last = _bounded(f"from testbed.data.formats import read_idx_file; read_idx_file({str(tmp_path)!r} + "
                    "'/members.gz')")
    assert last.endswith("members.gz: truncated header (0 bytes)"), last


def test_the_estimate_is_never_below_what_loading_takes():
    import tracemalloc

    from testbed.data.plain_pickle import load_plain, memory_needed

    shapes = [{c: {"active": list(range(c % 40)), "inactive": [1.5] * 3, "finish_time": 7, "model": "Pixel é"}
               for c in range(300)}, [[] for _ in range(3000)], [{} for _ in range(3000)],
              [{1: 2} for _ in range(3000)], [(i, i) for i in range(3000)], [str(i) * 3 for i in range(3000)],
              [10 ** 30 + i for i in range(3000)], ["😀" + "a" * i for i in range(300)], [None, True] * 2000]
    for data in shapes:
        for protocol in (0, 2, 4, 5):
            raw = pickle.dumps(data, protocol=protocol)
            tracemalloc.start()
            assert load_plain(raw, 1 << 30) == data
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert memory_needed(raw, 1 << 40) >= peak, (protocol, repr(data)[:40])


# --- datasets' gzip files -----------------------------------------------------------------------


def test_a_dataset_s_gzip_bomb_stops_at_the_largest_real_file(tmp_path):
    """300 MiB of zeros in 300 kB: refused once past 256 MiB (full MNIST's pickle unpacks to
    220,080,342 bytes, the largest file a reader takes). A FIFO is refused unread."""
    from testbed.data.formats import DatasetError, read_idx_file

    bomb = tmp_path / "train-images-idx3-ubyte.gz"
    bomb.write_bytes(gzip.compress(b"\0" * (300 << 20), compresslevel=1))
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte.gz: too large \(larger than 256 MiB "
                                           r"uncompressed\)$"):
        read_idx_file(bomb)
    os.mkfifo(tmp_path / "fifo")
    last = _bounded(f"from testbed.data.formats import read_idx_file; read_idx_file({str(tmp_path)!r} + '/fifo')")
    assert last.endswith("fifo: not a regular file"), last


# --- FedScale's pickle ---------------------------------------------------------------------------


def test_validate_refuses_the_68_byte_pickle_that_looped_forever_in_one_line_naming_it(tmp_path):
    """No interval and finish_time 1e-300: the repeat loop ran 3.6e303 times, appending nothing.
    FedScale itself cannot read a client without intervals (is_active takes an index modulo 0)."""
    path = _pickle(tmp_path, {1: {"active": [], "inactive": [], "finish_time": 1e-300}})
    assert os.path.getsize(path) == 68
    refused = _validate(tmp_path, {"trace": "client_behave_trace", "trace_format": "fedscale"})
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        f"error: availability[0].trace: {path}: client 1: no active and inactive times"], refused.stderr[-2000:]


@pytest.mark.parametrize("client, why", [
    ({"active": [0], "inactive": [5e-311], "finish_time": 1e-310}, "more than 100000 online intervals"),  # 600/T: inf
    ({"active": [0], "inactive": [1e-300], "finish_time": 2e-300}, "more than 100000 online intervals"),
    ({"active": [10 ** 400], "inactive": [1], "finish_time": 5}, "not active/inactive lists of times"),
    ({"active": [0], "inactive": [1], "finish_time": 10 ** 400}, "not active/inactive lists of times"),
])
def test_numbers_past_a_float_are_one_line_not_an_overflow(tmp_path, client, why):
    assert why in _trace_line(_pickle(tmp_path, {1: client}), "fedscale")


def test_a_tiny_finish_time_always_online_stays_online_past_the_interval_cap(tmp_path):
    """Online the whole of each 1 ms period: online for the whole run (a repeat loop cut at the
    interval cap would take it offline from 100 s on), and so for a period too small to count."""
    for period in (0.001, 5e-324):  # 5e-324: the run is an infinite number of periods (an OverflowError)
        path = _pickle(tmp_path, {1: {"active": [0], "inactive": [1], "finish_time": period}})
        sc = parse_scenario({"workers": [{"count": 1}], "stop": {"seconds": 600},
                             "availability": [{"trace": path, "trace_format": "fedscale"}]})
        assert plan_offline(sc) == {}


def test_the_intervals_of_all_the_target_s_clients_are_capped_together(tmp_path):
    """Each of 3 clients online 40,000 times in the run: 120,000 in all, refused while reading
    (each alone is under the cap), not drawn in full and counted after."""
    clients = {c: {"active": [0], "inactive": [0.5], "finish_time": 1} for c in (1, 2, 3)}
    line = _trace_line(_pickle(tmp_path, clients), "fedscale", workers=3, seconds=40_000)
    assert f"more than {MAX_INTERVALS} online intervals in 40000 trace seconds" in line


@pytest.mark.parametrize("raw, why", [
    (b"\x80\x04]r\x00\x00\x00\x10.", "would take more than 384 MiB once loaded"),  # memo slot 2^28: 4 GiB
    (b"\x80\x04](" + b"\x8f" * 1000 + b"e.", "holds objects other than plain dicts, lists and numbers"),  # sets
    (b"\x80\x04\x95\xff\xff\xff\x00\x00\x00\x00\x00}.", "truncated"),  # a frame past the end
    (b"\x80\x04X\xff\xff\xff\x7fab.", "truncated"),  # a string past the end
])
def test_a_pickle_that_would_not_fit_in_memory_is_refused_before_loading(tmp_path, raw, why):
    assert why in _trace_line(_pickle(tmp_path, raw), "fedscale")


def test_a_pickle_is_refused_by_the_memory_its_opcodes_need(tmp_path, monkeypatch):
    """Empty dicts, one byte each and 64 bytes once loaded: refused by the estimate, not loaded."""
    import testbed.plan.availability as availability

    monkeypatch.setattr(availability, "MAX_PICKLE_MEMORY", 1 << 20)
    raw = b"\x80\x04}(K\x01}K\x02](" + b"}" * 10_000 + b"eu."  # client 1 and 10,000 empty dicts
    assert "would take more than 1 MiB once loaded" in _trace_line(_pickle(tmp_path, raw), "fedscale")
    fits = pickle.dumps({1: {"active": [0], "inactive": [5], "finish_time": 10}, 2: [{}] * 1000})
    parse_scenario({"workers": [{"count": 1}], "availability": [{"trace": _pickle(tmp_path, fits),
                                                                 "trace_format": "fedscale"}]})


def test_a_pickle_or_json_trace_is_at_most_16_mib_as_the_readme_says(tmp_path):
    for name, fmt in (("client_behave_trace", "fedscale"), ("state_traces.json", "flash")):
        f = tmp_path / name
        with open(f, "wb") as out:
            out.truncate((16 << 20) + 1)  # sparse: nothing is written
        assert _trace_line(f, fmt).endswith(": larger than 16 MiB")


def test_a_fifo_named_as_a_trace_is_refused_without_blocking(tmp_path):
    """A FIFO's size is 0, and open() waits for a writer that never comes."""
    for name, fmt in (("client_behave_trace", "fedscale"), ("state_traces.json", "flash"), ("a.csv", "csv")):
        os.mkfifo(tmp_path / name)
        done = _validate(tmp_path, {"trace": name, "trace_format": fmt})
        assert done.returncode == 2 and done.stderr.strip().endswith(f"{name}: not a regular file"), done.stderr


# --- FLASH's JSON -------------------------------------------------------------------------------


def _flash(tmp_path, text: str) -> str:
    f = tmp_path / "state_traces.json"
    f.write_text(text)
    return str(f)


def test_deep_flash_json_is_one_line_not_a_recursion_error(tmp_path):
    path = _flash(tmp_path, "[" * 100_000 + "]" * 100_000)
    assert _trace_line(path, "flash").endswith(": nested deeper than 8 levels")


def test_flash_json_is_refused_by_its_count_of_values_before_it_is_parsed(tmp_path):
    """A million empty lists (3 MB, 70 MB parsed): FLASH's sample needs about 8 values a user."""
    user = {"0": {"guid": "g", "model": "x", "messages": "2020-01-02 00:00:00\twifi\n"}}
    path = _flash(tmp_path, json.dumps(user)[:-1] + ', "pad": [' + "[]," * 1_000_000 + "[]]}")
    assert _trace_line(path, "flash", first_client=0).endswith(": more than 262144 JSON values")
    for bad, why in (('{"0": NaN}', "not JSON"), ('{"0": 1e400}', "not JSON"), ('{"0": ', "not JSON (line 1)")):
        assert _trace_line(_flash(tmp_path, bad), "flash").endswith(why)


def test_flash_users_share_the_interval_cap(tmp_path):
    """Users ready 1 s in every 2 s, over 40,000 s: 20,000 each; three fit, six do not (a cap per
    user would let 10,000 workers hold a billion intervals)."""
    lines = ["2020-01-02 00:00:00\twifi", "2020-01-02 00:00:00\tbattery_charged_on",
             "2020-01-02 00:00:00\tscreen_lock", "2020-01-02 00:00:01\tscreen_unlock", "2020-01-02 00:00:02\tscreen_on"]
    users = {str(u): {"guid": "g", "model": "x", "messages": "\n".join(lines)} for u in range(6)}
    path = _flash(tmp_path, json.dumps(users))
    sc = parse_scenario({"workers": [{"count": 3}], "stop": {"seconds": 40_000},
                         "availability": [{"trace": path, "trace_format": "flash", "first_client": 0}]})
    assert [len(v) for v in plan_offline(sc).values()] == [20_000] * 3
    line = _trace_line(path, "flash", workers=6, seconds=40_000, first_client=0)
    assert f"more than {MAX_INTERVALS} online intervals in 40000 trace seconds" in line


# --- the model ----------------------------------------------------------------------------------


def test_the_model_draws_at_most_its_limit():
    """1 s means over 366 days: 31.6 million intervals a worker, hours and gigabytes for a few
    workers if drawn in full before the total is counted."""
    entry = Availability(online="1s", offline="1s")
    assert len(model_offline(entry, "w0", 1, 366 * 86400.0, limit=10)) == 10
    line, = _lines({"workers": [{"count": 50}], "stop": {"seconds": 366 * 86400},
                    "availability": [{"online": "1s", "offline": "1s"}]})
    assert line == f"availability: more than {MAX_INTERVALS} offline intervals in 3.16224e+07 s (longer mean " \
                   "durations, or a shorter run)"


# --- link and latency traces -------------------------------------------------------------------


def test_a_gzipped_trace_that_is_a_fifo_or_too_large_compressed_is_refused_unread(tmp_path):
    os.mkfifo(tmp_path / "fifo.up.gz")
    last = _bounded(f"from testbed.scenario.traces import read_link_trace; read_link_trace({str(tmp_path)!r} + "
                    "'/fifo.up.gz')")
    assert last.endswith("fifo.up.gz: not a regular file"), last
    with open(tmp_path / "big.up.gz", "wb") as f:
        f.truncate((16 << 20) + 1)
    from testbed.scenario.traces import read_link_trace

    with pytest.raises(ValueError, match=r"big.up.gz: larger than 16 MiB$"):
        read_link_trace(tmp_path / "big.up.gz")


def test_a_replay_has_at_most_max_ticks(tmp_path, monkeypatch):
    """One Mahimahi line, 604800000 (14 bytes), at 10 ms: 60 million ticks (7 GB of rows)."""
    import testbed.scenario.traces as traces
    from testbed.scenario.latency_traces import read_trace_delays

    (tmp_path / "a.up").write_text("100000\n")  # 100 s
    (tmp_path / "a.csv").write_text("time,latency\n0,10ms\n50,20ms\n")  # 100 s: the mean spacing added
    monkeypatch.setattr(traces, "MAX_TICKS", 5000)
    for path, read in ((tmp_path / "a.up", traces.trace_rates), (tmp_path / "a.csv", read_trace_delays)):
        with pytest.raises(ValueError, match=r"a\.(up|csv): the trace lasts 100 s, more than 5000 ticks of 0\.01 s"):
            read(path, 0.01)
        assert len(read(path, 0.1)) == 1000
    monkeypatch.undo()
    assert traces.MAX_TICKS == 12_096_000  # every trace at the default resolution
    (tmp_path / "week.up").write_text("604800000\n")
    with pytest.raises(ValueError, match="more than 12096000 ticks of 0.01 s"):
        traces.trace_rates(tmp_path / "week.up", 0.01)
