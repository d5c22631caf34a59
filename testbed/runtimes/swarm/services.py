"""The Swarm-API side of runtime swarm (runtimes.swarm.runtime): the runner's view of a node's tasks
(its role, its jobs, its usage as reported), where the runner is seen from the hosts, a node's
clock offset, GPU checks of the hosts' engines, and finding and removing a run's services,
networks and secrets (`edgebed down`, `status`)."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable, Optional

from testbed.errors import HostCannot, RunFailed
from testbed.kernel import names
from testbed.kernel.cgroups import CgroupUsage, quota_us
from testbed.plan.cluster import ClusterSpec
from testbed.runtimes.engine.supervised import join_polling, role_ended
from testbed.runtimes.state import LABEL, RUN_LABEL
from testbed.runtimes.swarm.hosts import SwarmHost, swarm_client, swarm_hosts

CONTAINERS_GONE_S = 90.0  # s to wait: a few times what a 1,000-device fleet's hosts take (BENCHMARKS)


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
        periods = {k: self._get(k) for k in ("nr_periods", "nr_throttled") if self._get(k) is not None}
        return None if t is None else {"throttled_time": int(t * 1e9), **periods}

    def quota_cores(self) -> Optional[float]:
        return self._get("cpu_quota")

    def wait_seconds(self) -> Optional[float]:
        return self._get("wait_seconds")


CLASS_COUNTS = ("bytes", "packets", "drops", "overlimits", "backlog")
COUNTER_KEYS = ("up_bytes", "up_packets", "down_bytes", "down_packets")


def timed_counters(reading, offset: float) -> Optional[dict]:
    """A node's link counters, their read time moved onto the runner's clock by the node's clock
    `offset`; None if malformed."""
    if not isinstance(reading, dict) or not all(type(reading.get(k)) is int for k in COUNTER_KEYS):
        return None
    out = {k: reading[k] for k in COUNTER_KEYS}
    if isinstance(reading.get("time"), float):
        out["time"] = reading["time"] - offset
    return out


def reported_classes(stats: dict, clocks: dict[str, float], links=None) -> dict[str, dict]:
    """Per "node/up" and "node/down" (`links`: those alone), its HTB class as the node last
    reported it (node.own_link.class_stats: a swarm node shapes its own link), in
    kernel.shaping.read_htb_stats' shape, with `time`, when the node read it, on the runner's
    clock (`clocks`: each node's offset). A report with a count that is not a non-negative int,
    or a rate that is not a positive number or None, gives no reading."""
    out = {}
    wanted = None if links is None else set(links)  # the monitor asks for up to two keys a node each second
    for node, offset in clocks.items():
        report = stats.get(node)
        if not isinstance(report, dict) or not isinstance(report.get("time"), float):
            continue
        for direction in ("up", "down"):
            key = f"{node}/{direction}"
            if wanted is not None and key not in wanted:
                continue
            counts = {c: report.get(f"{direction}_class_{c}") for c in CLASS_COUNTS}
            rate = report.get(f"{direction}_class_rate_bps")
            if all(type(v) is int and v >= 0 for v in counts.values()) and \
                    (rate is None or (type(rate) in (int, float) and rate > 0)):
                out[key] = {"rate_bps": rate, **counts, "time": report["time"] - offset}
    return out


class TaskRoleProcess:
    """The runner's view of one generation of a node's role: its supervisor's word (hub.states),
    and the task's state should the whole container die."""

    def __init__(self, runtime: Any, node: str, gen: int):  # runtime: SwarmRuntime (task_running, hub)
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
        join_polling(self.is_alive, timeout, 0.1)

    def kill(self) -> None:
        pass  # its service goes at teardown


class SwarmJob:
    """A measuring job in a node, seen as a process: it has ended when its supervisor said so
    (its `done` slot) or its task did."""

    def __init__(self, runtime: Any, node: str, done):  # runtime: SwarmRuntime (task_running)
        self.rt, self.node, self.done = runtime, node, done

    def is_alive(self) -> bool:
        return not self.done.exists() and self.rt.task_running(self.node)

    @property
    def exitcode(self) -> Optional[int]:
        if self.done.exists():
            return int(self.done.read_text())
        return None if self.rt.task_running(self.node) else -1

    def join(self, timeout: Optional[float] = None) -> None:
        join_polling(self.is_alive, timeout, 0.05)

    def kill(self) -> None:
        pass  # dies with its container


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
    raise HostCannot("runtime swarm: no route from this machine to any host of the swarm")


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


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def gpu_runtime_problems(spec: ClusterSpec, hosts: dict[str, SwarmHost]) -> list[str]:
    """A node with GPUs on a host whose engine (where known: its edgebed.engine label) has no
    NVIDIA container runtime would start without them: one line per such host."""
    from testbed.runtimes.engine.client import nvidia_runtime_available

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


def set_container_quota(node: str, host: SwarmHost, container: str, period: Optional[float],
                        cpus: Optional[float]) -> None:
    """`docker update` of a node's container on its host: NanoCpus (the engine's period), or a
    period/quota pair where the profile has its own period (the two exclude each other)."""
    engine = host.engine_client()
    if engine is None:
        raise HostCannot(f"runtime swarm: the CPUs of {node} are set by host {host.hostname}'s engine, and "
                           "it has no node label edgebed.engine")
    if period is None:
        data = {"NanoCpus": int((cpus or 0) * 1e9)}
    else:
        data = {"CpuPeriod": round(period * 1e6), "CpuQuota": quota_us(cpus, round(period * 1e6)) if cpus else -1}
    api = engine.api  # docker-py's update() has no NanoCpus: the engine's own endpoint
    api._raise_for_status(api._post_json(api._url("/containers/{0}/update", container), data=data))


TASK_TIMEOUT = 180.0  # s for every task to run (an image load on a slow host included)
# new tasks for a container the engine failed to start: it races with itself at times ("unable to
# remount dir as readonly ... secrets: device or resource busy", moby#48783)
START_RETRIES = 2
ENDED = ("rejected", "failed", "shutdown", "complete", "orphaned")


def tasks_running(services: dict[str, Any], hostname: Callable[[dict], str],
                  warn: Callable[[str], None]) -> dict[str, dict]:
    """Every one-task service's task running (name -> its task); one that ended is an error naming
    its host (`hostname(task)`), but for a container the engine failed to start: a new task, at
    most START_RETRIES times, each said through `warn`."""
    deadline = time.monotonic() + TASK_TIMEOUT
    running: dict[str, dict] = {}
    retried: dict[str, int] = {}
    while len(running) < len(services):
        for name in sorted(set(services) - set(running)):
            task = latest_task(services[name])
            if task is None:
                continue
            st = task["Status"]
            if _start_failed_transiently(st) and retried.get(name, 0) < START_RETRIES:
                retried[name] = retried.get(name, 0) + 1
                warn(f"swarm: {name} on host {hostname(task)} did not start ({st.get('Err')}); started again")
                services[name].force_update()  # a new task; the failed one never ran the node
                continue
            if st["State"] in ENDED:
                raise RunFailed(f"runtime swarm: {name} on host {hostname(task)}: task {st['State']}: "
                                   f"{st.get('Err') or st.get('Message')}")
            if st["State"] == "running":
                running[name] = task
        if len(running) < len(services) and time.monotonic() > deadline:
            raise RunFailed(f"runtime swarm: {', '.join(sorted(set(services) - set(running)))} not running "
                               f"after {TASK_TIMEOUT:.0f} s")
        time.sleep(0.3)
    return running


def _start_failed_transiently(status: dict) -> bool:
    """A task whose container the engine failed to start (the node never ran): a race of the engine's
    own may be behind it, and a new task costs a second; one that fails the same way again is an error."""
    return status["State"] == "failed" and (status.get("Err") or "").startswith("starting container failed")


def latest_task(service) -> Optional[dict]:
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


def wait_containers_gone(run_id: str, hosts: list[SwarmHost], timeout: Optional[float] = None) -> list[str]:
    """A removed service's containers go a moment later, host by host (each stops its task): wait
    for them where the host's engine is known (elsewhere the swarm removes them on its own)."""
    problems = []
    timeout = CONTAINERS_GONE_S if timeout is None else timeout
    deadline = time.monotonic() + timeout
    flt = {"label": f"{RUN_LABEL}={run_id}"}
    for host in hosts:
        try:
            engine = host.engine_client(timeout=10)
        except RuntimeError as e:  # a label of a shape not used (runtimes.engine.client): its engine is not asked
            problems.append(str(e))
            continue
        if engine is None:
            continue
        try:
            while engine.containers.list(all=True, filters=flt, sparse=True):  # ids only: no inspect of one going
                if time.monotonic() > deadline:
                    problems.append(f"host {host.hostname}: containers of the run still there after {timeout:.0f} s")
                    break
                time.sleep(0.3)
        except Exception as e:  # the host's engine stopped answering: nothing more to learn there
            problems.append(f"host {host.hostname}: its engine did not answer ({str(e)[:80]})")
    return problems


def sweep_swarm_run(run_id: str) -> list[str]:
    """`edgebed down`'s share for one run on the swarm: its services, networks and secrets, then
    its containers gone from every host whose engine is known (a run's own teardown does the same)."""
    if not names.shaped("run id", run_id):
        return remove_swarm_resources(run_id)  # (which refuses it, and touches nothing)
    client = swarm_client(required=False)
    if client is None:
        return []
    problems = remove_swarm_resources(run_id, client)
    try:
        hosts = swarm_hosts(client)
    except Exception as e:
        return problems + [f"swarm: its hosts could not be listed ({str(e)[:80]})"]
    return problems + wait_containers_gone(run_id, hosts)


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
