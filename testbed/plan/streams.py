"""A streaming scenario's plan: each device's topic, its nominal rate and its rate over the run."""

from __future__ import annotations

from testbed.plan.cluster import ClusterSpec
from testbed.scenario.schema import Scenario


def stream_config(sc: Scenario, spec: ClusterSpec) -> dict:
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
