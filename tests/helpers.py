"""What more than one test file uses, in one module (no test file imports another, or conftest:
tests/repo/test_layout.py): the repository's path, the root check, waiting, `edgebed up` as a
subprocess, a netns cluster, what a run leaves on the host, a control hub on loopback, a forked
child, a Docker engine, the lab's engines and runs, and a synthetic run's records. Imported as
`helpers` (pyproject.toml's pytest `pythonpath`); tests/conftest.py holds the fixtures and the
tiers.

Nothing it imports at its top starts a thread (pandas and numpy do: imported inside the functions
that use them): a node process that unpickles a test's function imports its test file and this
module, then drops its privileges, which a second thread would refuse."""

import base64
import csv
import errno
import json
import math
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from testbed.node import channel, channel_keys
from testbed.records import metrics
from testbed.records.columns import EVAL_COLUMNS, EVENT_COLUMNS, STEP_COLUMNS, TRAFFIC_COLUMNS
from testbed.runtimes.control.hub import ControlHub

if TYPE_CHECKING:  # pandas starts a thread: imported where it is used (see above)
    import pandas as pd

REPO = Path(__file__).resolve().parent.parent


def is_root() -> bool:
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not is_root(), reason="needs root: namespaces, veth, tc and cgroups")


def until(cond, limit: float = 30.0) -> bool:
    """Whether `cond()` became true within `limit` seconds (asked every 20 ms)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def edgebed_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("edgebed")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "testbed.cli"]


def write_scenario(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    """Scenario dict `data` as a YAML file in tmp_path; its path."""
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _up_args(scenario, run_dir, extra) -> list[str]:
    return edgebed_cmd() + ["up", str(scenario), *([] if run_dir is None else ["--out", str(run_dir)]), *extra]


def run_up(scenario, run_dir=None, *extra: str, expect: int | None = 0, timeout: float = 600, env=None,
           cwd=REPO) -> subprocess.CompletedProcess:
    """`edgebed up SCENARIO --out RUN_DIR EXTRA...` as a subprocess (in the repository, so relative
    scenario paths work); asserts its exit code is `expect` (None: not checked), the output's tails
    in the message. A test that calls it is a real run (auto-marked `real` and `slow`)."""
    r = subprocess.run(_up_args(scenario, run_dir, extra), cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=env)
    if expect is not None:
        assert r.returncode == expect, f"exit {r.returncode}, not {expect}\n" + r.stdout[-3000:] + r.stderr[-3000:]
    return r


def start_up(scenario, run_dir=None, *extra: str, env=None, cwd=REPO, **popen) -> subprocess.Popen:
    """`edgebed up` started in the background (stdout and stderr together in a pipe unless `popen`
    says otherwise), for a test that acts on the run while it runs."""
    opts = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, **popen}
    return subprocess.Popen(_up_args(scenario, run_dir, extra), cwd=cwd, env=env, **opts)


def our_netns() -> list[str]:
    d = Path("/run/netns")
    return sorted(p.name for p in d.iterdir() if p.name.startswith("eb-")) if d.is_dir() else []


def our_processes() -> list[str]:
    """Processes of edgebed's runs left on the host, as "pid args" lines.

    Not the heavy lock's waiters nor the lab's engines (edgebed-heavy.lock, edgebed-lab in their
    args), and not this process's own children: a netns cluster made in the test process
    (netns_cluster) leaves its forkserver here until pytest exits, and its args carry the
    editable install's "__editable__.edgebed-0.1.0" path hook, not a run's name.
    """
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    mine, lines = str(os.getpid()), []
    for line in out.splitlines()[1:]:
        pid, ppid, args = (line.split(None, 2) + ["", ""])[:3]
        named = args.replace("__editable__.edgebed-", "")
        if ppid == mine or "ps -eo" in args or "edgebed-heavy.lock" in args or "edgebed-lab" in args:
            continue
        if "edgebed-" in named:
            lines.append(f"{pid} {args}")
    return lines


@contextmanager
def netns_cluster(run_dir, scenario: dict):
    """A netns cluster made from a scenario dict; torn down (and checked) on exit."""
    import secrets

    from testbed.plan import parse_scenario
    from testbed.plan.cluster import build_cluster
    from testbed.runtimes.netns.runtime import NetnsRuntime
    from testbed.runtimes.state import RunState

    sc = parse_scenario(scenario)
    run_id = secrets.token_hex(3)
    state = RunState(run_id=run_id, runner_pid=os.getpid(), run_dir=str(run_dir), scenario=sc.name)
    state.save()
    rt = NetnsRuntime(state)
    rt.set_preload([])
    spec = build_cluster(sc, run_id)
    try:
        rt.create(spec)
        yield rt, spec
    finally:
        assert rt.teardown() == []
        assert not [n for n in our_netns() if run_id in n]


# -- a control hub on loopback (each node speaks with its own channel keys) ----------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def loopback_hub(tmp_path) -> ControlHub:
    """A hub on 127.0.0.1 with the run's tables in tmp_path; its (up, down) URLs in `.urls`."""
    metrics.init_tables(tmp_path)
    up, down = _free_port(), _free_port()
    hub = ControlHub(None, "127.0.0.1", up, down, tmp_path)
    hub.urls = (f"tcp://127.0.0.1:{up}", f"tcp://127.0.0.1:{down}")
    return hub


def _speak_as(hub, name: str, role: str) -> channel_keys.ChannelKeys:
    """This process's channel sockets from now on speak for node `name` of the hub's run."""
    channel.flush()
    keys = hub.keys.admit(name, role)
    channel_keys.use(keys)
    return keys


HANDSHAKE = "handshake failed (no CURVE, or not the hub's key)"


def at_handshake(drops) -> int:
    """Clients stopped at the handshake: refused by it, or cut off in it (a plain client may close
    first, having seen the hub's CURVE greeting: the hub then sees EPIPE)."""
    return sum(n for why, n in drops.items() if why == HANDSHAKE or why.startswith("handshake cut off"))


# -- a forked child -----------------------------------------------------------------------------
def in_child(fn) -> dict:
    """fn() in a forked child; what it returned (a JSON-able dict), or its error as {"error": ...}."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                out = fn()
            except BaseException as e:
                out = {"error": f"{type(e).__name__}: {e}"}
            os.write(w, json.dumps(out, default=repr).encode())
        finally:
            os._exit(0)  # never back into pytest from a forked child
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


# -- Docker and the lab ------------------------------------------------------------------------
def _client():
    from testbed.runtimes.engine.client import docker_client

    c = docker_client(timeout=3)
    if c is None:
        pytest.skip("no Docker engine answers (CI starts dockerd; elsewhere start it to run these)")
    return c


def _docker_or_skip() -> None:
    from testbed.runtimes.engine.client import docker_client
    from testbed.runtimes.engine.images import ensure_node_image

    client = docker_client(timeout=3)
    if client is None:
        pytest.skip("no Docker engine answers (CI starts dockerd; elsewhere start it to run this)")
    ensure_node_image(client, say=lambda s: None)


def _engine(url):
    import docker

    return docker.DockerClient(base_url=url, timeout=30)


def _ours_on(host) -> dict:
    c = _engine(host.socket)
    out = {"containers": [x.name for x in c.containers.list(all=True, filters={"label": "edgebed"})],
           "networks": [n.name for n in c.networks.list(filters={"label": "edgebed"})]}
    if host.name.endswith("h1"):
        out["services"] = [s.name for s in c.services.list(filters={"label": "edgebed"})]
    return out


def _run(tmp_path, sc: dict, *extra: str, env=None):
    """`edgebed up` of scenario dict `sc` (plus options); the run directory, after checking it ran."""
    path = write_scenario(tmp_path, sc)
    run_dir = tmp_path / "run"
    run_up(path, run_dir, *extra, "-q", timeout=900, env=env)
    return run_dir


# -- what runs measure ---------------------------------------------------------------------------
def _rates(traffic: "pd.DataFrame", node: str, direction: str, window: int = 3) -> "pd.DataFrame":
    """Bit rates of a node's access link over `window` consecutive samples (~1 s apart) of
    traffic.csv (one sample's interval is too short to judge: counters and clock are read apart)."""
    import pandas as pd

    t = traffic[(traffic.node == node) & (traffic.link == "access") & (traffic.direction == direction)]
    t = t.sort_values("time").reset_index(drop=True)
    bps = t.delta_bytes.rolling(window).sum() * 8 / t.time.diff(window)
    return pd.DataFrame({"time": t.time, "bps": bps}).dropna()


UNDO_RATE_MBIT = 20  # each worker's uplink, its only shaped direction: rank 1's own qdisc holds its sending rate


def undo_shaping_scenario(runtime: str) -> dict:
    """Two workers running tests/undo_shaping.py, inline (a container has none of this repository's
    files): each tries to delete its root qdisc and take an address, then w1 sends to w0."""
    code = base64.b64encode((REPO / "tests" / "undo_shaping.py").read_bytes()).decode()
    program = f"{{python}} -c \"import base64; exec(base64.b64decode('{code}'))\" {{address}} {{master_addr}} {{rank}}"
    return {"runtime": runtime, "stop": {"seconds": 120}, "workload": {"command": {"worker": program}},
            "profiles": {"edge": {"cpus": 0.5, "uplink": f"{UNDO_RATE_MBIT}mbit"}},
            "workers": [{"count": 2, "profile": "edge"}]}


def assert_shaping_held(run_dir) -> float:
    """Both programs were refused (EPERM; the tc and ip programs failed where the node has them),
    the qdisc and the addresses stayed, and w0 received at the shaped rate; that rate."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reason"] == "commands", summary
    import pandas as pd

    rep = pd.read_csv(run_dir / "report.csv")
    got = {(row.node, row.key): row.value for row in rep.itertuples()}
    for node in ("w0", "w1"):
        assert (got[(node, "tc_del_errno")], got[(node, "addr_add_errno")]) == (errno.EPERM, errno.EPERM), got
        assert got[(node, "tc_program_status")] != 0 and got[(node, "ip_program_status")] != 0, got  # -1: none there
        assert (got[(node, "root_is_htb")], got[(node, "holds_stolen_address")]) == (1.0, 0.0), got
    rate = got[("w0", "received_mbit")]
    assert 0.5 * UNDO_RATE_MBIT <= rate <= 1.2 * UNDO_RATE_MBIT, rate  # unshaped: Gbit/s (loose: a loaded host)
    return rate


# -- a synthetic run's records -------------------------------------------------------------------
WORKER_SPEED = {"w0": 2.0, "w1": 1.0, "w2": 0.25}  # steps/s: w2 is the straggler
DURATION = 40
STEP_BYTES = 40_000
TRAFFIC_NODES = ["ps", "eval", "w0", "w1", "w2"]


def _write_csv(path: Path, columns: list[str], rows: list[list[Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)


def _step_rows() -> list[list[Any]]:
    rows = []
    for node, speed in WORKER_SPEED.items():
        n = int(DURATION * speed)
        for i in range(1, n + 1):
            t = round(i / speed, 3)
            loss = 2.3 * math.exp(-t / 15) + 0.1
            rows.append([t, node, i, loss, 32, 0.05, STEP_BYTES, STEP_BYTES, 0.8 / speed, 0.2 / speed, i - 1])
    return sorted(rows, key=lambda r: r[0])


def _eval_rows() -> list[list[Any]]:
    rows = []
    for k, t in enumerate(range(5, DURATION + 1, 5), start=1):
        acc = 0.95 - 0.8 * math.exp(-t / 12)
        rows.append([float(t), 14 * k, 14 * k, acc, 2.3 * math.exp(-t / 15) + 0.1, 1000])
    return rows


def _traffic_rows() -> list[list[Any]]:
    rows = []
    totals = {(n, d): 0 for n in TRAFFIC_NODES for d in ("up", "down")}
    for t in range(1, DURATION + 1):
        for node in TRAFFIC_NODES:
            for direction in ("up", "down"):
                if node == "ps":
                    delta = 125_000 * 3 if direction == "down" else 125_000 * 2  # ingress 3 Mbit/s
                else:
                    delta = 125_000 if direction == "up" else 60_000
                totals[(node, direction)] += delta
                rows.append([float(t), node, "access", direction, totals[(node, direction)], delta, t * 10])
    return rows


def make_run(
    root: Path,
    name: str = "run-a",
    *,
    steps: bool = True,
    evals: bool = True,
    traffic: bool = True,
    events: bool = True,
    target: float | None = 0.9,
) -> Path:
    run = root / name
    run.mkdir(parents=True)
    nodes = {
        "ps": {"role": "ps", "profile": {"cpus": 2.0}, "address": "10.0.0.2"},
        "eval": {"role": "evaluator", "profile": {}, "address": "10.0.0.3"},
        **{
            w: {"role": "worker", "profile": {"cpus": s}, "address": f"10.0.0.{10 + i}"}
            for i, (w, s) in enumerate(WORKER_SPEED.items())
        },
    }
    (run / "meta.json").write_text(json.dumps({"run_id": name, "nodes": nodes, "links": {}}))
    stop = {"seconds": DURATION} | ({"target_accuracy": target} if target is not None else {})
    (run / "scenario.yaml").write_text(json.dumps({"name": "synthetic", "stop": stop}))  # JSON is YAML
    if steps:
        _write_csv(run / "steps.csv", STEP_COLUMNS, _step_rows())
    if evals:
        _write_csv(run / "eval.csv", EVAL_COLUMNS, _eval_rows())
    if traffic:
        _write_csv(run / "traffic.csv", TRAFFIC_COLUMNS, _traffic_rows())
    if events:
        _write_csv(run / "events.csv", EVENT_COLUMNS, [[20.02, 20.0, "w2", "set_link", "rate=1mbit"]])
    summary = {
        "final_accuracy": _eval_rows()[-1][3], "best_accuracy": _eval_rows()[-1][3],
        "steps": 112, "wall_seconds": DURATION, "ps_ingress_bytes": 125_000 * 3 * DURATION,
        "workers": 3, "status": "completed", "reason": "seconds",
    }  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    return run
