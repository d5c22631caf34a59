"""The swarm runtime: a run's nodes as Docker Swarm services spread over the hosts of a swarm.

The runner talks to one manager's engine (DOCKER_HOST, else this machine's engine when it
manages a swarm, else the lab's: runtimes.lab). Each node is a one-task service pinned to its
host (plan.placement, with runtimes.hosts' spread), on an overlay network of the run (VXLAN
between hosts, IPsec-encrypted on request: runtimes.swarm_ipsec; dnsrr endpoints, since not
every kernel has IPVS). The runner is on no host's namespace, so each node shapes its own link
from inside (node.own_link: HTB on its interface's egress, IFB for what arrives), by the same
plans as the other runtimes, and reports its counters and usage over the control channel.
That channel (runtimes.hub) listens on the runner's address that the hosts reach; nodes reach
it through their hosts' NAT, each with its own channel keys: a Docker secret of the run that
only its service references. Services get their addresses from the swarm, so the plan's
addresses are replaced by the tasks' before any link is shaped or role configured.
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Optional

from testbed.kernel import names
from testbed.kernel.cgroups import CgroupUsage, period_us_of, quota_us
from testbed.kernel.shaping import DirectionPlan, KernelCaps, plan_direction, weakest
from testbed.node import control, untrusted
from testbed.plan.cluster import ClusterSpec, Node
from testbed.runtimes.base import Features, Runtime
from testbed.runtimes.docker import GO_TIMEOUT, LABEL, RUN_LABEL, HubStop, role_ended
from testbed.runtimes.gpu_share import cap_env
from testbed.runtimes.hosts import SwarmHost, SwarmPlacer, swarm_client, swarm_hosts
from testbed.runtimes.state import RunState, Sweeper, register_sweeper, run_labels

TASK_TIMEOUT = 180.0  # s for every task to run (an image load on a slow host included)
# Until the nodes have tried their hosts' kernels, nothing is known of them; the runner's own
# is not asked (it may be no Linux root at all: only the channel's sockets are made here).
UNPROBED = KernelCaps(htb=True, netem=True, tbf=True, ifb=True, bpf_loss=True)


class HubCgroup(CgroupUsage):
    """A remote node's usage, as its supervisor last reported it over the channel."""

    def __init__(self, stats: dict, node: str):
        self.stats, self.node = stats, node

    def _get(self, key: str):
        return (self.stats.get(self.node) or {}).get(key)

    def cpu_seconds(self) -> Optional[float]:
        return self._get("cpu_seconds")

    def memory_bytes(self) -> Optional[int]:
        return self._get("memory_bytes")

    def throttled(self) -> Optional[dict]:
        t = self._get("throttled_seconds")
        return None if t is None else {"throttled_time": int(t * 1e9)}


class TaskRoleProcess:
    """The runner's view of one generation of a node's role: its supervisor's word (hub.states),
    and the task's state should the whole container die."""

    def __init__(self, runtime: "SwarmRuntime", node: str, gen: int):
        self.rt, self.node, self.gen = runtime, node, gen

    def _ended(self) -> Optional[int]:
        code = role_ended(self.rt.hub.states, self.node, self.gen)
        if code is not None:
            return code
        return None if self.rt.task_running(self.node) else -1

    def is_alive(self) -> bool:
        return self._ended() is None

    @property
    def exitcode(self) -> Optional[int]:
        return self._ended()

    def join(self, timeout: Optional[float] = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while time.monotonic() < deadline and self.is_alive():
            time.sleep(0.1)

    def kill(self) -> None:
        pass  # its service goes at teardown


class SwarmJob:
    """A measuring job in a node, seen as a process: it has ended when its supervisor said so
    (its `done` slot) or its task did."""

    def __init__(self, runtime: "SwarmRuntime", node: str, done):
        self.rt, self.node, self.done = runtime, node, done

    def is_alive(self) -> bool:
        return not self.done.exists() and self.rt.task_running(self.node)

    @property
    def exitcode(self) -> Optional[int]:
        if self.done.exists():
            return int(self.done.read_text())
        return None if self.rt.task_running(self.node) else -1

    def join(self, timeout: Optional[float] = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while time.monotonic() < deadline and self.is_alive():
            time.sleep(0.05)

    def kill(self) -> None:
        pass  # dies with its container


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


COUNTER_KEYS = ("up_bytes", "up_packets", "down_bytes", "down_packets")


def may_drop(directions) -> bool:
    """Whether a node or router gets CAP_SYS_ADMIN, for the loss fallback's eBPF filter should its
    host's kernel have no netem (known only once it runs and tries): where its links start with
    loss. CAP_BPF would do where engines know it (Docker 20.10 does not)."""
    return any(d.loss for d in directions)


def runner_address(hosts: list[SwarmHost]) -> str:
    """This machine's address on the way to the swarm's hosts (the source of a route to one)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for h in hosts:
            try:
                route = ipr.route("get", dst=h.address)[0]
            except Exception:
                continue
            src = route.get_attr("RTA_PREFSRC")
            if src:
                return src
    raise RuntimeError("runtime swarm: no route from this machine to any host of the swarm")


def measure_offset(ask_time: Callable[[], str], samples: int = 5) -> tuple[float, float]:
    """(offset, rtt) of a node's clock against this machine's, NTP's way: the node's time minus
    the midpoint of the request's send and answer, from the sample with the shortest round trip
    (its error is at most half that RTT)."""
    best = (0.0, float("inf"))
    for _ in range(samples):
        t_send = time.time()
        t_node = float(ask_time())
        t_back = time.time()
        if t_back - t_send < best[1]:
            best = (t_node - (t_send + t_back) / 2, t_back - t_send)
    return best


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class SwarmRuntime(Runtime):
    name = "swarm"
    features = Features()

    def __init__(self, state: RunState, client, image: str, caps: Optional[KernelCaps] = None):
        super().__init__(state, caps or UNPROBED)
        self.client, self.image = client, image
        self.hosts = swarm_hosts(client)
        self.network = None
        self.encrypt = False  # the run's overlays encrypted (network.encrypt)
        self._urls = ("", "")
        self._tasks: dict[str, tuple[float, bool]] = {}  # node -> (checked at, running)
        self._services: dict[str, Any] = {}  # node or router -> its service
        self._placer: Optional[SwarmPlacer] = None
        self.say: Callable[[str], None] = lambda line: None

    @classmethod
    def open(cls, state: RunState, say: Callable[[str], None]) -> "SwarmRuntime":
        from testbed.runtimes.images import ensure_swarm_image

        client = swarm_client()
        rt = cls(state, client, ensure_swarm_image(client, say=say))
        rt.say = say
        return rt

    def placer(self, sc):
        self._placer = SwarmPlacer(self.hosts, sc)
        return self._placer

    def placer_for_sites(self) -> SwarmPlacer:  # the placement's, for the sites' routers
        if self._placer is None:
            raise RuntimeError("runtime swarm: no placement was made (Runtime.placer) before bring-up")
        return self._placer

    @property
    def labels(self) -> dict:
        return run_labels(self.state)

    def make_stop_event(self) -> HubStop:
        return HubStop(self.hub)

    def channel_urls(self) -> tuple[str, str]:
        return self._urls

    # -- bring-up ----------------------------------------------------------------------
    def create(self, spec: ClusterSpec) -> None:
        from testbed.runtimes.images import distribute_image
        from testbed.runtimes.swarm_sites import SwarmSites

        foreign = [n.name for n in spec.nodes if n.image is not None]
        if foreign:
            raise RuntimeError(f"runtime swarm: {', '.join(foreign)} run a foreign image (kafka), not supported yet; "
                               "use broker kind tansu")
        problems = gpu_runtime_problems(spec, {h.hostname: h for h in self.hosts})
        if problems:
            raise RuntimeError("; ".join(problems))
        self._open_hub()
        used = {n.host for n in spec.nodes}
        if spec.topology is not None:
            self.fabric = SwarmSites(self, spec)
            used |= set(self.fabric.hosts.values())
        distribute_image(self.client, self.image, [h for h in self.hosts if h.hostname in used], self.say)
        if spec.encrypt:
            self._require_encryption([h for h in self.hosts if h.hostname in used])
        if self.fabric is not None:
            self.fabric.make_lans()
        else:
            self.network = self.overlay(f"eb-{self.run_id}", spec.subnet)
        for node in spec.nodes:
            self.handles[node.name] = self._create_service(node)
        if self.fabric is not None:
            self.fabric.make_routers()
        for name, task in self.wait_running({n: h.service for n, h in self.handles.items()}).items():
            h = self.handles[name]
            self._take_address(spec, h.node, self.address_on(task, self._lan(h.node)))
            h.container = (task["Status"].get("ContainerStatus") or {}).get("ContainerID", "")
            if "cpu_period_s" in h.compute:
                self._set_quota(name, h.compute["cpu_quota"])
        if self.fabric is not None:
            self.fabric.route()
        self._shape(spec)

    def _host(self, node: Node) -> SwarmHost:
        return next(h for h in self.hosts if h.hostname == node.host)

    def _lan(self, node: Node):
        """The overlay network a node is on: its site's, or the run's one LAN."""
        return self.network if self.fabric is None else self.fabric.lans[node.site]

    def _open_hub(self) -> None:
        from testbed.runtimes.hub import ControlHub

        address = runner_address(self.hosts)  # the one the hosts reach: never every address (0.0.0.0)
        rport, cport = _free_port(address), _free_port(address)
        self.hub = ControlHub(None, address, rport, cport, self.run_dir, self.keys)
        self._urls = (f"tcp://{address}:{rport}", f"tcp://{address}:{cport}")

    def _require_encryption(self, hosts: list[SwarmHost]) -> None:
        """Every host tries its kernel before an encrypted overlay is made (runtimes.swarm_ipsec)."""
        from testbed.runtimes.swarm_ipsec import encryption_problems

        self.say(f"network.encrypt: trying the IPsec of {len(hosts)} host(s)' kernels")
        problems = encryption_problems(self, hosts, _latest_task)
        if problems:
            raise RuntimeError(problems[0])
        self.encrypt = True

    def overlay(self, name: str, subnet: Optional[str]):
        """An overlay network of the run (`subnet` None: the swarm's choice), encrypted if the
        scenario asks. Not attachable: only the run's services join it (a node's measuring jobs
        run inside its task), so no container started by hand on a host can."""
        import docker

        from testbed.runtimes.swarm_ipsec import overlay_options

        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)]) if subnet else None
        return self.client.networks.create(name, driver="overlay", attachable=False, ipam=ipam, labels=self.labels,
                                           options=overlay_options(self.encrypt))

    def service(self, name: str, host: SwarmHost, networks: list, resources: Optional[dict] = None,
                sysctls: Optional[dict] = None, directions: tuple = (), env: Optional[dict] = None,
                role: str = "router"):
        """A one-task service running a node's supervisor on `host`, on `networks` [(network, alias)],
        shaping `directions` (scenario.links.Direction) itself, with the channel keys of `name` (a
        node of `role`, or a site's router)."""
        import docker

        caps = ["NET_ADMIN", "SYS_ADMIN"] if may_drop(directions) else ["NET_ADMIN"]
        service = self.client.services.create(
            self.image, name=f"eb-{self.run_id}-{name}", command=None,
            args=["--supervise", name, *self._urls], hostname=name,
            networks=[docker.types.NetworkAttachmentConfig(net.id, aliases=[alias]) for net, alias in networks],
            endpoint_spec=docker.types.EndpointSpec(mode="dnsrr"),
            restart_policy=docker.types.RestartPolicy(condition="none"),
            constraints=[f"node.id=={host.id}"], cap_add=caps,
            resources=docker.types.Resources(**resources) if resources else None, sysctls=sysctls,
            secrets=[self._key_secret(name, role)], labels=self.labels, container_labels=self.labels,
            env=[f"{k}={v}" for k, v in (env or {}).items()] or None)
        self._services[name] = service
        return service

    def _key_secret(self, name: str, role: str):
        """The channel keys of `name` as a Docker secret of the run that only its service references,
        at node.channel_keys.KEY_FILE (0400) in its task (the swarm's managers keep it encrypted)."""
        import docker

        from testbed.node.channel_keys import KEY_FILE

        secret = self.client.secrets.create(name=f"eb-{self.run_id}-{name}-key", labels=self.labels,
                                            data=self.keys.admit(name, role).to_text().encode())
        return docker.types.SecretReference(secret.id, secret.name, filename=KEY_FILE, uid="0", gid="0", mode=0o400)

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
        deadline = time.monotonic() + TASK_TIMEOUT
        running: dict[str, dict] = {}
        while len(running) < len(services):
            for name in sorted(set(services) - set(running)):
                task = _latest_task(services[name])
                if task is None:
                    continue
                st = task["Status"]
                if st["State"] in ("rejected", "failed", "shutdown", "complete", "orphaned"):
                    raise RuntimeError(f"runtime swarm: {name} on host {self._hostname(task)}: task {st['State']}: "
                                       f"{st.get('Err') or st.get('Message')}")
                if st["State"] == "running":
                    running[name] = task
            if len(running) < len(services) and time.monotonic() > deadline:
                raise RuntimeError(f"runtime swarm: {', '.join(sorted(set(services) - set(running)))} not running "
                                   f"after {TASK_TIMEOUT:.0f} s")
            time.sleep(0.3)
        return running

    def _hostname(self, task: dict) -> str:
        return next((h.hostname for h in self.hosts if h.id == task.get("NodeID")), task.get("NodeID", "?"))

    @staticmethod
    def address_on(task: dict, network) -> str:
        for att in task.get("NetworksAttachments", []):
            if att["Network"]["ID"] == network.id:
                return att["Addresses"][0].split("/")[0]
        raise RuntimeError(f"runtime swarm: a task of {task.get('ServiceID')} has no address on {network.name}")

    @staticmethod
    def _take_address(spec: ClusterSpec, node: Node, new: str) -> None:
        """The task's address into the plan: the node's, and the peers' that shape traffic to or from it."""
        for n in spec.nodes:
            for p in n.link.uplink_peers + n.link.downlink_peers:
                if p.peer == node.name:
                    p.address = new
        node.address = new

    def _shape(self, spec: ClusterSpec) -> None:
        """Each node shapes its own link (the first request it gets: it may still be starting) and
        has its clock read; all nodes at once (one by one took 1-2 s a node at 32 nodes)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(16, len(spec.nodes))) as pool:
            for done in [pool.submit(self._shape_node, node) for node in spec.nodes]:
                done.result()  # the first error, if any
        kernels = [h.caps for h in self.handles.values()]
        if self.fabric is not None:
            kernels += list(self.fabric.router_caps.values())
        self.caps = weakest(kernels)  # meta.json's kernel_features: what every host has

    def _shape_node(self, node: Node) -> None:
        h = self.handles[node.name]
        h.caps = self.ask_kernel(node.name)
        h.uplink = plan_direction(node.link.uplink, h.caps, node.link.uplink_peers)
        h.downlink = plan_direction(node.link.downlink, h.caps, node.link.downlink_peers)
        routes = self.fabric.node_routes(node.site) if self.fabric is not None else {}
        self._request(node.name, control.Shape(node.address, asdict(h.uplink), asdict(h.downlink), routes).to_wire(),
                      timeout=GO_TIMEOUT)
        self._publish_delays(node.name)
        h.clock = self.clock_offset(node.name)

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
            raise RuntimeError(f"runtime swarm: {name} could not try its host's kernel: {answer}") from None

    def caps_of(self, node: str) -> KernelCaps:
        return self.handles[node].caps or self.caps

    def ask(self, name: str, req: dict) -> str:
        """A request to a node or router that may be starting (python importing: GO_TIMEOUT)."""
        return self._request(name, req, timeout=GO_TIMEOUT)

    # -- processes ---------------------------------------------------------------------
    def start_node(self, node: Node, cfg, stop_event) -> TaskRoleProcess:
        h = self.handles[node.name]
        stress = []
        if node.profile.stress is not None:
            stress = [node.profile.stress.cpu / node.profile.stress.processes] * node.profile.stress.processes
        h.generation += 1
        cfg = replace(cfg, t0=cfg.t0 + h.clock[0])  # its records' times on the runner's time axis
        request = (control.Go if h.generation == 1 else control.Start)(
            cfg=asdict(cfg), stress=stress, gen=h.generation, cpuset=node.profile.cpuset)
        self._request(node.name, request.to_wire(), timeout=GO_TIMEOUT)
        proc = TaskRoleProcess(self, node.name, h.generation)
        h.processes.append(proc)
        return proc

    def _request(self, node: str, req: dict, timeout: float = 10.0) -> str:
        """A request to the node's supervisor; an error as soon as its task has ended."""
        def gone() -> Optional[str]:
            return None if self.task_running(node) else f"its task has ended (see RUN/logs/{node}.log)"

        return self.hub.request(node, req, timeout, gone)

    def task_running(self, node: str) -> bool:
        at, running = self._tasks.get(node, (0.0, True))
        if time.monotonic() - at > 2.0:  # the manager is asked at most every 2 s per node
            task = _latest_task(self._services[node])
            running = task is not None and task["Status"]["State"] == "running"
            self._tasks[node] = (time.monotonic(), running)
        return running

    def start_idle(self, stop_event) -> None:
        for name in self.handles:
            self._request(name, control.Go(idle=True).to_wire(), timeout=GO_TIMEOUT)

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
        self._request(node, control.Reshape(which, asdict(old), asdict(new)).to_wire())

    def freeze(self, node: str, frozen: bool) -> str:
        return self._request(node, (control.Pause() if frozen else control.Resume()).to_wire())

    def kill_node(self, node: str) -> str:
        return self._request(node, control.Kill().to_wire())

    def set_stress(self, node: str, load: float) -> str:
        return self._request(node, control.Stress(load).to_wire())

    def set_cpus(self, node: str, cpus: Optional[float]) -> str:
        """The container's quota, changed by its host's engine in place (a service update would
        restart the task)."""
        self._set_quota(node, cpus)
        return f"cpu quota {cpus} cores"

    def _set_quota(self, node: str, cpus: Optional[float]) -> None:
        """`docker update` on the node's host: NanoCpus (the engine's period), or a period/quota
        pair where the profile has its own period (the two exclude each other)."""
        h = self.handles[node]
        engine = h.host.engine_client()
        if engine is None:
            raise RuntimeError(f"runtime swarm: the CPUs of {node} are set by host {h.host.hostname}'s engine, and "
                               "it has no node label edgebed.engine")
        period = h.compute.get("cpu_period_s")
        if period is None:
            data = {"NanoCpus": int((cpus or 0) * 1e9)}
        else:
            data = {"CpuPeriod": round(period * 1e6), "CpuQuota": quota_us(cpus, round(period * 1e6)) if cpus else -1}
        api = engine.api  # docker-py's update() has no NanoCpus: the engine's own endpoint
        api._raise_for_status(api._post_json(api._url("/containers/{0}/update", h.container), data=data))

    def _cut_traffic(self, node: str, addresses: list[str], cut: bool) -> None:
        """The node drops its traffic with them itself (node.own_link: tc filters, no iptables)."""
        self._request(node, control.Cut(addresses, cut).to_wire())

    # -- observation -------------------------------------------------------------------
    def counters(self) -> dict[str, dict]:
        from testbed.runtimes.hub import parsed_answer

        """Every node's link counters, read by the nodes now, all at once (a periodic report would
        be up to STATS_EVERY old, and a rate from two of them off by as much); a node that does not
        answer within a second gives its last report. Each with `time`, when the node read it, on
        the runner's clock: an answer that comes late must not read as a faster link."""
        if self.hub is None:
            return {}
        out = {n: c for n, s in self.hub.stats.items() if n in self.handles and (c := self._timed(n, s))}
        for node, answer in self.hub.ask_all(list(self.handles), control.Counters().to_wire()).items():
            fresh = self._timed(node, parsed_answer(answer))
            if fresh:
                out[node] = fresh
        return out

    def _timed(self, node: str, reading) -> Optional[dict]:
        """A node's counters, their read time moved onto the runner's clock; None if malformed."""
        if not isinstance(reading, dict) or not all(type(reading.get(k)) is int for k in COUNTER_KEYS):
            return None
        out = {k: reading[k] for k in COUNTER_KEYS}
        if isinstance(reading.get("time"), float):
            out["time"] = reading["time"] - self.handles[node].clock[0]
        return out

    def link_counter(self, node: str, key: str) -> int:
        """Read now by the node itself (its periodic report may be STATS_EVERY old)."""
        value = untrusted.loads(self._request(node, control.Counters().to_wire()))
        if not isinstance(value, dict) or type(value.get(key)) is not int:
            raise RuntimeError(f"{node}: its link counters came back malformed")
        return value[key]

    def node_meta(self) -> dict:
        return {name: {"netns": "", "host": h.host.hostname, "service": h.service.name, "container": h.container,
                       "clock_offset_s": h.clock[0], "clock_rtt_s": h.clock[1],
                       "kernel_features": asdict(h.caps) if h.caps else None,
                       "image": self.image, "compute": h.compute, "uplink": h.uplink.to_meta(),
                       "downlink": h.downlink.to_meta()} for name, h in self.handles.items()}

    # -- teardown ------------------------------------------------------------------------
    def stop_processes(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for h in self.handles.values():
            for p in h.processes:
                p.join(timeout=max(0.1, deadline - time.monotonic()))

    def save_logs(self) -> None:
        logs = self.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        for name, h in self.handles.items():
            try:
                (logs / f"{name}.log").write_bytes(b"".join(h.service.logs(stdout=True, stderr=True)))
            except Exception:
                pass

    def _wait_containers_gone(self, timeout: float = 30.0) -> list[str]:
        """A removed service's containers go a moment later, host by host: wait for them where
        the host's engine is known (elsewhere the swarm removes them on its own)."""
        problems = []
        deadline = time.monotonic() + timeout
        for host in {h.host.hostname: h.host for h in self.handles.values()}.values():
            try:
                engine = host.engine_client(timeout=10)
            except RuntimeError as e:  # a label of a shape not used (runtimes.engines): its engine is not asked
                problems.append(str(e))
                continue
            if engine is None:
                continue
            flt = {"label": f"{RUN_LABEL}={self.run_id}"}
            while engine.containers.list(all=True, filters=flt, sparse=True):  # ids only: no inspect of one going
                if time.monotonic() > deadline:
                    problems.append(f"host {host.hostname}: containers of the run still there after {timeout:.0f} s")
                    break
                time.sleep(0.3)
        return problems

    def teardown(self) -> list[str]:
        from testbed.runtimes.state import cleanup_run

        self.save_logs()
        problems = remove_swarm_resources(self.run_id, self.client)
        problems += self._wait_containers_gone()
        self._close_control()
        return problems + cleanup_run(self.run_id, self.state, stop_runner=False)


def gpu_runtime_problems(spec: ClusterSpec, hosts: dict[str, SwarmHost]) -> list[str]:
    """A node with GPUs on a host whose engine (where known: its edgebed.engine label) has no
    NVIDIA container runtime would start without them: one line per such host."""
    from testbed.runtimes.docker import nvidia_runtime_available

    needing: dict[str, list[str]] = {}
    for n in spec.nodes:
        if n.profile.gpus not in (None, 0, []):
            needing.setdefault(n.host, []).append(n.name)
    problems = []
    for hostname, nodes in sorted(needing.items()):
        try:
            engine = hosts[hostname].engine_client(timeout=10)
        except Exception:
            engine = None
        if engine is not None and not nvidia_runtime_available(engine):
            problems.append(f"runtime swarm: {', '.join(nodes)} need GPUs, and host {hostname}'s engine has no NVIDIA "
                            "container runtime (nvidia-container-toolkit, as the default runtime)")
    return problems


def _latest_task(service) -> Optional[dict]:
    try:
        tasks = service.tasks()
    except Exception:
        return None
    return max(tasks, key=lambda t: t["CreatedAt"]) if tasks else None


def remove_swarm_resources(run_id: str, client=None) -> list[str]:
    """Remove one run's services (their tasks on every host go with them), networks and secrets. Returns
    problems."""
    import docker

    if not names.shaped("run id", run_id):
        return [f"swarm: {ascii(run_id)[:40]} is not an edgebed run id; nothing removed"]
    client = client or swarm_client(required=False)
    if client is None:
        return []
    flt = {"label": f"{RUN_LABEL}={run_id}"}
    problems = []
    for s in client.services.list(filters=flt):
        try:
            s.remove()
        except Exception as e:
            problems.append(f"service {s.name}: {e}")
    deadline = time.monotonic() + 30
    for n in client.networks.list(filters=flt):
        while True:  # a network goes once its last task's endpoint is gone
            try:
                n.remove()
                break
            except docker.errors.NotFound:
                break
            except Exception as e:
                if time.monotonic() > deadline:
                    problems.append(f"network {n.name}: {e}")
                    break
                time.sleep(0.5)
    for secret in client.secrets.list(filters=flt):  # the nodes' channel keys (no service references them now)
        try:
            secret.remove()
        except docker.errors.NotFound:
            pass
        except Exception as e:
            problems.append(f"secret {secret.name}: {e}")
    return problems


def swarm_labels(client=None) -> list[tuple[str, dict]]:
    """The labels of the swarm's services, overlay networks and secrets labelled edgebed's, as read (unchecked)."""
    client = client or swarm_client(required=False)
    if client is None:
        return []
    try:
        found = [(f"service {s.name}", s.attrs["Spec"].get("Labels") or {})
                 for s in client.services.list(filters={"label": LABEL})]
        found += [(f"network {n.name}", n.attrs.get("Labels") or {})
                  for n in client.networks.list(filters={"label": LABEL}) if n.attrs.get("Driver") == "overlay"]
        found += [(f"secret {s.name}", s.attrs["Spec"].get("Labels") or {})
                  for s in client.secrets.list(filters={"label": LABEL})]
    except Exception:
        return []
    return found


register_sweeper(Sweeper("swarm", swarm_labels, remove_swarm_resources))
