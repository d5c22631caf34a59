"""`edgebed up`: make the cluster, run the roles, sample counters, report, always tear down."""

from __future__ import annotations

import json
import os
import platform
import secrets
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from testbed import __version__
from testbed.kernel import cgroups
from testbed.node.roles import role_target
from testbed.node.roles.common import RoleConfig
from testbed.node.transport import DelaySpec
from testbed.plan.cluster import ClusterSpec, build_cluster, peer_table
from testbed.plan.placement import place
from testbed.records import metrics
from testbed.runtimes import auto_note, runtime_class, select_runtime
from testbed.runtimes.preflight import preflight
from testbed.runtimes.state import RunState, cleanup_run
from testbed.scenario.schema import Scenario, scenario_to_yaml
from testbed.strategies import get_strategy_class

# `edgebed up`'s exit code for a run stopped by a condition its scenario set (on_worker_loss: stop);
# completed is 0, failed 1, interrupted 130.
EXIT_STOPPED = 3

PRELOAD = ["torch", "numpy", "zmq", "testbed.node.roles.ps", "testbed.node.roles.worker", "testbed.node.roles.peer",
           "testbed.node.roles.coordinator", "testbed.node.roles.evaluator", "testbed.data.datasets", "testbed.data.models",
           "testbed.data.partition", "testbed.strategies", "testbed.data.preload"]


def _exit_reason(node: str, code: Optional[int]) -> str:
    """A node's name with how it ended: an exit status, or the signal that killed it."""
    if code is None or code >= 0:
        return f"{node} (exit status {code})"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = ": out of memory? the kernel's OOM killer sends it (dmesg says)" if -code == signal.SIGKILL else ""
    return f"{node} (killed by {name}{hint})"


class Interrupted(Exception):
    pass


_RUNNER_PID = os.getpid()


def _raise_interrupted(signum, frame):
    # A forked copy of the runner (a library's helper process) must never run the
    # runner's teardown: only the runner itself turns the signal into an interrupt.
    if os.getpid() != _RUNNER_PID:
        os._exit(128 + signum)
    raise Interrupted(signal.Signals(signum).name)


class _Tail:
    """New complete lines appended to a CSV since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.header: Optional[list[str]] = None

    def rows(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.pos += end + 1
        out = []
        for line in data[:end].decode(errors="replace").splitlines():
            cells = line.split(",")
            if self.header is None:
                self.header = cells
                continue
            if len(cells) == len(self.header):
                out.append(dict(zip(self.header, cells)))
        return out


def default_run_dir(sc: Scenario) -> Path:
    return Path("runs") / f"{sc.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _versions() -> dict:
    import numpy
    import pyroute2
    import torch
    import zmq

    return {"edgebed": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "pyroute2": getattr(pyroute2, "__version__", "?"),
            "pyzmq": zmq.__version__}


def _host() -> dict:
    u = os.uname()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"hostname": u.nodename, "kernel": u.release, "machine": u.machine, "cpus": os.cpu_count(),
            "memory_bytes": mem}


def _delay_for(node, plans, spec: Optional[ClusterSpec] = None, wan_by_transport: bool = False,
               control: str = "") -> DelaySpec:
    """`control`: the down channel's URL, where the runner publishes this node's delay changes."""
    up, down = plans[node.name]["uplink"], plans[node.name]["downlink"]
    paths: dict[str, list[float]] = {}
    if spec is not None and wan_by_transport:
        # Latency the kernel cannot make: the receiver holds what crossed the WAN path, and what
        # came over a `links:` pair with a latency of its own (sums; jitters add in quadrature).
        def add(sender: str, d: float, j: float) -> None:
            if d or j:
                old = paths.get(sender, [0.0, 0.0])
                paths[sender] = [old[0] + d, (old[1] ** 2 + j ** 2) ** 0.5]

        if spec.topology is not None:
            for other in spec.nodes:
                if other.site != node.site:
                    add(other.name, *spec.topology.path_delay(other.site, node.site))
        for peer in node.link.downlink_peers:
            add(peer.peer, peer.direction.latency or 0.0, peer.direction.jitter or 0.0)
    return DelaySpec(up=up["transport_delay_s"], up_jitter=up["transport_jitter_s"],
                     down=down["transport_delay_s"], down_jitter=down["transport_jitter_s"], paths=paths,
                     control=control, node=node.name if control else "")


def run(sc: Scenario, scenario_path: str, run_dir: Path, *, say: Callable[[str], None] = print,
        progress_every: float = 2.0, tensorboard: Optional[Path] = None) -> dict:
    """Run one scenario end to end; returns the summary (also written to RUN/summary.json).
    `tensorboard`: a folder that gets the records as TensorBoard scalars while the run goes."""
    r = Run(sc, scenario_path, run_dir, say, progress_every)
    r.tensorboard = tensorboard
    return r.execute()


# What a runtime may add to a node's meta.json entry: its container or service and image, its clock's offset.
NODE_META_EXTRAS = ("container", "service", "image", "clock_offset_s", "clock_rtt_s", "kernel_features")


class Run:
    """One run from the runner's side: make the cluster, start its nodes, watch them until the
    scenario's stop, tear everything down (on success, error and Ctrl-C alike), summarize."""

    def __init__(self, sc: Scenario, scenario_path: str, run_dir: Path, say: Callable[[str], None],
                 progress_every: float):
        self.sc, self.scenario_path, self.say, self.progress_every = sc, str(scenario_path), say, progress_every
        self.t_invoked = time.time()
        preflight(sc)  # before anything is made: a need no engine here meets fails with the field named
        self.runtime_name = select_runtime(sc.runtime, say, sc)  # auto: the first that can run here and run sc
        self.run_dir = Path(run_dir).resolve()
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise FileExistsError(f"--out: {self.run_dir} exists and is not empty")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "scenario.yaml").write_text(scenario_to_yaml(sc))
        metrics.init_tables(self.run_dir)
        self.run_id = secrets.token_hex(3)
        self.state = RunState(run_id=self.run_id, runner_pid=os.getpid(), run_dir=str(self.run_dir),
                              scenario=self.scenario_path, runtime=self.runtime_name)
        self.state.save()
        self.decentralized = get_strategy_class(sc.algorithm.name).decentralized
        self.t0 = time.time()
        self.status, self.reason = "failed", "did not start"
        self.runtime = None
        self.spec: Optional[ClusterSpec] = None
        self.node_meta: dict = {}
        self.last_counters: dict = {}
        self.stop_event = None
        self.procs: dict = {}
        self.timeline = None
        self.relay = None  # an external broker's port, relayed from the run's gateway
        self.tensorboard: Optional[Path] = None  # where the records go as TensorBoard scalars, if anywhere
        self._tensorboard = None  # records.tensorboard.BackgroundFollower
        self.hub = None  # the runner's end of the control channel: the nodes' records come in there
        self.records_address = self.control_address = ""
        self.live = {"step": 0, "killed": set()}  # shared with the timeline: the global step, nodes killed on purpose

    def execute(self) -> dict:
        global _RUNNER_PID
        _RUNNER_PID = os.getpid()
        old_handlers = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            if self.tensorboard is not None:
                from testbed.records.tensorboard import BackgroundFollower

                self._tensorboard = BackgroundFollower(self.run_dir, Path(self.tensorboard))
            self.bring_up()
            self.start_nodes()
            self.status, self.reason = _monitor(self.sc, self.runtime, self.spec, self.procs, self.run_dir, self.t0,
                                                self.stop_event, self.say, self.progress_every, self.last_counters,
                                                self.live)
        except (KeyboardInterrupt, Interrupted) as e:
            self.status, self.reason = "stopped", f"interrupted ({str(e) or 'SIGINT'})"
            self.say("\ninterrupted: stopping the run and tearing down")
        except Exception as e:
            self.status, self.reason = "failed", f"{type(e).__name__}: {e}"
            raise
        finally:
            # Ignore further Ctrl-C while tearing down: a half teardown is the worst outcome.
            prev_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                summary = self.tear_down()
            finally:
                signal.signal(signal.SIGINT, prev_int)
                for s, h in old_handlers.items():
                    signal.signal(s, h)
        return summary

    def bring_up(self) -> None:
        sc, say = self.sc, self.say
        say(f"runtime: {self.runtime_name}" + auto_note(sc.runtime, self.runtime_name))
        self.runtime = runtime_class(self.runtime_name).open(self.state, say)
        self.runtime.use_packages(sc.packages)
        self.runtime.set_preload(PRELOAD)
        if self.runtime.features.shared_data:  # the forkserver loads the data once for every node (data/preload.py)
            from testbed.data.preload import request

            request(sc.workload.dataset, sc.seed, sc.workload.test_size)
        self.spec = place(build_cluster(sc, self.run_id), self.runtime.placer(sc))
        self.runtime.create(self.spec)
        self.hub = self.runtime.hub  # before any node starts: the nodes' rows come in here
        if self.hub is not None and not self.decentralized:
            self.hub.max_replica = 0  # no worker of this run hands in a replica: the hub takes none
        if self.hub is not None and sc.workload.command is not None:
            self.hub.open_reports()  # its programs report from any node (edgebed.report)
        self.records_address, self.control_address = self.runtime.channel_urls()
        self.node_meta = self.runtime.node_meta()
        self.meta = self.describe()
        (self.run_dir / "meta.json").write_text(json.dumps(self.meta, indent=1))
        say(f"run {self.run_id}: {len(self.spec.workers)} workers, {sc.algorithm.name}, {sc.workload.model} on "
            f"{sc.workload.dataset} -> {self.run_dir}")
        for w in self.meta.get("warnings", []):
            say(f"warning: {w}")
        if sc.network.verify_links:
            _check_links(self.runtime, self.spec, self.node_meta, self.run_dir, self.meta, say)

    def describe(self) -> dict:
        """meta.json: what was run, where, on what, and how each link was made."""
        sc, spec, runtime, node_meta = self.sc, self.spec, self.runtime, self.node_meta
        meta = {
            "run_id": self.run_id, "scenario": self.scenario_path, "name": sc.name, "runtime": self.runtime_name,
            "started": self.t0, "versions": _versions(), "host": _host(),
            "kernel_features": asdict(runtime.caps), "image": runtime.image,
            "cgroup_version": 2 if cgroups.is_v2() else 1,
            "nodes": {n.name: {"role": n.role, "rank": n.rank, "address": n.address, "profile_name": n.profile_name,
                               "profile": n.profile.model_dump(mode="json", exclude_none=True),
                               "netns": node_meta[n.name]["netns"], "compute": node_meta[n.name]["compute"],
                               "threads": sc.workload.threads or n.threads, "host": n.host,
                               **{k: v for k, v in node_meta[n.name].items() if k in NODE_META_EXTRAS}}
                      for n in spec.nodes},
            "links": {name: {"uplink": m["uplink"], "downlink": m["downlink"]} for name, m in node_meta.items()},
        }
        if spec.topology is not None:
            meta["topology"] = {**_topology_meta(spec), **(runtime.topology_meta() or {})}
            for n in spec.nodes:
                meta["nodes"][n.name]["site"] = n.site
        warnings = ([] if runtime.caps.netem else [_no_netem_warning(node_meta)]) + runtime.warnings
        if warnings:
            meta["warnings"] = warnings
        return meta

    def start_nodes(self) -> None:
        """The stream source first (when streaming), then the PS, the evaluator and the workers,
        then the timeline of events."""
        spec = self.spec
        self.stop_event = self.runtime.make_stop_event()
        self.stream = _stream_config(self.sc, spec)
        if self.stream:
            self.meta["streaming"] = {k: self.stream[k] for k in ("kind", "bootstrap", "rates", "schedules", "topics")}
            (self.run_dir / "meta.json").write_text(json.dumps(self.meta, indent=1))
            (self.run_dir / "logs").mkdir(exist_ok=True)
        self.t0 = time.time()  # records count from the moment nodes start
        if self.stream.get("kind") == "external":
            self.relay = _relay_external_broker(self.sc, self.runtime, self.say)
        if self.stream:
            _start_streams(self.sc, spec, self.stream, self.start_node, self.procs, self.hub.ready, self.say)
        for node in [spec.ps, spec.evaluator] + spec.workers:
            self.start_node(node)
        self.timeline = _start_timeline(self.sc, self.runtime, spec, self.procs, self.run_dir, self.t0,
                                        self.start_node, self.live, self.say)

    def _close_hub(self) -> None:
        self.hub.drain()
        self.hub.close()
        if self.hub.dropped:
            self.say(f"records: {self.hub.dropped} malformed message(s) from the nodes dropped")

    def _log_path(self, node) -> str:
        """A command workload's output file, where the nodes run on this host (netns)."""
        if self.sc.workload.command is None or not self.runtime.features.same_host:
            return ""
        (self.run_dir / "logs").mkdir(exist_ok=True)
        return str(self.run_dir / "logs" / f"{node.name}.log")

    def start_node(self, node) -> None:
        """Start (or restart) one node's role."""
        sc, spec = self.sc, self.spec
        cfg = RoleConfig(node=node.name, role=node.role, rank=node.rank, run_dir=str(self.run_dir), t0=self.t0,
                         scenario=sc.model_dump(mode="json"), ps_address=spec.ps.address,
                         threads=sc.workload.threads or node.threads,
                         delay=_delay_for(node, self.node_meta, spec, not self.runtime.caps.netem,
                                          control=self.control_address),
                         workers=[n.name for n in spec.workers], peers=peer_table(spec, node), stream=self.stream,
                         target=role_target(node.role, self.decentralized, sc.workload.command is not None),
                         addresses={n.name: n.address for n in spec.nodes}, records=self.records_address,
                         control=self.control_address, log_path=self._log_path(node))
        self.procs[node.name] = self.runtime.start_node(node, cfg, self.stop_event)

    def tear_down(self) -> dict:
        """Stop the timeline and the nodes, take the last counters, remove everything, and write
        summary.json. Each step is guarded on its own: whatever fails (a full disk), the cluster
        is still removed."""
        t_teardown = time.time()
        self._guarded("the timeline", self._stop_timeline)
        if self.stop_event is not None:
            self._guarded("the stop event", self.stop_event.set)
        if self.runtime is not None:
            self._guarded("stopping the nodes", lambda: self.runtime.stop_processes(grace=10.0))
        if self.relay is not None:
            self._guarded("the broker relay", self.relay.close)
        if self.hub is not None:  # the nodes' last rows, before the tables are read
            self._guarded("the nodes' records", self._close_hub)
        if self.runtime is not None:
            if self.spec is not None:
                self._guarded("the last counters", lambda: _sample(self.runtime, self.spec, self.run_dir, self.t0,
                                                                   self.last_counters))
            problems = self._guarded("the teardown", self.runtime.teardown) or []
        else:
            problems = self._guarded("the clean-up", lambda: cleanup_run(self.run_id, self.state, stop_runner=False))
        if problems:
            self.say("teardown problems (run `edgebed down`): " + "; ".join(problems))
        summary = self._summary(t_teardown)
        self._guarded("summary.json", lambda: (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1)))
        if self._tensorboard is not None:  # the last rows
            self._guarded("the TensorBoard scalars", self._tensorboard.stop)
        return summary

    def _stop_timeline(self) -> None:
        if self.timeline is not None:
            self.timeline.stop()
            if self.timeline.errors:
                self.say("timeline: " + "; ".join(self.timeline.errors))

    def _guarded(self, what: str, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except Exception as e:
            self.say(f"teardown: {what} failed: {type(e).__name__}: {e}")
            if self.status != "failed":
                self.status, self.reason = "failed", f"{what} failed at teardown: {type(e).__name__}: {e}"
            return None

    def _summary(self, t_teardown: float) -> dict:
        try:
            summary = _summarize(self.sc, self.run_dir, self.t0, self.status, self.reason, self.last_counters,
                                 self.spec)
        except Exception as e:  # unreadable records (a full disk): the status, and why
            summary = {"status": "failed", "reason": f"{self.reason}; records unreadable: {type(e).__name__}: {e}",
                       "run_dir": str(self.run_dir)}
        summary["runtime"] = self.runtime_name
        if self.hub is not None:  # the nodes' rows that came over the control network
            summary["record_rows"] = {"received": self.hub.rows, "dropped": self.hub.dropped}
            summary["control_dropped"] = _control_drops(self.hub)
        if self.timeline is not None:  # changes applied, failed, and requests refused
            summary["timeline"] = dict(self.timeline.counts)
        summary["teardown_seconds"] = round(time.time() - t_teardown, 3)
        first = summary.pop("_first_step_time", None)
        summary["startup_seconds"] = round(self.t0 - self.t_invoked + first, 3) if first is not None else None
        return summary


def _control_drops(hub) -> dict[str, int]:
    """What the control channel dropped, by reason: the hub's, and each supervisor's as it last
    said ("w1 supervisor: not JSON")."""
    out = dict(hub.drops)
    for node, counts in sorted(hub.node_drops.items()):
        out.update({f"{node} supervisor: {reason}": n for reason, n in counts.items()})
    return out


def _topology_meta(spec: ClusterSpec) -> dict:
    topo = spec.topology
    return {
        "sites": {s.name: {"subnet": s.subnet, "router": s.router,
                           "nodes": [n.name for n in spec.nodes if n.site == s.name]} for s in topo.sites},
        "wan_links": [{"between": [e.a, e.b], "addresses": [e.a_address, e.b_address],
                       "forward": e.forward.model_dump(exclude_none=True),
                       "reverse": e.reverse.model_dump(exclude_none=True)} for e in topo.edges],
    }


def _check_links(runtime, spec: ClusterSpec, node_meta: dict, run_dir: Path, meta: dict, say) -> None:
    """--verify-links: measure the paths before training starts (testbed/run/verify.py)."""
    from testbed.run import verify

    tolerance = 0.10
    started = time.time()
    delays = {n.name: _delay_for(n, node_meta, spec, not runtime.caps.netem) for n in spec.nodes}
    # (a container waits for its role's first request meanwhile; the measurements run as exec jobs)
    # Flows run together only in namespaces: in containers 4 at once read 60-100% of their rates
    # (each exec'd measuring process under its container's quota), one at a time 91-100%.
    rows = verify.verify_links(runtime, spec, delays, runtime.mailbox("link_check"), tolerance=tolerance, say=say,
                               together=runtime.features.concurrent_flows)
    verify.write(rows, run_dir)
    meta["link_check"] = verify.summary(rows, tolerance, time.time() - started)
    warnings = verify.warnings_for(rows, tolerance)
    if warnings:
        meta.setdefault("warnings", []).extend(warnings)
        for w in warnings:
            say(f"warning: {w}")
    (run_dir / "meta.json").write_text(json.dumps(meta, indent=1))


def _stream_config(sc: Scenario, spec: ClusterSpec) -> dict:
    """Per-device topics, rates and rate schedules of a streaming scenario (empty dict when not streaming).

    `rates` are the devices' nominal (initial) rates; `schedules` their rate over the run's
    time (seconds since the nodes started, as in the records): constant, or a trace.
    """
    if sc.streaming is None:
        return {}
    from testbed.data.streaming.broker import KAFKA_PORT
    from testbed.data.streaming.rates import device_schedules, parse_rate_spec, schedule_for

    workers = [n.name for n in spec.workers]
    st = sc.streaming
    if isinstance(st.rates, list):
        schedules = [schedule_for(parse_rate_spec(r)) for r in st.rates]
    else:
        schedules = device_schedules(parse_rate_spec(st.rates), len(workers), sc.seed)
    bootstrap = st.broker.bootstrap if st.broker.kind == "external" else f"{spec.broker.address}:{KAFKA_PORT}"
    return {"bootstrap": bootstrap, "kind": st.broker.kind,
            "topics": {w: f"edgebed-{spec.run_id}-{w}" for w in workers},
            "rates": {w: s.rates[0] for w, s in zip(workers, schedules)},
            "schedules": {w: {"times": list(s.times), "rates": list(s.rates)} for w, s in zip(workers, schedules)}}


def _relay_external_broker(sc: Scenario, runtime, say):
    """The external broker's one port, from the run's gateway to where this host reaches it."""
    from testbed.data.streaming.broker import wait_for_port
    from testbed.runtimes.relay import PortRelay
    from testbed.scenario.schema import split_host_port

    broker = sc.streaming.broker
    (gateway, port), upstream = split_host_port(broker.bootstrap), split_host_port(broker.upstream)
    if not wait_for_port(*upstream, 20.0):  # the relay would accept and close: say it here
        raise RuntimeError(f"the streams did not come up: the external broker at {broker.upstream} (upstream of "
                           f"{broker.bootstrap}) did not accept connections within 20 s")
    relay = PortRelay(runtime.gateway_netns(), gateway, port, upstream)
    say(f"relaying {gateway}:{port} on the run's network to the external broker at {broker.upstream} (that port only)")
    return relay


def _start_streams(sc: Scenario, spec: ClusterSpec, stream: dict, start, procs: dict, ready: set, say) -> None:
    """The streams must exist before anyone trains: broker and producers come up first (the
    stream source says it is ready over the control channel: `ready`, filled by the hub)."""
    broker, source = spec.broker, spec.stream_source
    if broker is not None:
        start(broker)
    if source is not broker:
        start(source)
    # Kafka (a JVM) takes a while to start; the producer node waits for its port.
    limit = 180 if stream["kind"] == "kafka" else 60
    deadline = time.time() + limit
    while source.name not in ready:
        dead = [n.name for n in (broker, source) if n is not None and not procs[n.name].is_alive()]
        if dead:
            raise RuntimeError(f"the streams did not come up: node(s) {', '.join(dead)} exited "
                               f"(its error is above; with docker in RUN/logs/{dead[0]}.log)")
        if time.time() > deadline:
            raise RuntimeError(f"the streams did not come up within {limit} s "
                               f"(broker {stream['bootstrap']})")
        time.sleep(0.05)
    traced = [w for w, s in stream["schedules"].items() if len(s["rates"]) > 1]
    say(f"{stream['kind']} broker at {stream['bootstrap']}, {len(stream['topics'])} topics, rates "
        + ", ".join(f"{w} {r:.0f}/s" for w, r in stream["rates"].items())
        + (f" (then following a trace: {', '.join(traced)})" if traced else ""))


def _no_netem_warning(node_meta: dict) -> str:
    """What a kernel (some host's, on swarm) without sch_netem did to latency and loss."""
    lost = [f"{n} {d}" for n, m in node_meta.items() for d in ("uplink", "downlink")
            if m[d]["mechanisms"].get("loss", "").startswith("not-applied")]
    loss = (f"loss is NOT applied on {', '.join(lost)} (no usable eBPF filter either)" if lost
            else "loss (where a link has it) by an eBPF drop filter")
    return f"a kernel without sch_netem: latency/jitter are applied by edgebed's transport (per message); {loss}"


def _sample(runtime, spec: ClusterSpec, run_dir: Path, t0: float, last: dict) -> None:
    now = time.time() - t0
    try:
        counters = runtime.counters()
    except Exception:
        return
    traffic = metrics.open_table(run_dir, "traffic.csv")
    res = metrics.open_table(run_dir, "resources.csv")
    try:
        for name, c in counters.items():
            prev = last.get(name, {"up_bytes": 0, "down_bytes": 0})
            at = c["time"] - t0 if "time" in c else now  # a remote node's own reading time
            for d in ("up", "down"):
                traffic.write(time=at, node=name, link="access", direction=d, bytes=c[f"{d}_bytes"],
                              delta_bytes=c[f"{d}_bytes"] - prev[f"{d}_bytes"], packets=c[f"{d}_packets"])
            last[name] = c
        # WAN links, one row per direction from each router's end: node = site, link = wan:<peer site>,
        # up = towards the peer (only the sending end's "up" is written: each byte is counted once)
        wan = runtime.wan_counters()
        for (site, peer), c in wan.items():
            key = f"wan:{site}->{peer}"
            prev = last.get(key, {"up_bytes": 0})
            at = c["time"] - t0 if "time" in c else now
            traffic.write(time=at, node=site, link=f"wan:{peer}", direction="up", bytes=c["up_bytes"],
                          delta_bytes=c["up_bytes"] - prev["up_bytes"], packets=c["up_packets"])
            last[key] = c
        for name, use in runtime.usage().items():
            res.write(time=now, node=name, cpu_seconds=use.cpu_seconds, memory_bytes=use.memory_bytes,
                      throttled_seconds=use.throttled_seconds, gpu_memory_bytes=use.gpu_memory_bytes,
                      gpu_util=use.gpu_util)
    finally:
        traffic.close()
        res.close()


def _start_timeline(sc, runtime, spec, procs, run_dir, t0, start, live, say):
    """The scenario's events, applied by a thread of this process when due, and the requests of
    `edgebed link/kill/...` (timeline.py)."""
    from testbed.records.columns import CONTROL_DIR
    from testbed.run.timeline import Timeline, expand_events

    table = metrics.open_table(run_dir, "events.csv")

    def apply(change) -> str:
        n, f = change.node, change.fields
        if change.action == "link":
            return runtime.set_link(n, f["direction"], {k: v for k, v in f.items() if k != "direction"})
        if change.action == "cpu":
            return runtime.set_cpus(n, f["cpus"])
        if change.action == "stress":
            return runtime.set_stress(n, f["load"])
        if change.action in ("pause", "resume"):
            return runtime.freeze(n, change.action == "pause")
        if change.action in ("partition", "heal"):
            return runtime.partition(n, f.get("peers", []), change.action == "partition")
        if change.action == "kill":
            live["killed"].add(n)
            return runtime.kill_node(n)
        if change.action == "restart":
            detail = ""
            if procs[n].is_alive():
                live["killed"].add(n)
                detail = runtime.kill_node(n) + "; "
                procs[n].join(timeout=5)
            start(spec.node(n))  # a new role process: a worker says hello and pulls the current model
            live["killed"].discard(n)
            return detail + "started again"
        raise ValueError(f"unknown action {change.action}")

    def record(change, applied_at: float, detail: str) -> None:
        when = f"at_step {change.step}; " if change.step is not None else \
            f"{change.source}; " if change.time is None else ""
        table.write(time=applied_at, scheduled_time=change.time, target=change.node, action=change.action,
                    detail=f"{when}{change.describe()} -> {detail}".strip())
        say(f"[{applied_at:7.1f}s] event {change.action} {change.node}: {detail}")

    timeline = Timeline(expand_events(sc), apply, record, t0, step=lambda: live["step"],
                        control_dir=run_dir / CONTROL_DIR, inbox=runtime.hub.take_requests if runtime.hub else None)
    timeline.start()
    return timeline


def _monitor(sc, runtime, spec, procs, run_dir, t0, stop_event, say, progress_every, last_counters, live=None):
    steps_tail = _Tail(run_dir / "steps.csv")
    eval_tail = _Tail(run_dir / "eval.csv")
    decentralized = get_strategy_class(sc.algorithm.name).decentralized
    hard_deadline = t0 + (sc.stop.seconds or 24 * 3600) + 300
    worker_steps = {}
    last_loss = None
    last_eval = None
    next_progress = time.time() + progress_every
    next_sample = time.time()
    ps = procs["ps"]
    while True:
        now = time.time()
        if now >= next_sample:
            _sample(runtime, spec, run_dir, t0, last_counters)
            next_sample += 1.0
        for row in steps_tail.rows():
            worker_steps[row["node"]] = int(row["step"])
            last_loss = row["loss"]
            if live is not None and row.get("model_version") not in (None, ""):
                live["step"] = max(live["step"], int(row["model_version"]))
        for row in eval_tail.rows():
            last_eval = row
        if now >= next_progress:
            acc = f"acc {float(last_eval['accuracy']):.3f} @ {last_eval['step']}" if last_eval else "acc -"
            loss = f"loss {float(last_loss):.3f}" if last_loss else "loss -"
            if decentralized:  # no PS: what the workers put on their links
                out = sum(last_counters.get(n.name, {}).get("up_bytes", 0) for n in spec.workers)
                traffic = f"workers out {out / 1e6:8.2f} MB"
            else:
                traffic = f"PS in {last_counters.get('ps', {}).get('down_bytes', 0) / 1e6:8.2f} MB"
            say(f"[{now - t0:7.1f}s] worker steps {sum(worker_steps.values()):6d}  {loss}  {acc}  {traffic}")
            next_progress += progress_every
        if not ps.is_alive():
            break
        killed = live["killed"] if live is not None else set()
        if killed & {"broker", "producer"}:  # the workers' streams are gone with it: no run to go on with
            stop_event.set()
            ps.join(timeout=30)
            return "failed", f"the stream {'broker' if 'broker' in killed else 'producer'} was killed (a timeline " \
                             "event): the workers' streams end with it"
        dead = [n for n, p in procs.items()
                if n != "ps" and n not in killed and not p.is_alive() and p.exitcode not in (0, None)]
        if dead:
            stop_event.set()
            ps.join(timeout=30)
            return "failed", f"node(s) {', '.join(_exit_reason(n, procs[n].exitcode) for n in dead)} exited with an error"
        if sc.workload.command is not None and _commands_done(procs, spec, killed, sc.workload.command):
            stop_event.set()  # the ps role ends the run (stop_reason "commands")
        if now > hard_deadline:
            stop_event.set()
            return "stopped", "runner deadline passed"
        time.sleep(0.2)
    if ps.exitcode != 0:
        if live is not None and "ps" in live["killed"]:
            return "failed", "the parameter server was killed (a timeline event): the run cannot go on"
        return "failed", f"parameter server exited with code {ps.exitcode}"
    try:
        ps_info = json.loads((run_dir / "ps.json").read_text())
    except (OSError, ValueError):
        ps_info = {}
    why = ps_info.get("stop_reason")
    return ("completed" if why in ("steps", "seconds", "target_accuracy", "commands") else "stopped"), why or "unknown"


def _commands_done(procs: dict, spec, killed: set, commands: dict) -> bool:
    """A command workload's driver (the evaluator's program) has ended well, or without one, its
    workers' programs all have (a killed one does not count)."""
    if "evaluator" in commands:
        watched = [n.name for n in spec.nodes if n.role == "evaluator" and n.name in procs]
    else:
        watched = [n.name for n in spec.workers if n.name in procs and n.name not in killed]
    return bool(watched) and all(not procs[n].is_alive() and procs[n].exitcode == 0 for n in watched)


def _summarize(sc, run_dir: Path, t0: float, status: str, reason: str, counters: dict, spec) -> dict:
    from testbed.records.reader import load_run

    rec = load_run(run_dir)
    ev = rec.evals.sort_values("step") if len(rec.evals) else rec.evals
    try:
        ps_info = json.loads((run_dir / "ps.json").read_text())
    except (OSError, ValueError):
        ps_info = {}
    target = sc.stop.target_accuracy
    ttt = None
    if target is not None and len(ev):
        hit = ev[ev["accuracy"] >= target]
        ttt = float(hit["time"].min()) if len(hit) else None
    return {
        "status": status,
        "reason": reason,
        "final_accuracy": float(ev["accuracy"].iloc[-1]) if len(ev) else None,
        "best_accuracy": float(ev["accuracy"].max()) if len(ev) else None,
        "time_to_target_seconds": ttt,
        "steps": ps_info.get("version"),
        "updates_received": ps_info.get("updates_received"),
        "worker_steps": int(len(rec.steps)),
        "_first_step_time": float(rec.steps["time"].min()) if len(rec.steps) else None,
        "wall_seconds": round(time.time() - t0, 3),
        "ps_ingress_bytes": counters.get("ps", {}).get("down_bytes"),  # wire bytes into the PS
        "ps_ingress_payload_bytes": ps_info.get("ingress_payload_bytes"),
        # messages the PS (or coordinator) dropped unread or refused: malformed, or from no node of the run
        "messages_dropped": sum((ps_info.get("messages_dropped") or {}).values()),
        "ps_egress_bytes": counters.get("ps", {}).get("up_bytes"),
        # wire bytes out of all workers (a decentralized run's whole exchange)
        "worker_egress_bytes": sum(counters.get(n.name, {}).get("up_bytes", 0) for n in spec.workers) if spec else None,
        "decentralized": bool(ps_info.get("decentralized", False)),
        "workers": len(spec.workers) if spec else sc.n_workers,
        "algorithm": sc.algorithm.name,
        "run_dir": str(run_dir),
    }
