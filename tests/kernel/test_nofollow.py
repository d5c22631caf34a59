"""The runner never follows a link a node could have planted: in the run dir (its tables, reports,
meta, state), at a namespace's name in /run/netns (the teardown's process sweep and unmount)."""

import ctypes
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from testbed.kernel import files
from testbed.kernel.netlink import NETNS_DIR, remove_netns
from testbed.records import metrics
from testbed.runtimes import state

from helpers import needs_root


def test_a_table_is_never_opened_through_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    (tmp_path / "events.csv").symlink_to(victim)
    with pytest.raises(OSError):
        metrics.open_table(tmp_path, "events.csv")
    assert victim.read_text() == "kept\n"


def test_a_whole_file_replaces_a_link_at_its_name_and_at_any_temporary_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    for name in ("ps.json", ".ps.json.tmp", "meta.json.tmp", "meta.json"):
        (tmp_path / name).symlink_to(victim)
    files.replace_text(tmp_path / "ps.json", '{"a": 1}')
    files.replace_text(tmp_path / "meta.json", "{}")
    assert victim.read_text() == "kept\n"
    assert not (tmp_path / "ps.json").is_symlink() and (tmp_path / "ps.json").read_text() == '{"a": 1}'
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_init_tables_replaces_planted_links(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    (tmp_path / "steps.csv").symlink_to(victim)
    metrics.init_tables(tmp_path)
    assert victim.read_text() == "kept\n" and (tmp_path / "steps.csv").read_text().startswith("time,")


def test_a_state_file_is_not_written_through_a_link(tmp_path, monkeypatch):
    monkeypatch.setattr(state, "STATE_DIR", tmp_path / "st")
    (tmp_path / "st").mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    st = state.RunState(run_id="abc123", runner_pid=os.getpid(), run_dir=str(tmp_path), scenario="s")
    for name in ("abc123.json", "abc123.tmp"):
        (tmp_path / "st" / name).symlink_to(victim)
    st.save()
    assert victim.read_text() == "kept\n"
    assert state.RunState.load(tmp_path / "st" / "abc123.json").run_id == "abc123"


@pytest.fixture
def planted():
    """A name of a run's namespace in /run/netns that is not one (removed afterwards)."""
    path = Path(NETNS_DIR) / f"eb-{secrets.token_hex(3)}-zz"
    os.makedirs(NETNS_DIR, exist_ok=True)
    try:
        yield path
    finally:
        if os.path.lexists(path):
            os.unlink(path)


@needs_root
def test_a_link_to_the_hosts_namespace_names_no_process(planted):
    """Before: os.stat followed the link, every process of the host's namespace was the run's,
    and the teardown SIGKILLed them all."""
    planted.symlink_to("/proc/self/ns/net")
    assert state.netns_inode(planted) is None
    assert state._netns_pids([planted.name]) == set()


@needs_root
def test_a_plain_file_names_no_namespace(planted):
    planted.write_text("")
    assert state.netns_inode(planted) is None


@needs_root
def test_removing_a_planted_link_unmounts_nothing(planted, tmp_path):
    """Before: umount2 followed the link and detached the mount it pointed at."""
    target = tmp_path / "mnt"
    target.mkdir()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    assert libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, None) == 0
    try:
        planted.symlink_to(target)
        remove_netns(planted.name)
        assert not os.path.lexists(planted)
        assert os.path.ismount(target)
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_the_hub_writes_a_nodes_report_past_a_planted_link(tmp_path):
    """The PS's ps.json, written by the hub: a link at its temporary name or its name had the
    runner write the node's report into the link's target."""
    from testbed.runtimes.control.hub import ControlHub

    victim = tmp_path / "victim"
    victim.write_text("kept\n")
    for name in (".ps.json.tmp", "ps.json"):
        (tmp_path / name).symlink_to(victim)
    hub = object.__new__(ControlHub)
    hub.run_dir = tmp_path
    assert hub._on_report({"name": "ps.json", "data": {"stop_reason": "steps"}})
    assert victim.read_text() == "kept\n" and (tmp_path / "ps.json").read_text() == '{"stop_reason": "steps"}'
