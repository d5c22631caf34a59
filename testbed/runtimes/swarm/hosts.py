"""The hosts of a Docker Swarm as edgebed sees them (`edgebed hosts`), which engine manages it,
and where each node of a run goes (a plan.placement Placer).

Placement: the scenario's `placement:` section pins nodes (by name, worker group, `workers`,
or site) to a host by hostname or by node label (`label:KEY=VALUE`); every other node goes to
the host with the most CPUs left (its CPUs less the quotas placed there), memory and GPUs
permitting. A scenario that does not fit is an error naming the node, the host and the resource.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from testbed.errors import BadInput, HostCannot

GPU_KINDS = ("gpu", "nvidia-gpu")  # a host's generic resources that are GPUs (dockerd --node-generic-resource)
ENGINE_LABEL = "edgebed.engine"  # a swarm node's label: its engine's address (image loads, live CPU changes)


@dataclass
class SwarmHost:
    id: str
    hostname: str
    address: str  # the swarm's address of the host
    cpus: float
    memory: int
    gpus: int
    labels: dict = field(default_factory=dict)
    state: str = "ready"
    availability: str = "active"
    manager: bool = False
    gpu_kind: str = "gpu"  # the name its engine gives its GPUs (generic resources)

    def engine_client(self, timeout: int = 60):
        """This host's own engine (node label edgebed.engine), or None. A label is anyone's who
        may label nodes: one of a shape edgebed does not use is an error (runtimes.engine.client)."""
        from testbed.runtimes.engine.client import engine_client

        url = self.labels.get(ENGINE_LABEL)
        return engine_client(url, timeout, where=f"host {self.hostname}'s label {ENGINE_LABEL}") if url else None

    def usable(self) -> bool:
        return self.state == "ready" and self.availability == "active"


def engine_at(url: Optional[str] = None, timeout: int = 30):
    """A Docker engine's client: at `url`, else DOCKER_HOST's (else this machine's); unix://,
    ssh:// (the system's `ssh`, its config, keys and agent) or tcp:// with TLS (runtimes.engine.client)."""
    from testbed.runtimes.engine.client import engine_client

    return engine_client(url, timeout)


def swarm_client(required: bool = True):
    """The engine of a swarm manager: DOCKER_HOST's, else this machine's if it manages a swarm,
    else the lab's (runtimes.swarm.lab). None (or an error, when required) if none answers."""
    from testbed.runtimes.engine.client import EngineAddressError
    from testbed.runtimes.swarm import lab

    candidates = []
    if os.environ.get("DOCKER_HOST"):
        candidates.append((f"DOCKER_HOST {os.environ['DOCKER_HOST']}", engine_at))
    else:
        candidates.append(("this machine's engine", engine_at))
        if lab.manager_url():
            candidates.append(("the lab", lambda: engine_at(lab.manager_url(), 30)))
    seen = []
    for where, make in candidates:
        try:
            client = make()
            swarm = client.info().get("Swarm") or {}
        except EngineAddressError as e:  # an address refused is said as it is, not as "no engine answers"
            if required:
                raise
            seen.append(str(e))
            continue
        except Exception:
            seen.append(f"{where}: no engine answers")
            continue
        if swarm.get("LocalNodeState") == "active" and swarm.get("ControlAvailable"):
            return client
        seen.append(f"{where}: not a swarm manager")
    if required:
        raise HostCannot("runtime swarm: no swarm manager answers (" + "; ".join(seen) + "); `docker swarm init`, "
                           "or `edgebed lab up --hosts 2` for a swarm of emulated hosts on this machine")
    return None


def swarm_hosts(client) -> list[SwarmHost]:
    hosts = []
    for n in client.nodes.list():
        a = n.attrs
        desc, res = a.get("Description", {}), a.get("Description", {}).get("Resources", {})
        gpus = sum(int(g.get("DiscreteResourceSpec", {}).get("Value", 0)) for g in res.get("GenericResources") or []
                   if g.get("DiscreteResourceSpec", {}).get("Kind", "").lower() in GPU_KINDS)
        gpus += sum(1 for g in res.get("GenericResources") or []
                    if g.get("NamedResourceSpec", {}).get("Kind", "").lower() in GPU_KINDS)
        kinds = [g.get(t, {}).get("Kind", "") for g in res.get("GenericResources") or []
                 for t in ("DiscreteResourceSpec", "NamedResourceSpec")]
        kind = next((k for k in kinds if k.lower() in GPU_KINDS), "gpu")
        hosts.append(SwarmHost(gpu_kind=kind, id=n.id, hostname=desc.get("Hostname", n.id),
                               address=a["Status"].get("Addr", ""),
                               cpus=res.get("NanoCPUs", 0) / 1e9, memory=res.get("MemoryBytes", 0), gpus=gpus,
                               labels=a["Spec"].get("Labels") or {}, state=a["Status"]["State"],
                               availability=a["Spec"].get("Availability", "active"),
                               manager="ManagerStatus" in a))
    return sorted(hosts, key=lambda h: h.hostname)


def hosts_to_yaml(hosts: list[SwarmHost]) -> str:
    """The hosts as `edgebed place --hosts` reads them (a cluster to plan for, edited by hand)."""
    import yaml

    return yaml.safe_dump([{"hostname": h.hostname, "cpus": h.cpus, "memory": h.memory, "gpus": h.gpus,
                            "labels": {k: v for k, v in h.labels.items() if k != ENGINE_LABEL}} for h in hosts],
                          sort_keys=False)


def hosts_from_yaml(text: str) -> list[SwarmHost]:
    """Hosts described in YAML: a list of {hostname, cpus, memory (bytes or 64g), gpus, labels}."""
    import yaml

    from testbed.scenario.units import parse_size

    data = yaml.safe_load(text)
    if not isinstance(data, list) or not data:
        raise BadInput("--hosts: a YAML list of hosts ({hostname, cpus, memory, gpus, labels})")
    hosts = []
    for i, h in enumerate(data):
        if not isinstance(h, dict) or not h.get("hostname"):
            raise BadInput(f"--hosts: host {i}: needs a hostname")
        try:
            hosts.append(SwarmHost(id=str(h["hostname"]), hostname=str(h["hostname"]), address="",
                                   cpus=float(h.get("cpus", 0)), memory=parse_size(h.get("memory", 0)),
                                   gpus=int(h.get("gpus", 0)), labels={str(k): str(v) for k, v in
                                                                       (h.get("labels") or {}).items()}))
        except (TypeError, ValueError) as e:
            raise BadInput(f"--hosts: host {h['hostname']}: {e}") from None
    return hosts


def describe_placement(spec, hosts: list[SwarmHost], routers: Optional[dict] = None) -> list[str]:
    """`edgebed place`: each host's nodes (and sites' routers) and what they take of it."""
    lines = []
    for h in hosts:
        nodes = [n for n in spec.nodes if n.host == h.hostname]
        mine = [f"router of {site}" for site, host in (routers or {}).items() if host == h.hostname]
        cpus = sum(_needs(n)[0] for n in nodes)
        mem = sum(_needs(n)[1] for n in nodes)
        gpus = sum(_needs(n)[2] for n in nodes)
        lines.append(f"{h.hostname:16s} {len(nodes):4d} nodes  CPUs {cpus:g}/{h.cpus:g}  memory "
                     f"{mem / 2**30:.1f}/{h.memory / 2**30:.1f} GiB  GPUs {gpus}/{h.gpus}  "
                     + ", ".join([n.name for n in nodes] + mine))
    return lines


def describe_hosts(hosts: list[SwarmHost]) -> list[str]:
    """`edgebed hosts`: one line per host."""
    lines = []
    for h in hosts:
        labels = ",".join(f"{k}={v}" for k, v in sorted(h.labels.items()) if k != ENGINE_LABEL)
        lines.append(f"{h.hostname:16s} {h.address:15s} {h.cpus:5.1f} CPUs {h.memory / 2**30:6.1f} GiB "
                     f"{h.gpus} GPUs  {'manager' if h.manager else 'worker '} {h.state}/{h.availability}"
                     f"  engine {'yes' if ENGINE_LABEL in h.labels else 'no '}  {labels}")
    return lines


class SwarmPlacer:
    def __init__(self, hosts: list[SwarmHost], sc, packed: Callable[[Any], bool] = lambda node: False):
        self.hosts = [h for h in hosts if h.usable()]
        self.sc = sc
        # a fleet host's device (runtimes.swarm.fleet): no CPU booked, dealt out to the hosts fewest first
        self.packed = packed
        if not self.hosts:
            raise HostCannot("runtime swarm: the swarm has no ready, active host")

    def _matching(self, key: str, value: str) -> list[SwarmHost]:
        if value.startswith("label:"):
            k, _, v = value[len("label:"):].partition("=")
            found = [h for h in self.hosts if h.labels.get(k) == v]
        else:
            found = [h for h in self.hosts if h.hostname == value]
        if not found:
            names = ", ".join(h.hostname for h in self.hosts)
            raise HostCannot(f"placement.{key}: no ready host is {value} (hosts: {names})")
        return found

    def _pins(self, spec) -> dict[str, tuple[str, list[SwarmHost]]]:
        """node -> (the placement key that pins it, the hosts it may go to); a node's own key wins
        over its group's, a group's over its site's."""
        from testbed.scenario.schema import resolve_target

        pins: dict[str, tuple[str, list[SwarmHost]]] = {}
        ranked = []
        for key, value in self.sc.placement.items():
            nodes = resolve_target(self.sc, key)
            rank = 0 if nodes == [key] else 1
            if not nodes:  # a site
                nodes, rank = [n.name for n in spec.nodes if n.site == key], 2
            ranked.append((rank, key, nodes, value))
        for _rank, key, nodes, value in sorted(ranked, reverse=True):  # the weakest first, overwritten
            for n in nodes:
                pins[n] = (key, self._matching(key, value))
        return pins

    def router_hosts(self, spec) -> dict[str, str]:
        """Each site's router's host (runtime swarm): where `placement:` puts the site, else where
        most of its placed nodes are, else the first host."""
        out = {}
        for site in (spec.topology.sites if spec.topology is not None else []):
            value = self.sc.placement.get(site.name)
            counts = Counter(n.host for n in spec.nodes if n.site == site.name)
            out[site.name] = (self._matching(site.name, value)[0].hostname if value is not None
                              else counts.most_common(1)[0][0] if counts else self.hosts[0].hostname)
        return out

    def place(self, spec) -> dict[str, str]:
        left = {h.hostname: [h.cpus, h.memory, h.gpus] for h in self.hosts}
        pins = self._pins(spec)
        out = {}
        devices: Counter = Counter()  # a host's packed devices so far
        for node in sorted(spec.nodes, key=lambda n: n.name not in pins):  # pinned nodes first
            key, allowed = pins.get(node.name, ("", self.hosts))
            need = [0.0, 0, 0] if self.packed(node) else _needs(node)
            fits = [h for h in allowed if _fits(left[h.hostname], need)]
            if not fits:
                raise HostCannot(_no_fit(node, key, allowed, left, need))
            if self.packed(node):
                best = min(fits, key=lambda h: (devices[h.hostname], h.hostname))
                devices[best.hostname] += 1
            else:
                best = max(fits, key=lambda h: left[h.hostname][0])
            out[node.name] = best.hostname
            left[best.hostname] = [a - b for a, b in zip(left[best.hostname], need)]
        return out


def _needs(node) -> list[float]:
    p = node.profile
    gpus = len(p.gpus) if isinstance(p.gpus, list) else int(p.gpus or 0)
    return [p.cpus or 0.0, p.memory or 0, gpus]


def _fits(left: list[float], need: list[float]) -> bool:
    return all(n <= free + 1e-9 for n, free in zip(need, left))


def _no_fit(node, key: str, allowed: list[SwarmHost], left: dict, need: list[float]) -> str:
    what = ("CPUs", "memory bytes", "GPUs")
    host = max(allowed, key=lambda h: left[h.hostname][0])
    short = next(i for i, (n, free) in enumerate(zip(need, left[host.hostname])) if n > free + 1e-9)
    where = f"placement.{key}" if key else "placement"
    return (f"{where}: {node.name} needs {need[short]:g} {what[short]}, and no host has that left "
            f"({host.hostname} has {left[host.hostname][short]:g} of {[host.cpus, host.memory, host.gpus][short]:g})")


