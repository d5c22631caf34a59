"""The docker runtime: one container per node on an internal bridge network of the run.

Engine access goes through the Docker SDK. Links are shaped from the host with the same
code as the netns runtime: the container's network namespace is attached as a named
netns (eb-<run>-<node>, like `ip netns attach`) for the uplink (egress of its eth0), and
the downlink is the egress of the container's veth peer on the host. Compute limits are
the engine's (nano_cpus, mem_limit, cpuset_cpus); background stress runs inside the
container, inside its quota.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

from testbed.errors import HostCannot
from testbed.kernel import names
from testbed.kernel.bridges import one_bridge_problems
from testbed.kernel.cgroups import period_us_of, quota_us
from testbed.kernel.netlink import NetnsSockets, attach_netns, disable_offloads, ns_iproute
from testbed.kernel.shaping import DirectionPlan, KernelCaps, apply_direction, plan_direction
from testbed.node import control
from testbed.node.trace_replay import LinkGone
from testbed.plan.cluster import ClusterSpec, Node
from testbed.runtimes.base import Features, Runtime, Unavailable, needs_root
from testbed.runtimes.docker.network import create_run_network
from testbed.runtimes.docker.nodes import (
    ContainerProcess,
    ExecProcess,
    PidCgroup,
    RoleProcess,
    put_channel_keys,
    sealed_root,
)
from testbed.runtimes.engine.client import docker_client, nvidia_runtime_available
from testbed.runtimes.engine.supervised import GO_TIMEOUT, SupervisedNodes
from testbed.runtimes.fabric import Fabric
from testbed.runtimes.gpu_share import cap_env
from testbed.runtimes.local_nodes import LocalNodeOps, netns_name, unencrypted_problems
from testbed.runtimes.state import LABEL, RUN_LABEL, RunState, Sweeper, register_sweeper


@dataclass
class DockerHandle:
    node: Node
    netns: str
    container: Any
    host_ifindex: Optional[int]  # the veth peer on the host (None: plugged into edgebed's fabric)
    uplink: DirectionPlan
    downlink: DirectionPlan
    cgroup: PidCgroup
    compute: dict
    processes: list = field(default_factory=list)
    generation: int = 0  # of its role: 1 when started, +1 per restart
    host_ifname: str = ""  # the veth peer's name on the host (a gone peer's index may be taken again)


class DockerRuntime(SupervisedNodes, LocalNodeOps, Runtime):
    name = "docker"
    features = Features()
    auto_rank = 0  # auto's first choice: where an engine answers and the node image can be had
    auto_note = " (an engine answered)"

    @classmethod
    def available(cls) -> Optional[Unavailable]:
        from testbed.runtimes.engine.images import image_unavailable

        root = needs_root(cls.name)
        if root is not None:
            return root
        client = docker_client()
        if client is None:
            return Unavailable("no Docker engine answers",
                               "runtime docker: no Docker engine answers (is dockerd running?)")
        why = image_unavailable(client)
        return None if why is None else Unavailable(why, f"runtime docker: {why} (`edgebed build` makes the image)")

    @classmethod
    def auto_refusal(cls, sc) -> Optional[str]:
        from testbed.runtimes.preflight import user_code

        plugins = user_code(sc)
        return f"{plugins[0][1]} is a plugin (on docker it needs `packages:`)" if plugins and not sc.packages else None

    @classmethod
    def scenario_problems(cls, sc) -> list[str]:
        return unencrypted_problems(sc) + one_bridge_problems(sc, cls.name)

    @classmethod
    def problems(cls, sc) -> list[str]:
        return cls._engine_problems(sc, auto=False) or []

    @classmethod
    def auto_problems(cls, sc) -> Optional[list[str]]:
        return cls._engine_problems(sc, auto=True)

    @classmethod
    def _engine_problems(cls, sc, auto: bool) -> Optional[list[str]]:
        """What the engine lacks for the scenario's GPUs and Kafka image; None under auto when no
        engine answers and nothing needs one (auto then runs on netns: this machine's GPUs)."""
        from testbed.scenario.schema import KAFKA_NEEDS, gpu_fields, uses_kafka_image

        gpus, kafka = gpu_fields(sc), uses_kafka_image(sc)
        if not (gpus or kafka):
            return []
        client = docker_client(timeout=3)
        if client is None:
            if auto and not kafka:
                return None
            return ([f"{w}: GPUs need the docker runtime (or netns), and no Docker engine answers" for w in gpus]
                    + ([f"streaming.broker.kind: {KAFKA_NEEDS} and needs the docker runtime, and no Docker engine "
                        "answers"] if kafka else []))
        if gpus and not nvidia_runtime_available(client):
            return [f"{w}: GPUs need the NVIDIA container runtime, which this Docker engine does not have"
                    for w in gpus]
        return []

    @classmethod
    def plugin_refusals(cls, sc, plugins: list[tuple[str, str]]) -> list[str]:
        if sc.packages:
            return []
        return [f"{field}: '{ref}' is a plugin, and runtime docker's nodes run edgebed's image: name the package "
                "that holds it in `packages:` (it is installed into the image)" for field, ref in plugins]

    def __init__(self, state: RunState, client=None, image: Optional[str] = None,
                 caps: Optional[KernelCaps] = None):
        super().__init__(state, caps)
        self.client = client or docker_client()
        if self.client is None:
            raise HostCannot("no Docker engine answers")
        self.image = image
        self.network = None
        self._host_ipr = None
        # a node's link is reshaped 10 times a second (a trace) and read each second: the sockets
        # that do it stay open per thread, as the netns runtime's fabric keeps its own
        self.sockets = NetnsSockets()
        self.say: Callable[[str], None] = lambda line: None

    @classmethod
    def open(cls, state: RunState, say: Callable[[str], None]) -> "DockerRuntime":
        from testbed.runtimes.engine.images import ensure_node_image

        client = docker_client()
        rt = cls(state, client, ensure_node_image(client, say=say))
        rt.say = say
        return rt

    def use_packages(self, packages: list[str]) -> None:
        from testbed.runtimes.engine.images import with_packages

        self.image = with_packages(self.client, self.image, packages, say=self.say)

    # -- bring-up ----------------------------------------------------------------------
    def create(self, spec: ClusterSpec) -> None:
        from pyroute2 import IPRoute

        if self.image is None:
            raise HostCannot("no node image: run `edgebed build`")
        for node in spec.nodes:  # before anything is made: a missing image leaves nothing half-started
            if node.image is not None:
                self._ensure_foreign_image(node)
        self._host_ipr = IPRoute()
        if spec.topology is not None:
            # Sites: Docker's internal networks drop traffic for other subnets (its isolation
            # rules), so containers get no Docker network and edgebed's fabric wires them like
            # the netns runtime's nodes: switches, routers and WAN links in namespaces of its own.
            self.fabric = Fabric(self.state, self.caps)
            self._create_nodes(spec)
            plans = self.fabric.build(spec, {n: h.netns for n, h in self.handles.items()}, self.progress)
            for name, (up, down) in plans.items():
                self.handles[name].uplink, self.handles[name].downlink = up, down
            self._build_control()
            return
        self.network = create_run_network(self.client, spec, self._bridge_network, self.say)
        self._create_nodes(spec)
        self._build_control()

    def _create_nodes(self, spec: ClusterSpec) -> None:
        for i, node in enumerate(spec.nodes):
            self.handles[node.name] = self._create_node(node, spec)
            self.progress("containers", i + 1, len(spec.nodes))

    def _bridge_network(self, subnet: str, gateway: str):
        import docker

        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet, gateway=gateway)])
        # internal: no route out of the machine and no NAT, like the netns runtime's bridge.
        return self.client.networks.create(
            f"eb-{self.run_id}", driver="bridge", internal=True, ipam=ipam, labels=self.labels,
            options={"com.docker.network.bridge.name": f"eb-{self.run_id}"})

    def _ensure_foreign_image(self, node: Node) -> None:
        """A node that runs another image (Kafka): present locally, or pulled from a registry."""
        import docker

        try:
            self.client.images.get(node.image)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            self.client.images.pull(node.image)
        except Exception as e:
            raise HostCannot(f"streaming.broker.image: {node.image} is not in the local Docker engine and "
                               f"could not be pulled ({str(e).splitlines()[0][:200]}); `docker pull` or "
                               "`docker load` it, or use broker kind tansu") from None

    def _foreign_container(self, node: Node) -> tuple[str, Optional[list], dict]:
        """(image, command, environment) of a node: edgebed's node image, or a foreign one."""
        if node.image is None:  # its supervisor, which gets everything else over the control channel
            from testbed.runtimes.control.network import ControlNetwork

            return self.image, ["--supervise", node.name, *ControlNetwork.urls()], {}
        if node.role == "kafka":
            from testbed.data.streaming.kafka import kafka_environment

            return node.image, None, kafka_environment(node.address)
        return node.image, None, {}

    def _create_node(self, node: Node, spec: ClusterSpec) -> DockerHandle:
        import docker

        prof = node.profile
        host_kw: dict[str, Any] = {"shm_size": "256m"}
        compute: dict[str, Any] = {"engine": "docker"}
        if prof.cpus is not None and prof.cpu_period is not None:  # docker run --cpu-period/--cpu-quota
            host_kw["cpu_period"] = period_us_of(prof.cpu_period)
            host_kw["cpu_quota"] = quota_us(prof.cpus, host_kw["cpu_period"])
            compute.update(cpu_quota=prof.cpus, cpu_period_s=host_kw["cpu_period"] / 1e6)
        elif prof.cpus is not None:
            host_kw["nano_cpus"] = int(prof.cpus * 1e9)
            compute["cpu_quota"] = prof.cpus
        if prof.memory is not None:
            host_kw["mem_limit"] = prof.memory
            compute["memory_bytes"] = prof.memory
        if prof.cpuset is not None:
            host_kw["cpuset_cpus"] = prof.cpuset
            compute["cpuset"] = prof.cpuset
        if prof.gpus not in (None, 0, []):
            ids = [str(g) for g in prof.gpus] if isinstance(prof.gpus, list) else None
            count = None if ids else int(prof.gpus)
            host_kw["device_requests"] = [docker.types.DeviceRequest(count=count, device_ids=ids,
                                                                     capabilities=[["gpu"]])]
            compute["gpus"] = prof.gpus
        gpu_caps = cap_env(prof, None, compute) if prof.has_gpus() else {}  # no MPS daemon here: paced
        api = self.client.api
        if self.fabric is not None:
            host_kw["network_mode"] = "none"  # the fabric plugs its eth0 in
        if node.image is None:
            host_kw.update(sealed_root(self.labels))
        host_config = api.create_host_config(**host_kw)
        net_config = None if self.fabric is not None else api.create_networking_config(
            {self.network.name: api.create_endpoint_config(ipv4_address=node.address)})
        cname = f"eb-{self.run_id}-{node.name}"
        image, command, env = self._foreign_container(node)
        env = {**env, **gpu_caps}
        cid = api.create_container(image, command=command, name=cname, environment=env or None,
                                   hostname=node.name, labels=self.labels, host_config=host_config,
                                   networking_config=net_config, detach=True)["Id"]
        container = self.client.containers.get(cid)
        if node.image is None:  # before it starts: its supervisor reads them first
            put_channel_keys(api, cid, self.keys.admit(node.name, node.role), self.keys.supervisor(node.name))
        container.start()
        container.reload()
        pid = container.attrs["State"]["Pid"]
        name = netns_name(self.run_id, node.name)
        self.state.netns.append(name)
        self.state.save()
        attach_netns(name, pid)
        if self.fabric is not None:  # shaped when the fabric plugs it in
            return DockerHandle(node, name, container, None, DirectionPlan(), DirectionPlan(), PidCgroup(pid), compute)
        up = plan_direction(node.link.uplink, self.caps, node.link.uplink_peers)
        down = plan_direction(node.link.downlink, self.caps, node.link.downlink_peers)
        with ns_iproute(name) as ns:
            idx = ns.link_lookup(ifname="eth0")[0]
            peer = ns.get_links(idx)[0].get_attr("IFLA_LINK")  # the veth peer's ifindex on the host
            apply_direction(ns, idx, up)
        apply_direction(self._host_ipr, peer, down)
        disable_offloads(name, ["eth0"])
        host_ifname = self._host_ipr.get_links(peer)[0].get_attr("IFLA_IFNAME")
        disable_offloads(None, [host_ifname])
        return DockerHandle(node, name, container, peer, up, down, PidCgroup(pid), compute, host_ifname=host_ifname)

    # -- processes ---------------------------------------------------------------------
    def start_node(self, node: Node, cfg, stop_event) -> ContainerProcess:
        h = self.handles[node.name]
        if node.image is not None:  # a foreign image runs its own entrypoint from creation on
            proc = ContainerProcess(h.container, stop_on_join=True)
            h.processes.append(proc)
            return proc
        h.generation += 1
        request = dict(cfg=asdict(cfg), stress=self.stress_of(node), gen=h.generation)
        if h.generation == 1:
            self._request(node.name, control.Go(**request).to_wire(), timeout=GO_TIMEOUT)
        else:  # a restart: the container's supervisor starts the role again
            self._request(node.name, control.Start(**request).to_wire())
        proc = RoleProcess(h.container, self.hub.states, node.name, h.generation)
        h.processes.append(proc)
        return proc

    def _request(self, node: str, req: dict, timeout: float = 10.0) -> str:
        """Hand a request to the node's supervisor (testbed.node.supervisor.RoleSupervisor) over the
        control channel; its answer."""
        return self.hub.request(node, req, timeout)

    # -- changes during the run (live.py) ------------------------------------------------
    @contextmanager
    def _link_iface(self, node: str, which: str):
        h = self.handles[node]
        if which == "up":
            with self.sockets.using(h.netns) as ns:
                found = ns.link_lookup(ifname="eth0")
                if not found:
                    raise self._link_missing(node, "eth0 in its namespace")
                yield ns, found[0]
        elif h.host_ifindex is not None:
            with self.sockets.using(None) as ipr:  # the calling thread's own (None: the host's namespace)
                if h.host_ifindex not in ipr.link_lookup(ifname=h.host_ifname):
                    raise self._link_missing(node, f"its veth peer {h.host_ifname} on the host")
                yield ipr, h.host_ifindex
        else:
            with self.fabric.downlink_iface(node) as iface:
                yield iface

    def _link_missing(self, node: str, what: str) -> Exception:
        """A node's interface is not there: its container ended and Docker removed the veth pair
        with it (LinkGone: a trace replay stops for the node), or, while it runs, an error naming it."""
        c = self.handles[node].container
        try:
            c.reload()
            running = bool(c.attrs["State"]["Running"])
        except Exception:  # removed: gone as well
            running = False
        if not running:
            return LinkGone(f"{node}: its container has ended, and its link with it")
        return RuntimeError(f"{node}: {what} is missing while its container runs")

    def freeze(self, node: str, frozen: bool) -> str:
        c = self.handles[node].container
        c.pause() if frozen else c.unpause()  # docker's own freezer: `docker ps` shows it paused
        return "paused" if frozen else "unpaused"

    def kill_node(self, node: str) -> str:
        """SIGKILL the node's role and stress (the container stays, like a netns node's namespace)."""
        if self.handles[node].node.image is not None:
            raise HostCannot(f"{node} runs a foreign image: kill its container with docker")
        return self._request(node, control.Kill().to_wire())

    def start(self, node: str, target, kwargs: dict, label: str = "") -> "ExecProcess":
        """Run a module-level function inside a node's container (benchmarks)."""
        self.grant_slots(node, kwargs)
        proc = ExecProcess(self.client, self.handles[node].container, target, kwargs)
        self.handles[node].processes.append(proc)
        return proc

    # -- observation -------------------------------------------------------------------
    def counters(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        if self.fabric is not None:
            return self.fabric.counters()
        if self._host_ipr is None:
            return out
        by_index = {h.host_ifindex: name for name, h in self.handles.items()}
        for link in self._host_ipr.get_links():
            name = by_index.get(link["index"])
            if name is None:
                continue
            st = link.get_attr("IFLA_STATS64")
            # The host end receives what the container sends (uplink) and transmits its downlink.
            out[name] = {"up_bytes": st["rx_bytes"], "up_packets": st["rx_packets"],
                         "down_bytes": st["tx_bytes"], "down_packets": st["tx_packets"]}
        return out

    def node_meta(self) -> dict:
        return {name: {"netns": h.netns, "container": h.container.name, "image": h.node.image or self.image,
                       "compute": h.compute, "uplink": h.uplink.to_meta(), "downlink": h.downlink.to_meta()}
                for name, h in self.handles.items()}

    # -- teardown ------------------------------------------------------------------------
    def stop_processes(self, grace: float) -> None:
        self.join_processes(grace)
        for h in self.handles.values():
            for p in h.processes:
                if p.is_alive():
                    p.kill()

    def save_logs(self) -> None:
        """Keep each container's output in RUN/logs/<node>.log (containers are removed at teardown)."""
        logs = self.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        for name, h in self.handles.items():
            try:
                (logs / f"{name}.log").write_bytes(h.container.logs(stdout=True, stderr=True))
            except Exception:
                pass

    def teardown(self) -> list[str]:
        from testbed.runtimes.state import cleanup_run

        self.save_logs()
        self._close_control()
        self.sockets.close()  # before the namespaces they hold go
        if self.fabric is not None:
            self.fabric.close()
        if self._host_ipr is not None:
            self._host_ipr.close()
            self._host_ipr = None
        return cleanup_run(self.run_id, self.state, stop_runner=False, progress=self.progress)


def remove_docker_resources(run_id: str) -> list[str]:
    """Remove the containers and networks labelled as one run's. Returns problems."""
    if not names.shaped("run id", run_id):
        return [f"docker: {ascii(run_id)[:40]} is not an edgebed run id; nothing removed"]
    client = docker_client(timeout=3)
    if client is None:
        return []
    flt = {"label": f"{RUN_LABEL}={run_id}"}
    problems = []
    for c in client.containers.list(all=True, filters=flt, ignore_removed=True):
        try:
            c.remove(force=True, v=True)  # with its keys' volume
        except Exception as e:
            problems.append(f"container {c.name}: {e}")
    for v in client.volumes.list(filters=flt):  # one whose container went another way
        try:
            v.remove(force=True)
        except Exception as e:
            problems.append(f"volume {v.name}: {e}")
    for n in client.networks.list(filters=flt):
        try:
            n.remove()
        except Exception as e:
            problems.append(f"network {n.name}: {e}")
    return problems


def docker_labels() -> list[tuple[str, dict]]:
    """The labels of the engine's containers and networks labelled edgebed's, as read (unchecked)."""
    client = docker_client(timeout=3)
    if client is None:
        return []
    found = [(f"container {c.name}", c.labels or {})
             for c in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)]
    found += [(f"network {n.name}", n.attrs.get("Labels") or {})
              for n in client.networks.list(filters={"label": LABEL})]
    found += [(f"volume {v.name}", v.attrs.get("Labels") or {}) for v in client.volumes.list(filters={"label": LABEL})]
    return found


register_sweeper(Sweeper("docker", docker_labels, remove_docker_resources))
