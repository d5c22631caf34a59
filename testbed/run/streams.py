"""A streaming run's first nodes: the broker and the producers come up (and say so) before anyone
trains; an external broker's one port is relayed from the run's gateway."""

from __future__ import annotations

import time
from typing import Callable

from testbed.errors import RunFailed
from testbed.plan.cluster import ClusterSpec, Node
from testbed.scenario.schema import Scenario


def relay_external_broker(sc: Scenario, runtime, say: Callable[[str], None]):
    """The external broker's one port, from the run's gateway to where this host reaches it."""
    from testbed.data.streaming.broker import wait_for_port
    from testbed.runtimes.relay import PortRelay
    from testbed.scenario.schema import split_host_port

    broker = sc.streaming.broker
    (gateway, port), upstream = split_host_port(broker.bootstrap), split_host_port(broker.upstream)
    if not wait_for_port(*upstream, 20.0):  # the relay would accept and close: say it here
        raise RunFailed(f"the streams did not come up: the external broker at {broker.upstream} (upstream of "
                           f"{broker.bootstrap}) did not accept connections within 20 s")
    relay = PortRelay(runtime.gateway_netns(), gateway, port, upstream)
    say(f"relaying {gateway}:{port} on the run's network to the external broker at {broker.upstream} (that port only)")
    return relay


def start_streams(spec: ClusterSpec, stream: dict, start: Callable[[Node], None], procs: dict, ready: set,
                  say: Callable[[str], None]) -> None:
    """The streams must exist before anyone trains: broker and producers come up first (the
    stream source says it is ready over the control channel: `ready`, filled by the hub)."""
    broker, source = spec.broker, spec.stream_source
    if broker is not None:
        start(broker)
    if source is not broker:
        start(source)
    _wait_ready(stream, broker, source, procs, ready)
    traced = [w for w, s in stream["schedules"].items() if len(s["rates"]) > 1]
    say(f"{stream['kind']} broker at {stream['bootstrap']}, {len(stream['topics'])} topics, rates "
        + ", ".join(f"{w} {r:.0f}/s" for w, r in stream["rates"].items())
        + (f" (then following a trace: {', '.join(traced)})" if traced else ""))


def _wait_ready(stream: dict, broker, source, procs: dict, ready: set) -> None:
    # Kafka (a JVM) takes a while to start; the producer node waits for its port.
    limit = 180 if stream["kind"] == "kafka" else 60
    deadline = time.time() + limit
    while source.name not in ready:
        dead = [n.name for n in (broker, source) if n is not None and not procs[n.name].is_alive()]
        if dead:
            raise RunFailed(f"the streams did not come up: node(s) {', '.join(dead)} exited "
                               f"(its error is above; with docker in RUN/logs/{dead[0]}.log)")
        if time.time() > deadline:
            raise RunFailed(f"the streams did not come up within {limit} s "
                               f"(broker {stream['bootstrap']})")
        time.sleep(0.05)
