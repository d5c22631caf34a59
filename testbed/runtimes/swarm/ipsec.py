"""runtime swarm's encrypted overlays (`network: {encrypt: true}`): Docker's `--opt encrypted`,
IPsec ESP with AES-GCM between each pair of hosts, programmed by each host's engine in its kernel.

An engine takes an encrypted network, and its tasks start, on a kernel that cannot make the SAs
(no ESP, no GCM): the failure shows only in the engine's log, and every packet between hosts is
dropped (a policy sends it to ESP, and there is no SA: BENCHMARKS.md). So before any overlay of
the run is made, each host the run uses tries its own kernel (testbed.kernel.ipsec) in a
one-task probe service of the node image, and a host that cannot is refused in one line naming
it and what its kernel lacks.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from testbed.kernel import ipsec
from testbed.runtimes.swarm.services import ENDED

PROBE_TIMEOUT = 120.0  # s for every host's probe task to end (a cold image start included)
# The image's python running edgebed's probe itself, not a job: jobs (`--exec`) give up NET_ADMIN
PROBE_COMMAND = ["python", "-m", "testbed.kernel.ipsec"]


def overlay_options(encrypt: bool) -> Optional[dict]:
    """The options of a run's overlay network (`docker network create --opt encrypted`)."""
    return {"encrypted": ""} if encrypt else None


def encryption_problems(rt, hosts: list, latest_task: Callable[[Any], Optional[dict]]) -> list[str]:
    """One line if any of `hosts` (runtimes.swarm.hosts.SwarmHost) cannot carry an encrypted overlay,
    else none. Probe services are `rt`'s (its client, image, labels) and gone on return;
    `latest_task(service)` is the swarm runtime's reading of a service's task."""
    services = {h.hostname: _probe(rt, h, i) for i, h in enumerate(sorted(hosts, key=lambda h: h.hostname))}
    try:
        found = _wait_ended(services, latest_task)
    finally:
        for service in services.values():
            try:
                service.remove()
            except Exception:
                pass  # teardown removes what carries the run's labels
    return refusal(found)


def _probe(rt, host, index: int):
    import docker

    return rt.client.services.create(
        rt.image, PROBE_COMMAND, name=f"eb-{rt.run_id}-ipsec-probe-{index}",
        restart_policy=docker.types.RestartPolicy(condition="none"), constraints=[f"node.id=={host.id}"],
        cap_add=["NET_ADMIN"], labels=rt.labels, container_labels=rt.labels)


def _wait_ended(services: dict[str, Any], latest_task: Callable[[Any], Optional[dict]]) -> dict[str, Any]:
    """host -> its probe's exit status (an int), or a line saying why it has none."""
    deadline = time.monotonic() + PROBE_TIMEOUT
    found: dict[str, Any] = {}
    while len(found) < len(services):
        for host in sorted(set(services) - set(found)):
            task = latest_task(services[host])
            if task is not None and task["Status"]["State"] in ENDED:
                found[host] = exit_status(task)
        if len(found) < len(services):
            if time.monotonic() > deadline:
                found.update({h: f"no answer in {PROBE_TIMEOUT:.0f} s" for h in set(services) - set(found)})
                break
            time.sleep(0.3)
    return found


def exit_status(task: dict):
    """A probe task's exit status, or the swarm's reason when its container never ran."""
    status = task["Status"]
    code = (status.get("ContainerStatus") or {}).get("ExitCode")
    if status["State"] in ("complete", "failed") and isinstance(code, int):
        return code
    return f"its probe task {status['State']}: {status.get('Err') or status.get('Message')}"


def refusal(found: dict[str, Any]) -> list[str]:
    """One line naming every host that cannot carry an encrypted overlay, and why; [] if none."""
    why: dict[str, list[str]] = {}
    for host, status in sorted(found.items()):
        if status != ipsec.SUPPORTED:
            reason = ipsec.MISSING.get(status, f"its probe exited {status}") if isinstance(status, int) else status
            why.setdefault(reason, []).append(host)
    if not why:
        return []
    parts = "; ".join(f"host{'s' if len(h) > 1 else ''} {', '.join(h)}: {reason}" for reason, h in why.items())
    return [f"network.encrypt: the hosts' kernels must make IPsec ESP security associations with {ipsec.AEAD} "
            f"for an encrypted overlay, and {parts}; run without encrypt or on hosts whose kernels have both"]
