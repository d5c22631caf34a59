"""`edgebed up`: make the cluster, run the roles, sample counters, report, always tear down.

`Run.execute` is the sequence: `bring_up` (the runtime opens and makes the planned cluster;
meta.json), `start_nodes` (streams first, then the roles, then the timeline: events.py),
`watch` (monitor.py: counters, progress, the conditions that end a run), `tear_down` (every
step guarded; summary.json: summary.py). Planning stays in plan/ (delays.py, streams.py); what a
timeline change does to the cluster is the live-ops object's (runtimes.live.LiveOps.apply_change).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from testbed.kernel import cgroups
from testbed.kernel.files import replace_text
from testbed.node.roles import role_target
from testbed.node.roles.common import RoleConfig
from testbed.node.transport import DelaySpec
from testbed.plan.availability import plan_offline
from testbed.plan.cluster import ClusterSpec, Node, build_cluster, peer_table
from testbed.plan.delays import transport_delays
from testbed.plan.placement import place
from testbed.plan.streams import stream_config
from testbed.records import metrics
from testbed.records.virtual import world_row
from testbed.run import devices as run_devices, meta as run_meta
from testbed.run.cpu_fit import oversubscription_warnings
from testbed.run.dilation import choose_dilation, unstated_speed_warning
from testbed.run.events import Events
from testbed.run.interrupts import Interrupted, interrupting_signals, shielded_teardown
from testbed.run.monitor import LiveState, Monitor, Sampler
from testbed.run.progress import FleetProgress
from testbed.run.streams import relay_external_broker, start_streams
from testbed.run.summary import control_drops, ps_info, summarize
from testbed.run.timeline import event_trace_tick
from testbed.run.trainers import Trainers
from testbed.runtimes import auto_note, runtime_class, select_runtime
from testbed.runtimes.preflight import files_needed, may_raise_limits, preflight
from testbed.runtimes.replay import start_replay
from testbed.runtimes.state import RunState, cleanup_run
from testbed.scenario.dilation import factor, wall_scenario
from testbed.scenario.schema import Scenario, scenario_to_yaml
from testbed.strategies import get_strategy_class, make_strategy

PRELOAD = ["torch", "numpy", "zmq", "testbed.node.roles.ps", "testbed.node.roles.worker", "testbed.node.roles.peer",
           "testbed.node.roles.coordinator", "testbed.node.roles.evaluator", "testbed.data.datasets",
           "testbed.data.models", "testbed.data.partition", "testbed.strategies", "testbed.data.preload",
           "testbed.data.plugin_preload"]


def default_run_dir(sc: Scenario) -> Path:
    return Path("runs") / f"{sc.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(sc: Scenario, scenario_path: str, run_dir: Path, *, say: Callable[[str], None] = print,
        progress_every: float = 2.0, tensorboard: Optional[Path] = None, bars: bool = False) -> dict:
    """Run one scenario end to end; returns the summary (also written to RUN/summary.json).
    `tensorboard`: a folder that gets the records as TensorBoard scalars while the run goes.
    `bars`: a fleet's bring-up and teardown as progress bars (a terminal), else as lines to `say`."""
    r = Run(sc, scenario_path, run_dir, say, progress_every)
    r.tensorboard, r.bars = tensorboard, bars
    return r.execute()


FLEET_NODES = 200  # from this many nodes on, bring-up and teardown show how far they have got


def raise_open_files(needed: int) -> None:
    """The runner's soft open-file limit up to its hard one (a soft 1,024 is common; a fleet holds
    several files a node), and with CAP_SYS_RESOURCE the hard one up to what `needed` files take
    (preflight checked that fs.nr_open allows it: 4,096 nodes need more than a hard 20,000)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed > hard and may_raise_limits():
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
            return
        except (ValueError, OSError):  # past fs.nr_open: the hard limit it has
            pass
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Run:
    """One run from the runner's side: make the cluster, start its nodes, watch them until the
    scenario's stop, tear everything down (on success, error and Ctrl-C alike), summarize."""

    def __init__(self, sc: Scenario, scenario_path: str, run_dir: Path, say: Callable[[str], None],
                 progress_every: float):
        self.scenario_path, self.say, self.progress_every = str(scenario_path), say, progress_every
        self.t_invoked = time.time()
        # `world`: the scenario as stated (what the nodes are told and the records are in); `sc`:
        # as the wall runs it, every time x k and rate / k (scenario.dilation)
        self.dilation_auto = isinstance(sc.dilation, str)
        self.world = choose_dilation(sc, say)
        self.dilation = factor(self.world)
        self.sc = sc = wall_scenario(self.world, self.dilation)
        preflight(sc)  # before anything is made: a need no engine here meets fails with the field named
        raise_open_files(files_needed(len(sc.node_names())))  # a fleet's: the limit preflight checked
        self.runtime_name = select_runtime(sc.runtime, say, sc)  # auto: the first that can run here and run sc
        self.run_dir = Path(run_dir).resolve()
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise FileExistsError(f"--out: {self.run_dir} exists and is not empty")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        replace_text(self.run_dir / "scenario.yaml", scenario_to_yaml(self.world))
        metrics.init_tables(self.run_dir)
        self.run_id = secrets.token_hex(3)
        self.state = RunState(run_id=self.run_id, runner_pid=os.getpid(), run_dir=str(self.run_dir),
                              scenario=self.scenario_path, runtime=self.runtime_name)
        self.state.save()
        self.decentralized = get_strategy_class(sc.algorithm.name).decentralized
        # the strategy, asked what the runner does for it: trainers started per round (fedavg
        # `trainers: per_round`, run/trainers.py), how many workers run at once
        self.strategy = make_strategy(sc.algorithm.name, sc.algorithm.params, seed=sc.seed)
        self.per_round = self.strategy.per_round
        self.trainers: Optional[Trainers] = None
        self.offline: dict[str, list[list[float]]] = {}  # each device's offline intervals, for the PS
        self.t0 = time.time()
        self.status, self.reason = "failed", "did not start"
        self.runtime = None
        self.spec: Optional[ClusterSpec] = None
        self.node_meta: dict = {}
        self.calibrations: dict = {}  # meta.json's `device` of each node with a device profile (run/devices.py)
        self.last_counters: dict = {}
        self.stop_event = None
        self.procs: dict = {}
        self.timeline = None
        self.replay = None  # recorded link traces, replayed every tick (runtimes.replay)
        self.relay = None  # an external broker's port, relayed from the run's gateway
        self.bars = False  # a fleet's bring-up and teardown as bars (a terminal), else as lines
        self.tensorboard: Optional[Path] = None  # where the records go as TensorBoard scalars, if anywhere
        self._tensorboard = None  # records.tensorboard.BackgroundFollower
        self.hub = None  # the runner's end of the control channel: the nodes' records come in there
        self.records_address = self.control_address = ""
        self.live = LiveState()  # shared by the monitor and the timeline: the global step, nodes killed on purpose

    def execute(self) -> dict:
        with interrupting_signals():  # SIGTERM and SIGHUP as Ctrl-C: run/interrupts.py
            try:
                if self.tensorboard is not None:
                    from testbed.records.tensorboard import BackgroundFollower

                    self._tensorboard = BackgroundFollower(self.run_dir, Path(self.tensorboard))
                self.bring_up()
                self.start_nodes()
                self.status, self.reason = self.watch()
            except (KeyboardInterrupt, Interrupted) as e:
                self.status, self.reason = "stopped", f"interrupted ({str(e) or 'SIGINT'})"
                self.say("\ninterrupted: stopping the run and tearing down")
            except Exception as e:
                self.status, self.reason = "failed", f"{type(e).__name__}: {e}"
                raise
            finally:
                with shielded_teardown():  # further Ctrl-C ignored: a half teardown is the worst outcome
                    summary = self.tear_down()
        return summary

    def bring_up(self) -> None:
        sc, say = self.sc, self.say
        say(f"runtime: {self.runtime_name}" + auto_note(sc.runtime, self.runtime_name))
        self.runtime = runtime_class(self.runtime_name).open(self.state, say)
        self.runtime.use_packages(sc.packages)
        self.runtime.set_preload(PRELOAD)
        if self.runtime.features.shared_data:  # the forkserver loads the data once for every node (data/preload.py)
            from testbed.data.preload import request

            request(sc.workload.dataset, sc.seed, sc.workload.test_size, sc.workload.model)
            from testbed.data import plugin_preload

            plugin_preload.request({"algorithm": sc.algorithm.name, "model": sc.workload.model,
                                    "dataset": sc.workload.dataset})
        self.spec = place(build_cluster(sc, self.run_id), self.runtime.placer(sc))
        self._make_nodes()
        self.hub = self.runtime.hub  # before any node starts: the nodes' rows come in here
        if self.hub is not None and not self.decentralized:
            self.hub.max_replica = 0  # no worker of this run hands in a replica: the hub takes none
        if self.hub is not None and sc.workload.command is not None:
            self.hub.open_reports(sc.workload.eval_role)  # its programs report from any node (edgebed.report)
        self.records_address, self.control_address = self.runtime.channel_urls()
        self.calibrations, device_warnings = run_devices.calibrate_devices(self.runtime, sc, self.spec, say)
        self.runtime.warnings.extend(device_warnings)
        self.node_meta = self.runtime.node_meta()
        self.meta = self.describe()
        replace_text(self.run_dir / "meta.json", json.dumps(self.meta, indent=1))
        say(f"run {self.run_id}: {len(self.spec.workers)} workers, {sc.algorithm.name}, {sc.workload.model} on "
            f"{sc.workload.dataset} -> {self.run_dir}")
        for w in self.meta.get("warnings", []):
            say(f"warning: {w}")
        if sc.network.verify_links:
            self.verify_links()

    def _make_nodes(self) -> None:
        """The runtime's create; a fleet's shows how far it has got (a minute of silence otherwise)."""
        if len(self.spec.nodes) < FLEET_NODES:
            self.runtime.create(self.spec)
            return
        self.say(f"making {len(self.spec.nodes)} nodes (namespaces, links, limits, the control network)...")
        t_make = time.time()
        self.runtime.progress = progress = FleetProgress(self.say, self.bars)
        try:
            self.runtime.create(self.spec)
        finally:
            progress.close()
        self.say(f"made {len(self.spec.nodes)} nodes in {time.time() - t_make:.1f} s")

    def describe(self) -> dict:
        """meta.json: what was run, where, on what, and how each link was made."""
        sc, spec, runtime, node_meta = self.sc, self.spec, self.runtime, self.node_meta
        meta = {
            "run_id": self.run_id, "scenario": self.scenario_path, "name": sc.name, "runtime": self.runtime_name,
            "started": self.t0, "versions": run_meta.versions(), "host": run_meta.host(),
            "dilation": run_meta.dilation_meta(self.dilation, self.dilation_auto),
            "kernel_features": asdict(runtime.caps), "image": runtime.image,
            "cgroup_version": 2 if cgroups.is_v2() else 1,
            "nodes": run_meta.nodes_meta(sc, spec, node_meta),
            "links": {name: {"uplink": m["uplink"], "downlink": m["downlink"]} for name, m in node_meta.items()},
        }
        run_devices.describe(spec, self.calibrations, meta["nodes"])
        if spec.topology is not None:
            meta["topology"] = {**run_meta.topology_meta(spec), **(runtime.topology_meta() or {})}
            for n in spec.nodes:
                meta["nodes"][n.name]["site"] = n.site
        warnings = ([] if runtime.caps.netem else [run_meta.no_netem_warning(node_meta)]) + runtime.warnings
        at_once = self.strategy.trainers_at_once(len(spec.workers))
        warnings += oversubscription_warnings(spec, workers_at_once=at_once)  # promised CPU over a host's cores
        unstated = unstated_speed_warning(self.world, self.dilation)
        warnings += [unstated] if unstated else []
        if warnings:
            meta["warnings"] = warnings
        return meta

    def verify_links(self) -> None:
        """--verify-links: measure the paths before training starts (testbed/run/verify.py)."""
        from testbed.run import verify

        runtime, say = self.runtime, self.say
        tolerance = 0.10
        started = time.time()
        delays = {n.name: self.delays(n) for n in self.spec.nodes}
        # (a container waits for its role's first request meanwhile; the measurements run as exec jobs)
        # Flows run together only in namespaces: in containers, flows at once read well under their
        # rates (each exec'd measuring process runs under its container's quota).
        rows = verify.verify_links(runtime, self.spec, delays, runtime.mailbox("link_check"), tolerance=tolerance,
                                   say=say, together=runtime.features.concurrent_flows)
        rows = [world_row("link_check.csv", r, self.dilation) for r in rows]  # measured on the wall
        verify.write(rows, self.run_dir)
        self.meta["link_check"] = verify.summary(rows, tolerance, time.time() - started)
        warnings = verify.warnings_for(rows, tolerance)
        if warnings:
            self.meta.setdefault("warnings", []).extend(warnings)
            for w in warnings:
                say(f"warning: {w}")
        replace_text(self.run_dir / "meta.json", json.dumps(self.meta, indent=1))

    def start_nodes(self) -> None:
        """The stream source first (when streaming), then the PS, the evaluator and the workers,
        then the timeline of events."""
        spec = self.spec
        self.stop_event = self.runtime.make_stop_event()
        self.stream = stream_config(self.sc, spec)
        if self.stream:
            self.meta["streaming"] = {k: self.stream[k] for k in ("kind", "bootstrap", "rates", "schedules", "topics")}
            replace_text(self.run_dir / "meta.json", json.dumps(self.meta, indent=1))
            (self.run_dir / "logs").mkdir(exist_ok=True)
        self.t0 = time.time()  # records count from the moment nodes start
        if self.stream.get("kind") == "external":
            self.relay = relay_external_broker(self.sc, self.runtime, self.say)
        if self.stream:
            start_streams(spec, self.stream, self.start_node, self.procs, self.hub.ready, self.say)
        if self.per_round and self.sc.availability:  # the PS selects among the devices online
            self.offline = {n: [list(span) for span in spans] for n, spans in plan_offline(self.sc).items()}
        for node in [spec.ps, spec.evaluator] + ([] if self.per_round else spec.workers):
            self.start_node(node)
        if self.per_round:  # a device's trainer starts when the PS selects it
            self.trainers = Trainers(spec, self.procs, self.start_node, self.hub.take_trainers, self.offline, self.t0)
            self.trainers.start()
        # the replay first: an event at 0 s may hand it a trace
        self.replay = start_replay(self.runtime, spec, self.sc.seed, self.run_dir, self.t0, event_trace_tick(self.sc))
        events = Events(self.runtime, spec, self.procs, self.start_node, self.live, self.run_dir, self.say,
                        per_round=self.per_round, replay=self.replay, seed=self.sc.seed)
        self.timeline = events.start(self.sc, self.t0)

    def watch(self) -> tuple[str, str]:
        """From the nodes' start to the run's end: (status, reason)."""
        sampler = Sampler(self.runtime, self.run_dir, self.t0, self.last_counters, self.dilation)
        return Monitor(self.sc, self.spec, self.procs, self.stop_event, sampler, self.live, self.say,
                       self.progress_every).watch()

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
                         scenario=self.world.model_dump(mode="json"), dilation=self.dilation,
                         ps_address=spec.ps.address,
                         threads=sc.workload.threads or node.threads,
                         delay=self.delays(node, control=self.control_address),
                         workers=[n.name for n in spec.workers], peers=peer_table(spec, node), stream=self.stream,
                         target=role_target(node.role, self.decentralized, sc.workload.command is not None),
                         addresses={n.name: n.address for n in spec.nodes}, records=self.records_address,
                         control=self.control_address, log_path=self._log_path(node),
                         step_target_s=node.device_step_s, step_target_batch=node.device_step_batch,
                         step_target_shape=node.device_step_shape,
                         offline=self.offline if node.role == "ps" else {},
                         per_round=self.per_round and node.role == "worker")
        self.procs[node.name] = self.runtime.start_node(node, cfg, self.stop_event)

    def delays(self, node: Node, control: str = "") -> DelaySpec:
        """The node's transport delays (plan/delays.py); `control`: the down channel's URL, where
        the runner publishes this node's delay changes."""
        planned = transport_delays(node, self.node_meta, self.spec, not self.runtime.caps.netem)
        return DelaySpec(**planned, control=control, node=node.name if control else "")

    def tear_down(self) -> dict:
        """Stop the timeline and the nodes, take the last counters, remove everything, and write
        summary.json. Each step is guarded on its own: whatever fails (a full disk), the cluster
        is still removed."""
        t_teardown = time.time()
        trainers = getattr(self, "trainers", None)  # (absent on a run stopped before its nodes started)
        if trainers is not None:  # no trainer starts while the nodes stop
            self._guarded("the trainers", trainers.stop)
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
                sampler = Sampler(self.runtime, self.run_dir, self.t0, self.last_counters, self.dilation)
                self._guarded("the last counters", sampler.sample)
            problems = self._guarded("the teardown", self._remove_nodes) or []
        else:
            problems = self._guarded("the clean-up", lambda: cleanup_run(self.run_id, self.state, stop_runner=False))
        if problems:
            self.say("teardown problems (run `edgebed down`): " + "; ".join(problems))
        summary = self._summary(t_teardown)
        self._guarded("meta.json's wall time", lambda: self._note_wall_time(summary))
        text = json.dumps(summary, indent=1)
        self._guarded("summary.json", lambda: replace_text(self.run_dir / "summary.json", text))
        if self._tensorboard is not None:  # the last rows
            self._guarded("the TensorBoard scalars", self._tensorboard.stop)
        return summary

    def _note_wall_time(self, summary: dict) -> None:
        """meta.json's `dilation` gets the run's wall and world seconds, once it has ended."""
        meta = getattr(self, "meta", None)
        if meta is None or "dilation" not in meta:
            return
        meta["dilation"].update(wall_seconds=summary.get("wall_seconds"), world_seconds=summary.get("seconds"))
        replace_text(self.run_dir / "meta.json", json.dumps(meta, indent=1))

    def _remove_nodes(self) -> list[str]:
        """The runtime's teardown; a fleet's shows how far it has got, on a clock of its own."""
        if not isinstance(getattr(self.runtime, "progress", None), FleetProgress):
            return self.runtime.teardown()
        self.runtime.progress = progress = FleetProgress(self.say, self.bars)
        try:
            return self.runtime.teardown()
        finally:
            progress.close()

    def _stop_timeline(self) -> None:
        replay = getattr(self, "replay", None)  # (absent on a run stopped before its nodes started)
        if replay is not None:
            replay.stop()
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
            summary = summarize(self.world, self.spec, self.run_dir, self.last_counters, t0=self.t0,
                                status=self.status, reason=self.reason)
        except Exception as e:  # unreadable records (a full disk): the status, and why
            summary = {"status": "failed", "reason": f"{self.reason}; records unreadable: {type(e).__name__}: {e}",
                       "run_dir": str(self.run_dir)}
        summary["runtime"] = self.runtime_name
        if self.hub is not None:  # the nodes' rows that came over the control network
            summary["record_rows"] = {"received": self.hub.rows, "dropped": self.hub.dropped}
            summary["control_dropped"] = control_drops(self.hub)
        if self.timeline is not None:  # changes applied, failed, and requests refused
            summary["timeline"] = dict(self.timeline.counts)
        trainers = getattr(self, "trainers", None)
        if trainers is not None:  # per-round trainers: what became of the PS's requests
            summary["trainers"] = {**trainers.counts, "errors": trainers.errors[:5]}
            parked = ps_info(self.run_dir).get("parked_trainers")
            if isinstance(parked, dict):  # the PS's: trainers handed a later round instead of started
                summary["trainers"]["parked"] = parked
        replay = getattr(self, "replay", None)
        if replay is not None:  # ticks, rate changes made, failed, ticks skipped for being late, nodes ended
            summary["trace_replay"] = {**replay.counts, "errors": replay.errors[:5]}
        summary["teardown_seconds"] = round(time.time() - t_teardown, 3)
        first = summary.pop("_first_step_time", None)
        summary["startup_seconds"] = round(self.t0 - self.t_invoked + first, 3) if first is not None else None
        return summary


