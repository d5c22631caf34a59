"""Compute limits with cgroups (v1 controllers or the v2 unified hierarchy).

A node's cgroup is `edgebed/<run_id>/<node>` under each controller. CPU is a CFS
quota (`cpus: 0.25` = 25 ms of CPU per 100 ms period, whatever the number of
threads; a profile's `cpu_period` changes the period), memory a hard limit, cpuset
an optional pinning.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from testbed.errors import HostCannot
from testbed.kernel import names

ROOT = Path(os.environ.get("EDGEBED_CGROUP_ROOT", "/sys/fs/cgroup"))
TOP = "edgebed"
PERIOD_US = 100_000  # the kernel's and Docker's default CFS period
# The kernel's bounds: a CFS period from 1 ms to 1 s, and no quota under 1 ms.
MIN_PERIOD_US, MAX_PERIOD_US, MIN_QUOTA_US = 1_000, 1_000_000, 1_000
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "cpuset", "freezer")


class CgroupError(HostCannot):
    pass


def period_us_of(period_s: Optional[float]) -> int:
    return PERIOD_US if period_s is None else int(round(period_s * 1e6))


def quota_us(cpus: float, period_us: int) -> int:
    # The scenario refuses quotas under the kernel's floor, so this only rounds.
    return max(MIN_QUOTA_US, int(round(cpus * period_us)))


def is_v2() -> bool:
    return _is_v2_at(ROOT)


@lru_cache(maxsize=8)  # keyed on the root: a test (or EDGEBED_CGROUP_ROOT) may point ROOT elsewhere
def _is_v2_at(root: Path) -> bool:
    return (root / "cgroup.controllers").exists()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def v1_mount(controller: str) -> Optional[Path]:
    """Where a v1 controller is mounted (co-mounted 'cpu,cpuacct' is common)."""
    return _v1_mount_at(ROOT, controller)


@lru_cache(maxsize=64)  # asked for every file of every node each second (the monitor)
def _v1_mount_at(root: Path, controller: str) -> Optional[Path]:
    for cand in (root / controller, root / "cpu,cpuacct", root / "cpuacct,cpu"):
        if (cand / "tasks").exists() and (controller in cand.name.split(",")):
            return cand
    return None


class CgroupUsage:
    """Accounting read from a cgroup's files; subclasses say where a controller's file is."""

    def _file(self, ctrl: str, name: str) -> Optional[Path]:
        raise NotImplementedError

    def cpu_seconds(self) -> Optional[float]:
        """Cumulative CPU time used by the cgroup's processes."""
        try:
            if is_v2():
                for line in self._file("cpu", "cpu.stat").read_text().splitlines():
                    k, v = line.split()
                    if k == "usage_usec":
                        return int(v) / 1e6
                return None
            return int(self._file("cpuacct", "cpuacct.usage").read_text()) / 1e9
        except (OSError, AttributeError):  # AttributeError: controller not mounted (no file)
            return None

    def memory_bytes(self) -> Optional[int]:
        try:
            return int(self._file("memory", "memory.current" if is_v2() else "memory.usage_in_bytes").read_text())
        except (OSError, AttributeError):
            return None

    def throttled(self) -> Optional[dict]:
        try:
            f = self._file("cpu", "cpu.stat")
            return {k: int(v) for k, v in (ln.split() for ln in f.read_text().splitlines())}
        except (OSError, AttributeError, ValueError):
            return None

    def period_us(self) -> int:
        """The CFS period the cgroup's quota is counted over."""
        try:
            if is_v2():
                return int(self._file("cpu", "cpu.max").read_text().split()[1])
            return int(self._file("cpu", "cpu.cfs_period_us").read_text())
        except (OSError, AttributeError, ValueError, IndexError):
            return PERIOD_US

    def quota_cores(self) -> Optional[float]:
        """The CFS quota in cores as the cgroup has it now (cpu.max, or cfs_quota_us over its
        period): what the node is promised, however it was set. None: unlimited or unreadable."""
        try:
            if is_v2():
                quota, period = self._file("cpu", "cpu.max").read_text().split()[:2]
                return None if quota == "max" else int(quota) / int(period)
            q = int(self._file("cpu", "cpu.cfs_quota_us").read_text())
            return None if q < 0 else q / self.period_us()
        except (OSError, AttributeError, ValueError, IndexError, ZeroDivisionError):
            return None

    def wait_seconds(self) -> Optional[float]:
        """Cumulative time the cgroup's tasks were runnable but not running: its PSI `some` total
        (cpu.pressure, where the cgroup has one), else the sum of its threads' run-queue delay
        (/proc/TID/schedstat's second field: a thread that exited takes its share with it)."""
        try:
            for line in self._file("cpu", "cpu.pressure").read_text().splitlines():
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
        except (OSError, AttributeError, ValueError, IndexError):
            pass
        try:
            tids = self._file("cpu", "cgroup.threads" if is_v2() else "tasks").read_text().split()
        except (OSError, AttributeError):
            return None
        total = 0
        for tid in tids:
            try:
                total += int(Path(f"/proc/{int(tid)}/schedstat").read_text().split()[1])
            except (OSError, ValueError, IndexError):
                continue  # ended between the two reads
        return total / 1e9

    # -- changes during a run (timeline.py) ------------------------------------------------
    def set_cpus(self, cpus: Optional[float]) -> None:
        """A new CFS quota in cores (None: unlimited), over the period the cgroup already has."""
        period = self.period_us()
        if is_v2():
            _write(self._file("cpu", "cpu.max"), f"{'max' if cpus is None else quota_us(cpus, period)} {period}")
            return
        _write(self._file("cpu", "cpu.cfs_quota_us"), "-1" if cpus is None else str(quota_us(cpus, period)))

    def freeze(self, frozen: bool) -> None:
        """Stop (or let go on) every process of the cgroup, as `docker pause` does."""
        if is_v2():
            _write(self._file("cpu", "cgroup.freeze"), "1" if frozen else "0")
        else:
            _write(self._file("freezer", "freezer.state"), "FROZEN" if frozen else "THAWED")

    def is_frozen(self) -> bool:
        try:
            if is_v2():
                return self._file("cpu", "cgroup.freeze").read_text().strip() == "1"
            return self._file("freezer", "freezer.state").read_text().strip() != "THAWED"
        except (OSError, AttributeError):
            return False

    def idle(self) -> bool:
        """No process in the cgroup now, as this host reads it; False where it cannot tell (a
        node elsewhere, whose usage comes over the control channel)."""
        try:
            return not self._file("cpu", "cgroup.procs").read_text().split()
        except (OSError, AttributeError, NotImplementedError):
            return False

    def member_pids(self) -> set[int]:
        try:
            return {int(x) for x in self._file("cpu", "cgroup.procs").read_text().split()}
        except (OSError, AttributeError, ValueError):
            return set()


class OwnCgroup(CgroupUsage):
    """The cgroup of the calling process as a container sees it: its own, mounted at the root."""

    def _file(self, ctrl: str, name: str) -> Optional[Path]:
        if is_v2():
            return ROOT / name
        mount = v1_mount(ctrl)
        return mount / name if mount else None


@dataclass
class NodeCgroup(CgroupUsage):
    run_id: str
    node: str

    @property
    def rel(self) -> str:
        return f"{TOP}/{self.run_id}/{self.node}"

    def dirs(self) -> list[Path]:
        if is_v2():
            return [ROOT / self.rel]
        out = []
        for c in V1_CONTROLLERS:
            m = v1_mount(c)
            if m is not None and m / self.rel not in out:
                out.append(m / self.rel)
        return out

    # -- creation ----------------------------------------------------------------------
    def create(self, cpus: Optional[float], memory: Optional[int], cpuset: Optional[str],
               cpu_period: Optional[float] = None) -> dict:
        """Make the cgroup and set its limits; returns what was set (for meta.json)."""
        applied: dict = {"version": 2 if is_v2() else 1, "path": self.rel}
        period = period_us_of(cpu_period)
        if is_v2():
            self._create_v2()
            d = ROOT / self.rel
            if cpus is not None:
                _write(d / "cpu.max", f"{quota_us(cpus, period)} {period}")
                applied["cpu_quota"] = cpus
                applied["cpu_period_s"] = period / 1e6
            if memory is not None:
                _write(d / "memory.max", str(memory))
                applied["memory_bytes"] = memory
            if cpuset is not None:
                _write(d / "cpuset.cpus", cpuset)
                applied["cpuset"] = cpuset
            return applied
        for d in self.dirs():
            d.mkdir(parents=True, exist_ok=True)
        cpu = v1_mount("cpu")
        if cpu is None:
            raise CgroupError("no cgroup v1 cpu controller mounted")
        if cpus is not None:
            # Period first: the kernel checks the quota against the period in place.
            _write(cpu / self.rel / "cpu.cfs_period_us", str(period))
            _write(cpu / self.rel / "cpu.cfs_quota_us", str(quota_us(cpus, period)))
            applied["cpu_quota"] = cpus
            applied["cpu_period_s"] = period / 1e6
        mem = v1_mount("memory")
        if memory is not None and mem is not None:
            _write(mem / self.rel / "memory.limit_in_bytes", str(memory))
            applied["memory_bytes"] = memory
        cs = v1_mount("cpuset")
        if cs is not None:
            # v1 cpuset groups start empty and refuse tasks until cpus and mems are set.
            for level in (f"{TOP}", f"{TOP}/{self.run_id}", self.rel):
                for fname in ("cpuset.cpus", "cpuset.mems"):
                    cur = (cs / level / fname).read_text().strip()
                    if not cur:
                        parent_val = (cs / level).parent.joinpath(fname).read_text().strip()
                        _write(cs / level / fname, parent_val)
            if cpuset is not None:
                _write(cs / self.rel / "cpuset.cpus", cpuset)
                applied["cpuset"] = cpuset
        return applied

    def _create_v2(self) -> None:
        parts = [TOP, f"{TOP}/{self.run_id}", self.rel]
        enable = "+cpu +memory +cpuset"
        prev = ROOT
        for p in parts:
            try:
                _write(prev / "cgroup.subtree_control", enable)
            except OSError:
                # Some controllers may be unavailable; enable one by one.
                for c in ("+cpu", "+memory", "+cpuset"):
                    try:
                        _write(prev / "cgroup.subtree_control", c)
                    except OSError:
                        pass
            (ROOT / p).mkdir(exist_ok=True)
            prev = ROOT / p

    # -- membership and accounting -----------------------------------------------------
    def attach(self, pid: int) -> None:
        for d in self.dirs():
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs():
            try:
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return out

    def _file(self, ctrl: str, name: str) -> Optional[Path]:
        if is_v2():
            return ROOT / self.rel / name
        mount = v1_mount(ctrl)
        return mount / self.rel / name if mount else None


def kill_and_remove(rel: str, timeout: float = 5.0) -> list[str]:
    """Kill every process in the cgroup subtree `rel` (e.g. 'edgebed/<run>') and rmdir it.

    Returns the problems that remain (empty on success).
    """
    dirs: list[Path] = []
    if is_v2():
        dirs = [ROOT / rel]
    else:
        for c in V1_CONTROLLERS:
            m = v1_mount(c)
            if m is not None and m / rel not in dirs:
                dirs.append(m / rel)
    # every cgroup of the subtrees, walked once (a fleet's run has thousands, each with dozens of files)
    tree = [sub for d in dirs if d.exists() for sub in _subtree(d)]
    for sub in tree:  # thaw first: a v1-frozen task does not act on SIGKILL (a paused node, a crash)
        for name, thawed in (("cgroup.freeze", "0"), ("freezer.state", "THAWED")):
            if (sub / name).exists():
                try:
                    (sub / name).write_text(thawed)
                except OSError:
                    pass
    deadline = time.monotonic() + timeout
    while True:
        pids = set()
        for sub in tree:
            try:
                pids |= {int(x) for x in (sub / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return [f"cgroup {rel}: processes {sorted(pids)} would not die"]
        time.sleep(0.05)
    problems = []
    # deepest first: a cgroup with children cannot be removed
    for sub in sorted(tree, key=lambda p: -len(p.parts)):
        for _ in range(50):
            try:
                sub.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY:
                    problems.append(f"{sub}: {e}")
                    break
                time.sleep(0.05)  # an exiting task still counted; retry briefly
        else:
            problems.append(f"{sub}: busy")
    return problems


def _subtree(top: Path) -> list[Path]:
    """`top` and every cgroup directory under it (os.walk: a directory's entries are typed, so the
    files of thousands of cgroups are never looked at one by one)."""
    return [Path(root) for root, _, _ in os.walk(top)]


def remove_run(run_id: str) -> list[str]:
    """kill_and_remove of a run's cgroup, edgebed/<run_id>: a run id of another shape (`..`, a
    path) would name another cgroup, so it removes nothing."""
    if not names.shaped("run id", run_id):
        return [f"cgroup of run {ascii(run_id)[:40]}: not an edgebed run id; nothing removed"]
    return kill_and_remove(f"{TOP}/{run_id}")


def list_runs() -> set[str]:
    """Run ids that have a cgroup under edgebed/ in any hierarchy (a folder of another name is
    skipped, in one line: it is not a run's)."""
    found: dict[str, Path] = {}
    bases = [ROOT / TOP] if is_v2() else [m / TOP for c in V1_CONTROLLERS if (m := v1_mount(c)) is not None]
    for b in bases:
        if b.is_dir():
            found.update({p.name: b for p in b.iterdir() if p.is_dir()})
    return {name for name, b in found.items() if names.checked("run id", name, f"cgroup folder {b}")}
