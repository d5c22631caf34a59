"""What edgebed has made on this machine, so that `edgebed down` can remove it after any crash.

Each run keeps a state file /run/edgebed/<run_id>.json, written *before* each resource is
created, naming its runner's pid, namespaces, cgroup and temporary links. Cleanup
also scans for edgebed-named resources that no state file mentions (a runner killed
between creating a resource and writing its state), so nothing depends on the file.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from testbed.kernel import cgroups

def _state_dir() -> Path:
    """Root's runs' in /run/edgebed; a user's (runtime swarm needs no root on the runner's machine)
    in their own runtime directory."""
    if "EDGEBED_STATE_DIR" in os.environ:
        return Path(os.environ["EDGEBED_STATE_DIR"])
    if os.geteuid() == 0:
        return Path("/run/edgebed")
    return Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/edgebed-{os.geteuid()}") / "edgebed"


STATE_DIR = _state_dir()
NETNS_DIR = Path("/run/netns")
NETNS_PREFIX = "eb-"


@dataclass(frozen=True)
class Sweeper:
    """A backend's share of `edgebed down` (Mininet's cleanup callbacks): the runs whose resources
    it still holds, and how to remove one run's. Backends register themselves on import, so the
    core sweep here imports none of them."""
    name: str
    find_runs: Callable[[], set[str]]
    remove: Callable[[str], list[str]]  # the problems left


SWEEPERS: dict[str, Sweeper] = {}


def register_sweeper(sweeper: Sweeper) -> None:
    SWEEPERS[sweeper.name] = sweeper


def temp_link_name(run_id: str, index: int, end: str) -> str:
    """Name of a veth end while it is still in the root namespace (<= 15 chars)."""
    return f"eb{run_id}{index:03x}{end}"


def _temp_link_re(run_id: str) -> re.Pattern:
    return re.compile(rf"^eb{run_id}[0-9a-f]{{3}}[xy]$")


@dataclass
class RunState:
    run_id: str
    runner_pid: int
    run_dir: str
    scenario: str
    runtime: str = "netns"
    started: float = field(default_factory=time.time)
    netns: list[str] = field(default_factory=list)
    # The runner's start time (kernel clock ticks since boot): with the pid, what identifies the
    # runner, so a recycled pid is never taken for it. -1: a state file from before this field.
    runner_start: Optional[int] = None

    def __post_init__(self) -> None:
        if self.runner_start is None:
            self.runner_start = process_start(self.runner_pid)

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.run_id}.json"

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)  # atomic: a crash never leaves half a state file

    @classmethod
    def load(cls, path: Path) -> "RunState":
        return cls(**{"runner_start": -1, **json.loads(path.read_text())})


def process_start(pid: int) -> Optional[int]:
    """When process `pid` started (clock ticks since boot), None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name before ")" may hold spaces


def runner_alive(st: "RunState") -> bool:
    """Whether the run's own runner still runs (the pid alive and started when the runner did)."""
    start = process_start(st.runner_pid)
    return start is not None and st.runner_start in (start, -1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_of_run(run_id: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{NETNS_PREFIX}{run_id}-"))


def known_runs() -> dict[str, Optional[RunState]]:
    """Every run id with a state file, a namespace or a cgroup on this machine."""
    runs: dict[str, Optional[RunState]] = {}
    if STATE_DIR.is_dir():
        for p in STATE_DIR.glob("*.json"):
            try:
                st = RunState.load(p)
                runs[st.run_id] = st
            except (ValueError, TypeError, OSError):
                runs.setdefault(p.stem, None)
    if NETNS_DIR.is_dir():
        for p in NETNS_DIR.iterdir():
            m = re.match(rf"^{NETNS_PREFIX}([0-9a-f]{{6}})-", p.name)
            if m:
                runs.setdefault(m.group(1), None)
    try:
        for rid in cgroups.list_runs():
            runs.setdefault(rid, None)
    except OSError:
        pass
    for sweeper in SWEEPERS.values():
        for rid in sweeper.find_runs():
            runs.setdefault(rid, None)
    return runs


def engine_runs(runs: dict[str, Optional[RunState]]) -> dict[str, Optional[RunState]]:
    """The runs a user without root may remove: their own (state files in their state dir: swarm
    runs, the only ones that need no root) and what an engine they reach holds of edgebed's; not
    the namespaces and cgroups of root's runs."""
    held = set().union(*(s.find_runs() for s in SWEEPERS.values()))
    return {rid: st for rid, st in runs.items() if st is not None or rid in held}


def _netns_pids(name: str) -> set[int]:
    """Processes whose network namespace is the named one (compare st_ino/st_dev of ns links)."""
    try:
        target = os.stat(NETNS_DIR / name)
    except OSError:
        return set()
    pids = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            st = os.stat(d / "ns" / "net")
        except OSError:
            continue
        if st.st_ino == target.st_ino and st.st_dev == target.st_dev:
            pids.add(int(d.name))
    return pids


def run_processes(run_id: str) -> set[int]:
    """Processes still inside the run's namespaces."""
    return set().union(*(_netns_pids(name) for name in netns_of_run(run_id)))


def why_left_alone(run_id: str, st: Optional[RunState]) -> Optional[str]:
    """Why a bare `edgebed down` must not touch this run (None: it is a dead run's remains)."""
    if st is not None and runner_alive(st):
        return f"still running (runner pid {st.runner_pid})"
    if st is None and run_processes(run_id):
        return "processes run in it and no state file here says whose (another state dir's run?)"
    return None


def cleanup_run(run_id: str, st: Optional[RunState] = None, *, stop_runner: bool = True) -> list[str]:
    """Remove everything of one run. Returns problems left (empty = clean)."""
    from pyroute2 import IPRoute

    from testbed.kernel.netlink import remove_netns

    problems: list[str] = []
    if st is not None and stop_runner and st.runner_pid != os.getpid() and runner_alive(st):
        # A live runner tears down its own run and flushes its records: ask it first.
        try:
            os.kill(st.runner_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 15
        while pid_alive(st.runner_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(st.runner_pid):
            try:
                os.kill(st.runner_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # 0. what the backends made, e.g. the docker runtime's containers (their processes die with them);
    # a run whose runtime is known asks only its own (a netns run's teardown never waits on an engine)
    for name, sweeper in SWEEPERS.items():
        if st is None or st.runtime in ("", "auto", name):
            problems += sweeper.remove(run_id)
    # 1. processes: everything in the run's cgroups and namespaces.
    problems += cgroups.kill_and_remove(f"{cgroups.TOP}/{run_id}")
    names = sorted(set(netns_of_run(run_id)) | set(st.netns if st else []))
    for name in names:
        for pid in _netns_pids(name):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # 2. namespaces (their veth ends and qdiscs go with them).
    for name in names:
        try:
            remove_netns(name)
        except FileNotFoundError:
            pass
        except OSError as e:
            problems.append(f"netns {name}: {e}")
    # 3. temporary veth ends left in the root namespace by a crash mid-creation.
    with IPRoute() as ipr:
        for link in ipr.get_links():
            ifname = link.get("ifname") or link.get_attr("IFLA_IFNAME")
            if ifname and _temp_link_re(run_id).match(ifname):
                try:
                    ipr.link("del", index=link["index"])
                except Exception as e:  # already gone with its peer
                    if getattr(e, "code", None) not in (19,):
                        problems.append(f"link {ifname}: {e}")
    # cgroups again, in case a process was started between steps 1 and 2.
    problems += cgroups.kill_and_remove(f"{cgroups.TOP}/{run_id}")
    if not problems:
        try:
            (STATE_DIR / f"{run_id}.json").unlink()
        except FileNotFoundError:
            pass
    return problems


def leftovers() -> list[str]:
    """Human-readable list of edgebed resources present now (for status and tests)."""
    out = []
    for rid, st in known_runs().items():
        alive = st is not None and runner_alive(st)
        ns = netns_of_run(rid)
        cg = rid in cgroups.list_runs()
        out.append(f"{rid}: runner {'alive pid ' + str(st.runner_pid) if alive else 'gone'}, "
                   f"{len(ns)} namespaces, cgroup {'present' if cg else 'absent'}"
                   + (f", run dir {st.run_dir}" if st else ""))
    return out
