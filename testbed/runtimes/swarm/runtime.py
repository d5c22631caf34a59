"""The swarm runtime: a run's nodes as Docker Swarm services spread over the hosts of a swarm.

The runner talks to one manager's engine (DOCKER_HOST, else this machine's engine when it
manages a swarm, else the lab's: runtimes.swarm.lab). Each node is a one-task service pinned to its
host (plan.placement, with runtimes.swarm.hosts' spread), on an overlay network of the run (VXLAN
between hosts, IPsec-encrypted on request: runtimes.swarm.ipsec; dnsrr endpoints, since not
every kernel has IPVS). The runner is on no host's namespace, so each node shapes its own link
from inside (node.own_link: HTB on its interface's egress, IFB for what arrives), by the same
plans as the other runtimes, and reports its counters and usage over the control channel.
That channel (runtimes.control.hub) listens on the runner's address that the hosts reach; nodes reach
it through their hosts' NAT, each with its own channel keys: a Docker secret of the run that
only its service references. Services get their addresses from the swarm, so the plan's
addresses are replaced by the tasks' before any link is shaped or role configured. A per-round
fleet's devices are not services: each host runs one fleet host holding its devices
(runtimes.swarm.fleet, node.fleet.host).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Optional

from testbed.errors import HostCannot, RunFailed
from testbed.kernel.bridges import one_bridge_problems
from testbed.kernel.cgroups import period_us_of
from testbed.kernel.shaping import DirectionPlan, KernelCaps, plan_direction, weakest
from testbed.node import control, untrusted
from testbed.node.trace_replay import LinkGone
from testbed.plan.cluster import ClusterSpec, Node
from testbed.runtimes.base import Features, Runtime, Unavailable
from testbed.runtimes.engine.supervised import GO_TIMEOUT, SupervisedNodes
from testbed.runtimes.gpu_share import cap_env
from testbed.runtimes.state import RunState, Sweeper, register_sweeper
from testbed.runtimes.swarm.hosts import SwarmHost, SwarmPlacer, swarm_client, swarm_hosts
from testbed.runtimes.swarm.services import (  # noqa: F401
    HubCgroup,
    SwarmJob,
    TaskRoleProcess,
    free_port,
    gpu_runtime_problems,
    latest_task,
    may_drop,
    measure_offset,
    remove_swarm_resources,
    reported_classes,
    runner_address,
    set_container_quota,
    swarm_labels,
    sweep_swarm_run,
    tasks_running,
    timed_counters,
    wait_containers_gone,
)

# Until the nodes have tried their hosts' kernels, nothing is known of them; the runner's own
# is not asked (it may be no Linux root at all: only the channel's sockets are made here).
UNPROBED = KernelCaps(htb=True, netem=True, tbf=True, ifb=True, bpf_loss=True)
DEVICE_SILENT_S = 30.0  # s without a fleet device's report after which it is taken for gone (its host's process)
NOBODY = 65534  # the owner of a supervisor's key file: no process of a node runs as it


def container_of(task: dict) -> str:
    """The id of a running task's container, on its host."""
    return (task["Status"].get("ContainerStatus") or {}).get("ContainerID", "")


@dataclass
class SwarmHandle:
    node: Node
    host: SwarmHost
    service: Any
    uplink: DirectionPlan = field(default_factory=DirectionPlan)
    downlink: DirectionPlan = field(default_factory=DirectionPlan)
    cgroup: Any = None
    compute: dict = field(default_factory=dict)
    processes: list = field(default_factory=list)
    generation: int = 0
    netns: str = ""  # none on the runner's host
    container: str = ""  # the task's container id, on its host
    clock: tuple[float, float] = (0.0, 0.0)  # its clock's offset against the runner's, and the RTT it was measured with
    caps: Optional[KernelCaps] = None  # its host's kernel, as the node found it (asked before its link is shaped)


class SwarmRuntime(SupervisedNodes, Runtime):
    name = "swarm"
    features = Features()
    shaper = "htb inside the node (uplink) and on its IFB (downlink), ps and w0 on two hosts"

    @classmethod
    def available(cls) -> Optional[Unavailable]:
        """A swarm manager answers (nothing is made on this machine but the channel's sockets)."""
        try:
            swarm_client()
        except RuntimeError as e:
            return Unavailable(str(e), str(e))
        return None

    @classmethod
    def scenario_problems(cls, sc) -> list[str]:
        from testbed.runtimes.swarm.fleet import fleet_problems, packs_workers

        if packs_workers(sc):  # the workers are in fleet hosts, each on a tree of bridges of its own
            return fleet_problems(sc)
        return one_bridge_problems(sc, cls.name)  # its overlay network is a bridge on each host (not measured past)

    @classmethod
    def problems(cls, sc) -> list[str]:
        """What runtime swarm cannot make (the hosts' GPUs are placement's to check: runtimes.swarm.hosts)."""
        from testbed.scenario.schema import KAFKA_NEEDS, uses_kafka_image

        return [f"streaming.broker.kind: {KAFKA_NEEDS}; runtime swarm does not run it yet (use kind tansu)"] \
            if uses_kafka_image(sc) else []

    @classmethod
    def plugin_refusals(cls, sc, plugins: list[tuple[str, str]]) -> list[str]:
        return [f"{field}: '{ref}' is a plugin, and runtime swarm's nodes run edgebed's image, which does not take "
                "a user's package yet: use runtime docker (with packages:) or netns" for field, ref in plugins]

    def bench_placement(self) -> Optional[dict]:
        """The measured paths cross hosts: ps on one, workers on another."""
        hosts = sorted(h.hostname for h in self.hosts if h.usable())
        return {"ps": hosts[0], "workers": hosts[-1]}

    def __init__(self, state: RunState, client, image: str, caps: Optional[KernelCaps] = None):
        super().__init__(state, caps or UNPROBED)
        self.client, self.image = client, image
        self.hosts = swarm_hosts(client)
        self.network = None
        self.encrypt = False  # the run's overlays encrypted (network.encrypt)
        self._urls = ("", "")
        self._tasks: dict[str, tuple[float, bool]] = {}  # service id -> (checked at, running)
        self._services: dict[str, Any] = {}  # node or router -> its service
        self._placer: Optional[SwarmPlacer] = None
        self.fleet = None  # runtimes.swarm.fleet.SwarmFleet: a per-round fleet's devices in one container a host
        self._warm: dict = {}  # what a fleet host loads once for its devices' trainers
        self._cut_off: set[str] = set()  # the nodes cut from everyone (control.Cut's `everyone`)
        self.say: Callable[[str], None] = lambda line: None

    @classmethod
    def open(cls, state: RunState, say: Callable[[str], None]) -> "SwarmRuntime":
        from testbed.runtimes.engine.images import ensure_swarm_image

        client = swarm_client()
        rt = cls(state, client, ensure_swarm_image(client, say=say))
        rt.say = say
        return rt

    def placer(self, sc):
        from testbed.runtimes.swarm.fleet import packs_workers

        packed = packs_workers(sc)
        self._placer = SwarmPlacer(self.hosts, sc, packed=lambda node: packed and node.role == "worker")
        self._warm = {"dataset": sc.workload.dataset, "seed": sc.seed, "test_size": sc.workload.test_size} \
            if packed else {}
        return self._placer

    def placer_for_sites(self) -> SwarmPlacer:  # the placement's, for the sites' routers
        if self._placer is None:
            raise RunFailed("runtime swarm: no placement was made (Runtime.placer) before bring-up")
        return self._placer

    def channel_urls(self) -> tuple[str, str]:
        return self._urls

    # -- bring-up ----------------------------------------------------------------------
    def create(self, spec: ClusterSpec) -> None:
        from testbed.runtimes.engine.images import distribute_image
        from testbed.runtimes.swarm.sites import SwarmSites

        foreign = [n.name for n in spec.nodes if n.image is not None]
        if foreign:
            raise HostCannot(f"runtime swarm: {', '.join(foreign)} run a foreign image (kafka), not supported yet; "
                               "use broker kind tansu")
        problems = gpu_runtime_problems(spec, {h.hostname: h for h in self.hosts})
        if problems:
            raise HostCannot("; ".join(problems))
        self._open_hub()
        used = {n.host for n in spec.nodes}
        if spec.topology is not None:
            by_name = {h.hostname: h for h in self.hosts}
            router_hosts = {site: by_name[host] for site, host in self.placer_for_sites().router_hosts(spec).items()}
            self.fabric = SwarmSites(self, spec, self.caps, router_hosts)
            used |= set(self.fabric.hosts.values())
        distribute_image(self.client, self.image, [h for h in self.hosts if h.hostname in used], self.say)
        if spec.encrypt:
            self._require_encryption([h for h in self.hosts if h.hostname in used])
        if self.fabric is not None:
            self.fabric.make_lans()
        else:
            self.network = self.overlay(f"eb-{self.run_id}", spec.subnet)
        packed = [n for n in spec.nodes if self._placer is not None and self._placer.packed(n)]
        devices = {n.name for n in packed}
        for node in spec.nodes:
            if node.name not in devices:
                self.handles[node.name] = self._create_service(node)
        if packed:
            self._create_fleet(spec, packed)
        if self.fabric is not None:
            self.fabric.make_routers()
        services = {n: h.service for n, h in self.handles.items() if n not in devices}
        tasks = self.wait_running({**services, **(self.fleet.services() if self.fleet is not None else {})})
        for name in services:
            h = self.handles[name]
            spec.take_address(h.node, self.address_on(tasks[name], self._lan(h.node)))
            h.container = container_of(tasks[name])
            if "cpu_period_s" in h.compute:
                self._set_quota(name, h.compute["cpu_quota"])
        if self.fleet is not None:
            self.fleet.take_addresses(tasks, self.network)
            for node in packed:
                self.handles[node.name].container = container_of(tasks[self.fleet.of[node.name].name])
        if self.fabric is not None:
            self.fabric.route()
        self._shape(spec)

    def _create_fleet(self, spec: ClusterSpec, packed: list[Node]) -> None:
        """A per-round fleet's devices: one fleet host service a host (runtimes.swarm.fleet)."""
        from testbed.runtimes.swarm.fleet import SwarmFleet

        self.fleet = SwarmFleet(self, spec, packed)
        self.fleet.create(self.network, self._warm)
        for node in packed:
            p, service = node.profile, self.fleet.host_service(node.name)
            compute = {"engine": "swarm fleet host", "cpu_quota": p.cpus, "memory_bytes": p.memory}
            if p.cpu_period is not None:
                compute["cpu_period_s"] = p.cpu_period
            self._services[node.name] = service  # a device runs while its host does
            self.handles[node.name] = SwarmHandle(node, self._host(node), service, compute=compute,
                                                  cgroup=HubCgroup(self.hub.stats, node.name))

    def _host(self, node: Node) -> SwarmHost:
        return next(h for h in self.hosts if h.hostname == node.host)

    def _lan(self, node: Node):
        """The overlay network a node is on: its site's, or the run's one LAN."""
        return self.network if self.fabric is None else self.fabric.lans[node.site]

    def _open_hub(self) -> None:
        from testbed.runtimes.control.hub import ControlHub

        address = runner_address(self.hosts)  # the one the hosts reach: never every address (0.0.0.0)
        rport, cport = free_port(address), free_port(address)
        self.hub = ControlHub(None, address, rport, cport, self.run_dir, self.keys)
        self._urls = (f"tcp://{address}:{rport}", f"tcp://{address}:{cport}")

    def _require_encryption(self, hosts: list[SwarmHost]) -> None:
        """Every host tries its kernel before an encrypted overlay is made (runtimes.swarm.ipsec)."""
        from testbed.runtimes.swarm.ipsec import encryption_problems

        self.say(f"network.encrypt: trying the IPsec of {len(hosts)} host(s)' kernels")
        problems = encryption_problems(self, hosts, latest_task)
        if problems:
            raise HostCannot(problems[0])
        self.encrypt = True

    def overlay(self, name: str, subnet: Optional[str]):
        """An overlay network of the run (`subnet` None: the swarm's choice), encrypted if the
        scenario asks. Not attachable: only the run's services join it (a node's measuring jobs
        run inside its task), so no container started by hand on a host can."""
        import docker

        from testbed.runtimes.swarm.ipsec import overlay_options

        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)]) if subnet else None
        return self.client.networks.create(name, driver="overlay", attachable=False, ipam=ipam, labels=self.labels,
                                           options=overlay_options(self.encrypt))

    def service(self, name: str, host: SwarmHost, networks: list, resources: Optional[dict] = None,
                sysctls: Optional[dict] = None, directions: tuple = (), env: Optional[dict] = None,
                role: str = "router", secret: Optional[list] = None, caps: Optional[list[str]] = None,
                command: Optional[list[str]] = None, args: Optional[list[str]] = None):
        """A one-task service running a node's supervisor on `host`, on `networks` [(network, alias)],
        shaping `directions` (scenario.links.Direction) itself, with the channel keys of `name` (a
        node of `role`, or a site's router); or, given `secret` (secrets' references), `caps`,
        `command` and `args`, another of the image's programs (a fleet host)."""
        import docker

        from testbed.runtimes.engine.supervised import FLEET_HOST_TMPFS, WRITABLE_TMPFS, tmpfs_mode

        if caps is None:
            caps = ["NET_ADMIN", "SYS_ADMIN"] if may_drop(directions) else ["NET_ADMIN"]
        writable = dict(WRITABLE_TMPFS, **({} if command is None else FLEET_HOST_TMPFS))  # the rest is read-only
        service = self.client.services.create(
            self.image, name=f"eb-{self.run_id}-{name}", command=command,
            args=args or ["--supervise", name, *self._urls], hostname=name,
            networks=[docker.types.NetworkAttachmentConfig(net.id, aliases=[alias]) for net, alias in networks],
            endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
            restart_policy=docker.types.RestartPolicy(condition="none"),
            constraints=[f"node.id=={host.id}"], cap_add=caps,
            resources=docker.types.Resources(**resources) if resources else None, sysctls=sysctls,
            secrets=secret or self._key_secrets(name, role), labels=self.labels, container_labels=self.labels,
            env=[f"{k}={v}" for k, v in (env or {}).items()] or None, read_only=True,
            mounts=[docker.types.Mount(at, None, type="tmpfs", tmpfs_mode=tmpfs_mode(options))
                    for at, options in writable.items()])
        self._services[name] = service
        return service

    def _key_secrets(self, name: str, role: str) -> list:
        """The channel keys of `name` as a Docker secret of the run that only its service references,
        at node.channel_keys.KEY_FILE (0400) in its task (the swarm's managers keep it encrypted);
        its supervisor's apart, at SUPERVISOR_KEY_FILE, owned by nobody: only CAP_DAC_OVERRIDE
        reads it, and a secret's mount is read-only (no chmod)."""
        from testbed.node.channel_keys import SUPERVISOR_KEY_FILE

        return [self.secret(name, self.keys.admit(name, role).to_text()),
                self.secret(f"{name}-supervisor", self.keys.supervisor(name).to_text(), SUPERVISOR_KEY_FILE,
                            owner=NOBODY)]

    def secret(self, name: str, text: str, path: str = "", owner: int = 0):
        """`text` as a Docker secret of the run at `path` (node.channel_keys.KEY_FILE), 0400 and
        `owner`'s, in the task of the one service that references it."""
        import docker

        from testbed.node.channel_keys import KEY_FILE

        secret = self.client.secrets.create(name=f"eb-{self.run_id}-{name}-key", labels=self.labels,
                                            data=text.encode())
        return docker.types.SecretReference(secret.id, secret.name, filename=path or KEY_FILE, uid=str(owner),
                                            gid=str(owner), mode=0o400)

    def _create_service(self, node: Node) -> SwarmHandle:
        prof, host = node.profile, self._host(node)
        compute: dict[str, Any] = {"engine": "swarm"}
        res: dict[str, Any] = {}
        if prof.cpus is not None and prof.cpu_period is not None:  # a service has no period: set once it runs
            compute.update(cpu_quota=prof.cpus, cpu_period_s=period_us_of(prof.cpu_period) / 1e6)
        elif prof.cpus is not None:
            res["cpu_limit"] = int(prof.cpus * 1e9)  # the engine's 100 ms period
            compute["cpu_quota"] = prof.cpus
        if prof.memory is not None:
            res["mem_limit"] = prof.memory
            compute["memory_bytes"] = prof.memory
        if prof.cpuset is not None:
            compute["cpuset"] = prof.cpuset  # the supervisor's affinity, inherited by the role
        if prof.gpus not in (None, 0, []):
            res["generic_resources"] = {host.gpu_kind: len(prof.gpus) if isinstance(prof.gpus, list)
                                        else int(prof.gpus)}
            compute["gpus"] = prof.gpus
        gpu_caps = cap_env(prof, None, compute) if prof.has_gpus() else {}  # paced; no MPS daemon on the hosts
        link = node.link
        directions = (link.uplink, link.downlink, *(p.direction for p in link.uplink_peers + link.downlink_peers))
        service = self.service(node.name, host, [(self._lan(node), node.name)], res, directions=directions,
                               env=gpu_caps, role=node.role)
        return SwarmHandle(node, host, service, cgroup=HubCgroup(self.hub.stats, node.name), compute=compute)

    def wait_running(self, services: dict[str, Any]) -> dict[str, dict]:
        """Every service's task running (name -> its task); a task the swarm rejects (no image on
        its host, no GPU) is an error naming its host."""
        return tasks_running(services, self._hostname, self.warnings.append)

    def _hostname(self, task: dict) -> str:
        return next((h.hostname for h in self.hosts if h.id == task.get("NodeID")), task.get("NodeID", "?"))

    @staticmethod
    def address_on(task: dict, network) -> str:
        for att in task.get("NetworksAttachments", []):
            if att["Network"]["ID"] == network.id:
                return att["Addresses"][0].split("/")[0]
        raise RunFailed(f"runtime swarm: a task of {task.get('ServiceID')} has no address on {network.name}")

    def _shape(self, spec: ClusterSpec) -> None:
        """Each node shapes its own link (the first request it gets: it may still be starting) and
        has its clock read; all nodes at once (one by one would cost a second or more a node)."""
        from concurrent.futures import ThreadPoolExecutor

        firsts = self.fleet.first_devices() if self.fleet is not None else set()
        for node in spec.nodes:  # each fleet host's first: its kernel and clock are every device's there
            if node.name in firsts:
                self._shape_node(node)
        pool = ThreadPoolExecutor(max_workers=min(16, len(spec.nodes)))
        try:
            for done in [pool.submit(self._shape_node, node) for node in spec.nodes if node.name not in firsts]:
                done.result()  # the first error, if any
        finally:  # an error or Ctrl-C: the nodes not yet asked are not (a fleet's thousand would be waited for)
            pool.shutdown(wait=False, cancel_futures=True)
        kernels = [h.caps for h in self.handles.values()]
        if self.fabric is not None:
            kernels += list(self.fabric.router_caps.values())
        self.caps = weakest(kernels)  # meta.json's kernel_features: what every host has

    def _shape_node(self, node: Node) -> None:
        h = self.handles[node.name]
        first = self.fleet.first_of(node.name) if self.fleet is not None else None
        shared = self.handles[first] if first not in (None, node.name) else None  # its fleet host's, asked
        h.caps = shared.caps if shared is not None else self.ask_kernel(node.name)
        h.uplink = plan_direction(node.link.uplink, h.caps, node.link.uplink_peers)
        h.downlink = plan_direction(node.link.downlink, h.caps, node.link.downlink_peers)
        routes = self.fabric.node_routes(node.site) if self.fabric is not None else {}
        if self.fleet is not None and node.name not in self.fleet.of:  # replies to devices go through their host
            routes = {**routes, **self.fleet.routes()}
        self._request(node.name, control.Shape(node.address, asdict(h.uplink), asdict(h.downlink), routes).to_wire(),
                      timeout=GO_TIMEOUT)
        self._publish_delays(node.name)
        h.clock = shared.clock if shared is not None else self.clock_offset(node.name)

    def clock_offset(self, name: str) -> tuple[float, float]:
        """(offset, rtt) of a node's or router's clock against the runner's (measure_offset)."""
        return measure_offset(lambda: self._request(name, control.Clock().to_wire()))

    def ask_kernel(self, name: str) -> KernelCaps:
        """What the kernel of a node's or router's host can shape with, tried in its namespace (the
        first request it gets: it may still be starting)."""
        answer = self.ask(name, control.Kernel().to_wire())
        try:
            return KernelCaps(**untrusted.loads(answer))
        except (ValueError, TypeError):
            raise HostCannot(f"runtime swarm: {name} could not try its host's kernel: {answer}") from None

    def caps_of(self, node: str) -> KernelCaps:
        return self.handles[node].caps or self.caps

    def ask(self, name: str, req: dict) -> str:
        """A request to a node or router that may be starting (python importing: GO_TIMEOUT)."""
        return self._request(name, req, timeout=GO_TIMEOUT)

    def ask_all(self, names: list[str], req: dict) -> dict[str, Optional[str]]:
        """One request to many nodes or routers at once; each one's answer (None: none within a second)."""
        return self.hub.ask_all(names, req)

    # -- processes ---------------------------------------------------------------------
    def start_node(self, node: Node, cfg, stop_event) -> TaskRoleProcess:
        h = self.handles[node.name]
        h.generation += 1
        cfg = replace(cfg, t0=cfg.t0 + h.clock[0])  # its records' times on the runner's time axis
        request = (control.Go if h.generation == 1 else control.Start)(
            cfg=asdict(cfg), stress=self.stress_of(node), gen=h.generation, cpuset=node.profile.cpuset)
        self._request(node.name, request.to_wire(), timeout=GO_TIMEOUT)
        proc = TaskRoleProcess(self, node.name, h.generation)
        h.processes.append(proc)
        return proc

    def _request(self, node: str, req: dict, timeout: float = 10.0) -> str:
        """A request to the node's supervisor; an error as soon as its task has ended."""
        def gone() -> Optional[str]:
            if self.task_running(node):
                return None
            fh = self.fleet.of.get(node) if self.fleet is not None else None
            return f"its task has ended (see RUN/logs/{node}.log)" if fh is None else \
                f"its fleet host's process has ended or is silent (see RUN/logs/{fh.name}.log)"

        return self.hub.request(node, req, timeout, gone)

    def task_running(self, node: str) -> bool:
        """Whether the node's task runs (the manager asked at most every 2 s a service); a fleet
        host's device, whether its host's does and the device has not gone silent: a device that
        has reported before and not for DEVICE_SILENT_S (it reports every 10 s while idle) is
        served by nobody any more, and a request to it would wait out its whole timeout."""
        service = self._services[node]
        at, running = self._tasks.get(service.id, (0.0, True))
        if time.monotonic() - at > 2.0:
            task = latest_task(service)
            running = task is not None and task["Status"]["State"] == "running"
            self._tasks[service.id] = (time.monotonic(), running)
        if running and self.fleet is not None and node in self.fleet.of and self.hub is not None:
            heard = self.hub.stats_at.get(node)
            return heard is None or time.monotonic() - heard < DEVICE_SILENT_S
        return running

    def start(self, node: str, target, kwargs: dict, label: str = "") -> "SwarmJob":
        """Run a module-level function in a node (link checks, benchmarks): its supervisor forks it."""
        name = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        done = self.mailbox("job") / "exit"
        self.grant_slots(node, {**kwargs, "done": str(done)})
        self._request(node, control.Exec(name, kwargs, str(done)).to_wire())
        job = SwarmJob(self, node, done)
        self.handles[node].processes.append(job)
        return job

    # -- changes during the run ----------------------------------------------------------
    def _reshape(self, node: str, which: str, old: DirectionPlan, new: DirectionPlan) -> None:
        if new.mechanisms.get("loss", "").startswith("not-applied") and not self.caps_of(node).netem:
            raise ValueError(f"{node}: loss without netem (its host's kernel has none) is an eBPF filter, which "
                             "needs CAP_SYS_ADMIN in the node: runtime swarm grants it to nodes whose links have "
                             "loss from the start")
        try:
            self._request(node, control.Reshape(which, asdict(old), asdict(new)).to_wire())
        except RuntimeError as e:  # a task that ended (the run's stop reached it first) took its link along
            if self.task_running(node):
                raise
            raise LinkGone(f"{node}: its task has ended, and its link with it") from e

    def replay_on_node(self, node: str, schedules: dict, t0: float) -> bool:
        """The node keeps its trace's clock and changes its own link (node.trace_replay)."""
        self._request(node, control.Replay(schedules, t0).to_wire())
        return True

    def freeze(self, node: str, frozen: bool) -> str:
        return self._request(node, (control.Pause() if frozen else control.Resume()).to_wire())

    def kill_node(self, node: str) -> str:
        return self._request(node, control.Kill().to_wire())

    def set_cpus(self, node: str, cpus: Optional[float]) -> str:
        """The container's quota, changed by its host's engine in place (a service update would
        restart the task)."""
        if self.fleet is not None and node in self.fleet.of:
            raise NotImplementedError(f"runtime swarm does not support set_cpus for {node}, a device of a fleet host "
                                      "(its quota is a cgroup inside the host's container)")
        self._set_quota(node, cpus)
        return f"cpu quota {cpus} cores"

    def _set_quota(self, node: str, cpus: Optional[float]) -> None:
        h = self.handles[node]
        set_container_quota(node, h.host, h.container, h.compute.get("cpu_period_s"), cpus)

    def _cut_traffic(self, node: str, addresses: list[str], cut: bool) -> None:
        """The node drops its traffic with them itself (node.own_link: tc filters, no iptables).
        A cut from every other node (a device gone offline: availability) is a cut from everyone,
        a few filters whatever the cluster's size, not two for each of thousands of peers; a heal
        of some while cut from everyone heals all and cuts the rest again."""
        others = {h.node.address for n, h in self.handles.items() if n != node}
        if cut and node not in self._cut_off and set(addresses) == others:
            self._request(node, control.Cut([], True, everyone=True).to_wire())
            self._cut_off.add(node)
        elif not cut and node in self._cut_off:
            self._request(node, control.Cut([], False, everyone=True).to_wire())
            self._cut_off.discard(node)
            still = sorted(others - set(addresses))
            if still:
                self._request(node, control.Cut(still, True).to_wire())
        else:
            self._request(node, control.Cut(addresses, cut).to_wire())

    # -- observation -------------------------------------------------------------------
    def counters(self) -> dict[str, dict]:
        """Every node's link counters, read by the nodes now, all at once (a periodic report would
        be up to STATS_EVERY old, and a rate from two of them off by as much); a node that does not
        answer within a second gives its last report. Each with `time`, when the node read it, on
        the runner's clock: an answer that comes late must not read as a faster link."""
        from testbed.runtimes.control.hub import parsed_answer

        if self.hub is None:
            return {}
        out = {n: c for n, s in self.hub.stats.items()
               if n in self.handles and (c := timed_counters(s, self.handles[n].clock[0]))}
        for node, answer in self.hub.ask_all(self._to_ask(out), control.Counters().to_wire()).items():
            fresh = timed_counters(parsed_answer(answer), self.handles[node].clock[0])
            if fresh:
                out[node] = fresh
        return out

    def _to_ask(self, reported: dict) -> list[str]:
        """The nodes whose counters are read now: all but a fleet host's devices with nothing
        running, whose own reports (every IDLE_STATS_EVERY, node.supervisor) stand for them: at a
        thousand devices, asking each one every sample took the runner's whole core."""
        fleet = self.fleet.of if self.fleet is not None else {}
        return [n for n, h in self.handles.items()
                if n not in fleet or n not in reported or (h.processes and h.processes[-1].is_alive())]

    def link_stats(self, links: Optional[Iterable[str]] = None) -> dict[str, dict]:
        """As each node last read its own classes and reported them (it shapes its link itself)."""
        return reported_classes(self.hub.stats if self.hub is not None else {},
                                {n: h.clock[0] for n, h in self.handles.items()}, links)

    def link_counter(self, node: str, key: str) -> int:
        """Read now by the node itself (its periodic report may be STATS_EVERY old)."""
        value = untrusted.loads(self._request(node, control.Counters().to_wire()))
        if not isinstance(value, dict) or type(value.get(key)) is not int:
            raise RunFailed(f"{node}: its link counters came back malformed")
        return value[key]

    def node_meta(self) -> dict:
        return {name: {"netns": "", "host": h.host.hostname, "service": h.service.name, "container": h.container,
                       "clock_offset_s": h.clock[0], "clock_rtt_s": h.clock[1],
                       "kernel_features": asdict(h.caps) if h.caps else None,
                       "image": self.image, "compute": h.compute, "uplink": h.uplink.to_meta(),
                       "downlink": h.downlink.to_meta()} for name, h in self.handles.items()}

    # -- teardown ------------------------------------------------------------------------
    def stop_processes(self, grace: float) -> None:
        self.join_processes(grace)

    def save_logs(self) -> None:
        logs = self.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        packed = self.fleet.of if self.fleet is not None else {}
        services = {name: h.service for name, h in self.handles.items() if name not in packed}
        services.update(self.fleet.services() if self.fleet is not None else {})  # a fleet host's: once, fh-K.log
        for name, service in services.items():
            try:
                (logs / f"{name}.log").write_bytes(b"".join(service.logs(stdout=True, stderr=True)))
            except Exception:
                pass

    def teardown(self) -> list[str]:
        from testbed.runtimes.state import cleanup_run

        self.save_logs()
        problems = remove_swarm_resources(self.run_id, self.client)
        hosts = {h.host.hostname: h.host for h in self.handles.values()}
        problems += wait_containers_gone(self.run_id, list(hosts.values()))
        self._close_control()
        return problems + cleanup_run(self.run_id, self.state, stop_runner=False)


register_sweeper(Sweeper("swarm", swarm_labels, sweep_swarm_run))
