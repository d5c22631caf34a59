"""The stream source of a streaming run (ScaDLES): producers per device topic, and the broker."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from testbed.errors import RunFailed
from testbed.node import channel
from testbed.node.roles.common import RoleConfig


def _tail(path: str, limit: int = 2000) -> str:
    try:
        return Path(path).read_bytes()[-limit:].decode("utf-8", "replace")
    except OSError:
        return ""


def wall_schedule(schedule: dict, k: float) -> dict:
    """A device's stream schedule ({times, rates}, the world's) on the wall of a run dilated by k:
    each time k times later, each rate k times slower (the same samples, k times as long)."""
    return {"times": [t * k for t in schedule["times"]], "rates": [r / k for r in schedule["rates"]]}


def run_broker_node(cfg: RoleConfig, stop_event) -> None:
    """The stream source: one producer process per device topic, and (role broker) the embedded
    Tansu broker beside them, as ScaDLES ran its producers beside Kafka. Role producer publishes
    to a broker elsewhere (a kafka node, or an external one)."""
    import multiprocessing as mp

    from testbed.data.partition import partition_indices
    from testbed.data.streaming.broker import BrokerError, create_topics, start_tansu, wait_for_port
    from testbed.data.streaming.producer import produce_stream

    sc = cfg.scenario_model()
    stream = cfg.stream
    bootstrap = stream.bootstrap
    address, port = bootstrap.rsplit(":", 1)
    tansu = None
    if cfg.role == "broker":
        log = tempfile.NamedTemporaryFile(prefix="edgebed-tansu-", suffix=".log", delete=False)  # the node's own disk
        log.close()
        try:
            tansu = start_tansu(address, int(port), log_path=log.name)
        except BrokerError as e:
            raise BrokerError(f"{e}: {_tail(log.name)}") from None
        finally:
            if tansu is None:
                os.unlink(log.name)
    else:
        wait = 150.0 if stream.kind == "kafka" else 20.0
        if not wait_for_port(address, int(port), wait, stop_event):
            raise BrokerError(f"{stream.kind} broker at {bootstrap} did not accept connections within "
                              f"{wait:.0f} s" + (" (the relay at the run's gateway did not answer)"
                                                  if stream.kind == "external" else ""))
    producers = []
    try:
        topics = stream.topics
        create_topics(bootstrap, list(topics.values()))
        from testbed.data.datasets import shared_dataset

        ds = shared_dataset(sc.workload.dataset, seed=sc.seed, test_size=sc.workload.test_size)
        shards = partition_indices(ds.train_y, len(cfg.workers), sc.workload.partition, sc.seed)
        ctx = mp.get_context("fork")  # this process is single-threaded: forking shares the dataset pages
        for rank, worker in enumerate(cfg.workers):
            schedule = wall_schedule(asdict(stream.schedules[worker]), cfg.dilation)
            p = ctx.Process(target=produce_stream, name=f"producer-{worker}",
                            args=(bootstrap, topics[worker], ds.train_x[shards[rank]], ds.train_y[shards[rank]],
                                  schedule, stop_event, sc.seed * 1000 + rank, cfg.t0))
            p.start()
            producers.append(p)
        channel.send_json(cfg.records, "ready", {"node": cfg.node})  # the runner starts the trainers now
        while not stop_event.is_set():
            if tansu is not None and tansu.poll() is not None:
                raise BrokerError(f"the broker (tansu) exited with code {tansu.returncode}: "
                                  + _tail(log.name))
            dead = [p.name for p in producers if not p.is_alive()]
            if dead:
                raise RunFailed(f"{', '.join(dead)} exited")
            time.sleep(0.2)
    finally:
        for p in producers:
            p.join(timeout=3)
            if p.is_alive():
                p.kill()
        if tansu is not None:
            _stop_tansu(tansu, log.name)


def _stop_tansu(tansu, log_path: str) -> None:
    """End the broker; its log goes to the role's output (RUN/logs/<node>.log under docker), then away."""
    tansu.terminate()
    try:
        tansu.wait(timeout=5)
    except Exception:
        tansu.kill()
    print(f"--- the broker's log (last lines) ---\n{_tail(log_path)}", file=sys.stderr)
    os.unlink(log_path)
