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
import socket
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from testbed.errors import HostCannot
from testbed.kernel import cgroups, names
from testbed.kernel.files import replace_text
from testbed.runtimes.ticks import Tick, no_ticks

# The labels of everything an engine holds of a run (containers, networks, swarm services).
LABEL = "edgebed"
RUN_LABEL = "edgebed.run"
OWNER_LABEL = "edgebed.owner"  # <euid>@<hostname> of the runner
RUNNER_LABEL = "edgebed.runner"  # <pid>:<start>, as a state file's runner_pid and runner_start


class StateDirError(HostCannot):
    """The state dir is not this user's alone: its files could have been planted."""


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


def _unsafe(path: Path) -> Optional[str]:
    """Why a directory of edgebed's may hold what another user planted (None: it is this user's alone)."""
    try:
        st = os.lstat(path)  # lstat: a symbolic link is refused, never followed
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by {'others' if st.st_mode & 0o002 else 'its group'} (mode {st.st_mode & 0o777:o})"
    return None


def _own_dirs() -> list[Path]:
    """The state dir, its missing parents and a user's /tmp/edgebed-<uid>: the folders that are
    edgebed's to make and so must be this user's alone, outermost first."""
    ours = [STATE_DIR]
    for parent in STATE_DIR.parents:
        if parent.name == f"edgebed-{os.geteuid()}" or not os.path.lexists(parent):
            ours.insert(0, parent)
        else:
            break
    return ours


def ensure_state_dir(create: bool = True) -> bool:
    """Check the state dir (and with `create`, make it and its missing parents, mode 0700, and
    check them after). Raises StateDirError, one line naming the folder and why, if one of them is
    a symbolic link, another user's, or writable by others. Returns whether the state dir exists."""
    for d in _own_dirs():
        if create:
            try:
                d.mkdir(mode=0o700)
            except FileExistsError:
                pass
        why = _unsafe(d)
        if why:
            raise StateDirError(f"state dir {d} {why}: refusing to use it (remove it, or set EDGEBED_STATE_DIR)")
    return STATE_DIR.is_dir()


@dataclass(frozen=True)
class Sweeper:
    """A backend's share of `edgebed down` (Mininet's cleanup callbacks): the labels of what it
    still holds of edgebed's, and how to remove one run's. Backends register themselves on import,
    so the core sweep here imports none of them. The labels are read as they are: the core checks
    their shapes (labelled_runs) before a run id from them is used."""
    name: str
    find_labels: Callable[[], list[tuple[str, dict]]]  # (what holds them, e.g. "container eb-..-w0", labels)
    remove: Callable[[str], list[str]]  # the problems left


SWEEPERS: dict[str, Sweeper] = {}


def register_sweeper(sweeper: Sweeper) -> None:
    SWEEPERS[sweeper.name] = sweeper


def temp_link_name(run_id: str, index: int, end: str) -> str:
    """Name of a veth end while it was still in the root namespace (<= 15 chars: 2 + 6 + 4 + 1).
    Runs make their veths in place now (kernel.netlink.add_veth); `down` still removes what a
    crashed run of an older edgebed left under these names."""
    if not 0 <= index <= 0xFFFF:
        raise ValueError(f"veth index {index} out of range")
    return f"eb{run_id}{index:04x}{end}"


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
    # runner, so a recycled pid is never taken for it. -1: unknown (a state file without it).
    runner_start: Optional[int] = None

    def __post_init__(self) -> None:
        if self.runner_start is None:
            self.runner_start = process_start(self.runner_pid)

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.run_id}.json"

    def save(self) -> None:
        ensure_state_dir()
        replace_text(self.path, json.dumps(asdict(self), indent=1))  # a crash never leaves half of it

    @classmethod
    def load(cls, path: Path) -> "RunState":
        """A state file, checked before anything in it is used: its run id is its file's name, of
        edgebed's shape; its runner a pid; its namespaces only that run's (others are skipped with
        one line). ValueError when the file cannot be this run's."""
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("run_id") != path.stem or not names.shaped("run id", path.stem):
            raise ValueError("it does not name the run of its file's name")
        if names.checked_pid(data.get("runner_pid"), f"state file {path}") is None:
            raise ValueError("no runner pid in it")
        start = data.get("runner_start")
        if start is not None and (not isinstance(start, int) or isinstance(start, bool)):
            raise ValueError("its runner_start is not a number")
        data["runner_start"] = -1 if start is None else start  # unknown: never the live pid's own start
        netns = data.get("netns", [])
        if not isinstance(netns, list):
            raise ValueError("its netns is not a list")
        data["netns"] = [n for n in netns if _run_netns(n, path.stem, f"state file {path}")]
        return cls(**data)


def _run_netns(name: object, run_id: str, source: str) -> bool:
    """Whether `name` is a namespace of run `run_id` by its shape; if not, said in one line."""
    if names.of_run("netns", name, run_id):
        return True
    names.warn_skipped("netns", name, source, f"not the shape of a namespace of run {run_id}")
    return False


def process_start(pid: int) -> Optional[int]:
    """When process `pid` started (clock ticks since boot), None when there is none."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(line.rsplit(")", 1)[1].split()[19])  # field 22; the name before ")" may hold spaces


def runner_alive(st: "RunState") -> bool:
    """Whether the run's own runner still runs (the pid alive and started when the runner did). A
    state without the runner's start (-1) cannot tell it from whatever has the pid now: not alive,
    so that `down` never signals that pid."""
    start = process_start(st.runner_pid)
    return start is not None and st.runner_start == start


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- whose a run an engine holds is: its labels -----------------------------------------------
def this_owner() -> str:
    """Who runs edgebed here, as the owner label says it: <euid>@<hostname>."""
    return f"{os.geteuid()}@{socket.gethostname()}"


def run_labels(st: RunState) -> dict[str, str]:
    """The labels of everything an engine holds of a run: edgebed's, the run, its owner and its
    runner (so that a `down` elsewhere, or by another user, knows the run is not its to remove)."""
    return {LABEL: "1", RUN_LABEL: st.run_id, OWNER_LABEL: this_owner(),
            RUNNER_LABEL: f"{st.runner_pid}:{st.runner_start}"}


@dataclass(frozen=True)
class EngineRun:
    """What an engine's labels say of a run (None: not said, or not in the shape edgebed writes)."""
    owner: Optional[str] = None
    runner_pid: Optional[int] = None
    runner_start: Optional[int] = None

    @classmethod
    def of(cls, labels: dict, source: str) -> "EngineRun":
        owner = labels.get(OWNER_LABEL)
        owner = names.checked("owner", owner, f"{source}'s label {OWNER_LABEL}") if owner is not None else None
        runner = labels.get(RUNNER_LABEL)
        m = names.shaped("runner", runner)
        if runner is not None and m is None:
            names.warn_skipped("runner", runner, f"{source}'s label {RUNNER_LABEL}")
        return cls(owner, int(m["pid"]) if m else None, int(m["start"]) if m else None)

    def runner_alive(self) -> bool:
        """Whether its runner runs, here: only this host's and this user's runner is looked for."""
        return (self.owner == this_owner() and self.runner_pid is not None
                and process_start(self.runner_pid) == self.runner_start)


def labelled_runs() -> dict[str, EngineRun]:
    """Every run an engine holds, by the labels of what it holds; a run id not of edgebed's shape
    is skipped with one line (it would become a cgroup, a netns or a file name)."""
    runs: dict[str, EngineRun] = {}
    for sweeper in SWEEPERS.values():
        for source, labels in sweeper.find_labels():
            if labels.get(RUN_LABEL) is None:  # edgebed's image's label, on a container of no run
                continue
            rid = names.checked("run id", labels[RUN_LABEL], f"{source}'s label {RUN_LABEL}")
            if rid is not None and rid not in runs:
                runs[rid] = EngineRun.of(labels, source)
    return runs


def foreign_owner(engine: Optional[EngineRun]) -> Optional[str]:
    """Whose the run is, where its labels say it is not this user's on this host (None: it is, or unsaid)."""
    if engine is None or engine.owner is None or engine.owner == this_owner():
        return None
    return engine.owner


# -- what is on this machine --------------------------------------------------------------------
def netns_of_run(run_id: str) -> list[str]:
    """The run's namespaces in /run/netns; a name that starts as one but has another shape is skipped."""
    if not NETNS_DIR.is_dir():
        return []
    found = (p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{NETNS_PREFIX}{run_id}-"))
    return sorted(name for name in found if _run_netns(name, run_id, str(NETNS_DIR)))


def _state_files() -> dict[str, Optional[RunState]]:
    """The runs of the state dir (refused, StateDirError, if it is not this user's alone)."""
    runs: dict[str, Optional[RunState]] = {}
    if not ensure_state_dir(create=False):
        return runs
    for p in STATE_DIR.glob("*.json"):
        if names.checked("run id", p.stem, f"state dir {STATE_DIR}") is None:
            continue
        try:
            runs[p.stem] = RunState.load(p)
        except (ValueError, TypeError, OSError) as e:  # its resources are still found by their names
            names.warn_skipped("state file", p.name, str(STATE_DIR), str(e) or type(e).__name__)
            runs[p.stem] = None
    return runs


def _netns_runs() -> set[str]:
    """Run ids of the namespaces in /run/netns (names of other shapes are not edgebed's runs')."""
    runs = set()
    for p in NETNS_DIR.iterdir() if NETNS_DIR.is_dir() else []:
        claimed = re.match(rf"^{NETNS_PREFIX}({names.RUN_ID})-", p.name)
        if claimed and _run_netns(p.name, claimed.group(1), str(NETNS_DIR)):
            runs.add(claimed.group(1))
    return runs


def known_runs(labelled: Optional[dict[str, EngineRun]] = None) -> dict[str, Optional[RunState]]:
    """Every run id with a state file, a namespace, a cgroup or an engine's labels on this machine
    (`labelled`: labelled_runs(), when the caller has them already)."""
    runs = _state_files()
    for rid in _netns_runs():
        runs.setdefault(rid, None)
    try:
        for rid in cgroups.list_runs():
            runs.setdefault(rid, None)
    except OSError:
        pass
    for rid in labelled_runs() if labelled is None else labelled:
        runs.setdefault(rid, None)
    return runs


def engine_runs(runs: dict[str, Optional[RunState]],
                labelled: Optional[dict[str, EngineRun]] = None) -> dict[str, Optional[RunState]]:
    """The runs a user without root may remove: their own (state files in their state dir: swarm
    runs, the only ones that need no root) and what an engine they reach holds of edgebed's; not
    the namespaces and cgroups of root's runs."""
    held = labelled_runs() if labelled is None else labelled
    return {rid: st for rid, st in runs.items() if st is not None or rid in held}


def netns_inode(path: Path) -> Optional[tuple[int, int]]:
    """(inode, device) of the namespace bound at `path`, None unless it is one: a symbolic link
    (a node could point one at /proc/self/ns/net), a plain file, or the host's own namespace
    (every process of the host's would then be the run's) is none."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return None
        st, host = os.stat(path), os.stat(f"/proc/{os.getpid()}/ns/net")
    except OSError:
        return None
    if st.st_dev != host.st_dev or st.st_ino == host.st_ino:  # nsfs holds every namespace's inode
        return None
    return st.st_ino, st.st_dev


def _netns_pids(netns_names: list[str]) -> set[int]:
    """Processes whose network namespace is one of the named ones (st_ino/st_dev of the ns links
    compared; /proc read once, whatever the number of namespaces)."""
    targets = set()
    for name in netns_names:
        found = netns_inode(NETNS_DIR / name)
        if found is not None:
            targets.add(found)
    pids: set[int] = set()
    if not targets:
        return pids
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{d.name}/ns/net")
        except OSError:
            continue
        if (st.st_ino, st.st_dev) in targets:
            pids.add(int(d.name))
    return pids


def run_processes(run_id: str) -> set[int]:
    """Processes still inside the run's namespaces."""
    return _netns_pids(netns_of_run(run_id))


def why_left_alone(run_id: str, st: Optional[RunState], engine: Optional[EngineRun] = None) -> Optional[str]:
    """Why a bare `edgebed down` must not touch this run (None: it is this user's dead run's
    remains). `engine`: what the engines' labels say of it. Another owner's run is the caller's
    to refuse first (foreign_owner)."""
    if st is not None and runner_alive(st):
        return f"still running (runner pid {st.runner_pid})"
    if st is None and engine is not None:
        if engine.owner is None:
            return "no state file here and no owner label says whose it is (made by an older edgebed?)"
        if engine.runner_pid is None:
            return "its labels name no runner, so none can be known to be gone"
        if engine.runner_alive():
            return f"still running (runner pid {engine.runner_pid})"
    if st is None and run_processes(run_id):
        return "processes run in it and no state file here says whose (another state dir's run?)"
    return None


def _stop_runner(st: RunState) -> None:
    """A live runner tears down its own run and flushes its records: ask it first, then kill it."""
    try:
        os.kill(st.runner_pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 15
    while pid_alive(st.runner_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(st.runner_pid):
        try:
            os.kill(st.runner_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove_namespaces(netns_names: list[str], progress: Tick = no_ticks) -> list[str]:
    """Kill what runs in the namespaces, then remove them (their veth ends and qdiscs go with them)."""
    from testbed.kernel.netlink import remove_netns

    for pid in _netns_pids(netns_names):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    problems = []
    for i, name in enumerate(netns_names):
        try:
            remove_netns(name)
        except FileNotFoundError:
            pass
        except OSError as e:
            problems.append(f"netns {name}: {e}")
        progress("removing", i + 1, len(netns_names))
    return problems


def _remove_temp_links(run_id: str) -> list[str]:
    """Temporary veth ends left in the root namespace by a crash mid-creation (an older edgebed's)."""
    from pyroute2 import IPRoute

    problems = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            ifname = link.get("ifname") or link.get_attr("IFLA_IFNAME")
            if ifname and names.of_run("veth", ifname, run_id):
                try:
                    ipr.link("del", index=link["index"])
                except Exception as e:  # already gone with its peer
                    if getattr(e, "code", None) not in (19,):
                        problems.append(f"link {ifname}: {e}")
    return problems


def cleanup_run(run_id: str, st: Optional[RunState] = None, *, stop_runner: bool = True,
                progress: Tick = no_ticks) -> list[str]:
    """Remove everything of one run. Returns problems left (empty = clean). Only names of the
    run's own shape are touched: a run id of another shape removes nothing. `progress` hears of
    each namespace removed."""
    if not names.shaped("run id", run_id) or (st is not None and st.run_id != run_id):
        return [f"run id {ascii(run_id)[:40]}: not an edgebed run id of this state; nothing removed"]
    problems: list[str] = []
    if st is not None and stop_runner and st.runner_pid != os.getpid() and runner_alive(st):
        _stop_runner(st)
    # 0. what the backends made, e.g. the docker runtime's containers (their processes die with them);
    # a run whose runtime is known asks only its own (a netns run's teardown never waits on an engine)
    for name, sweeper in SWEEPERS.items():
        if st is None or st.runtime in ("", "auto", name):
            problems += sweeper.remove(run_id)
    # 1. processes: everything in the run's cgroups and namespaces; 2. the namespaces.
    problems += cgroups.remove_run(run_id)
    from_state = [n for n in (st.netns if st else []) if _run_netns(n, run_id, "the run's state")]
    problems += _remove_namespaces(sorted(set(netns_of_run(run_id)) | set(from_state)), progress)
    problems += _remove_temp_links(run_id)
    # cgroups again, in case a process was started between steps 1 and 2.
    problems += cgroups.remove_run(run_id)
    if not problems:
        try:
            (STATE_DIR / f"{run_id}.json").unlink()
        except FileNotFoundError:
            pass
    return problems


def leftovers() -> list[str]:
    """Human-readable list of edgebed resources present now (for status and tests)."""
    out = []
    labelled = labelled_runs()
    cgroup_runs = cgroups.list_runs()
    for rid, st in known_runs(labelled).items():
        alive = st is not None and runner_alive(st)
        ns = netns_of_run(rid)
        cg = rid in cgroup_runs
        owner = foreign_owner(labelled.get(rid))
        out.append(f"{rid}: runner {'alive pid ' + str(st.runner_pid) if alive else 'gone'}, "
                   f"{len(ns)} namespaces, cgroup {'present' if cg else 'absent'}"
                   + (f", run dir {st.run_dir}" if st else "") + (f", owner {owner}" if owner else ""))
    return out
