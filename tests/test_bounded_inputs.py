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
from conftest import edgebed_cmd, write_scenario

from testbed.plan import parse_scenario
from testbed.plan.availability import MAX_INTERVALS, model_offline, plan_offline
from testbed.scenario.checks import ScenarioError
from testbed.scenario.models import Availability

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
