"""kernel.mounts: a netns node process sees the host's cgroup files and sysctls read-only (its
code keeps uid 0 without capabilities), and the host's own view is unchanged."""
import errno
import secrets

import pytest

from testbed.kernel import cgroups
from testbed.kernel.mounts import mount_points, read_only_host_controls

from helpers import in_child, needs_root


def test_mount_points_below_the_paths_parents_first():
    info = ("22 1 0:21 / /sys rw - sysfs sysfs rw\n"
            "30 22 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
            "33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
            "40 23 0:40 / /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw\n"
            "41 1 0:41 / /sys/fs/cgroupx rw - tmpfs x rw\n")
    assert mount_points(("/sys/fs/cgroup", "/proc/sys"), info) == [
        "/sys/fs/cgroup", "/proc/sys/fs/binfmt_misc", "/sys/fs/cgroup/cpu,cpuacct"]


def _try_writes(quota_file: str) -> dict:
    points = read_only_host_controls()
    out = {"points": points}
    for name, path, value in (("quota", quota_file, "max 100000\n" if cgroups.is_v2() else "-1\n"),
                              ("sysctl", "/proc/sys/kernel/domainname", "edgebed-test\n")):
        try:
            with open(path, "w") as f:
                f.write(value)
            out[name] = "written"
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, str(e.errno))
    return out


@needs_root
@pytest.mark.root
def test_a_node_process_cannot_raise_its_own_quota_or_set_a_sysctl(tmp_path):
    run_id = secrets.token_hex(3)
    cg = cgroups.NodeCgroup(run_id, "w0")
    cg.create(0.25, None, None, None)
    try:
        quota = cg.dirs()[0] / ("cpu.max" if cgroups.is_v2() else "cpu.cfs_quota_us")
        before = quota.read_text()
        domain = open("/proc/sys/kernel/domainname").read()
        got = in_child(lambda: _try_writes(str(quota)))
        assert "error" not in got, got
        assert got["quota"] == "EROFS" and got["sysctl"] == "EROFS", got
        assert "/proc/sys" in got["points"] and any(p.startswith("/sys/fs/cgroup") for p in got["points"])
        assert quota.read_text() == before and open("/proc/sys/kernel/domainname").read() == domain
        with open(quota, "w") as f:  # the host's own view (the runner's) is still writable
            f.write(before.split()[0] + (" " + before.split()[1] if cgroups.is_v2() else "") + "\n")
    finally:
        cgroups.kill_and_remove(f"{cgroups.TOP}/{run_id}")


def test_bridges_plan_the_closed_folders_on_the_way_and_a_closed_folder_read_whole(tmp_path):
    """What a node's uid cannot pass: each closed folder above a path with the one entry on the
    way, and a path that is itself closed with all its entries (a plugin installed into a 0700
    folder: its modules are imported by name later)."""
    from testbed.kernel.mounts import bridges

    outer = tmp_path / "outer"
    (outer / "open" / "site").mkdir(parents=True)
    (outer / "other").mkdir()
    site = outer / "open" / "site"
    (site / "pkg").mkdir()
    (site / "mod.py").write_text("")
    outer.chmod(0o700)
    (outer / "open").chmod(0o755)
    site.chmod(0o700)
    plan = dict(bridges([str(site)], frozenset([str(site)])))
    assert plan[str(outer)] == ("open",)
    assert plan[str(site)] == ("mod.py", "pkg")
    assert str(outer / "open") not in plan
    assert str(site) not in dict(bridges([str(site)]))  # a closed folder not imported from stays closed
