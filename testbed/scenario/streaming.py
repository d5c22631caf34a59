"""ScaDLES-style streaming: where the streams live (the broker) and how fast each device's
samples arrive."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from testbed.scenario.fields import StrictModel
from testbed.scenario.profiles import Profile
from testbed.scenario.safe_yaml import excerpt

KAFKA_IMAGE = "apache/kafka:3.9.0"
"""Apache Kafka's official image (KRaft, single node) for `broker: {kind: kafka}`."""


def split_host_port(value: str) -> Optional[tuple[str, int]]:
    """(host, port) of "host:port", or None when it is not one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "," in value:
        return None
    return host, int(port)


class BrokerSpec(StrictModel):
    """Where the streams live.

    tansu: the embedded Kafka-API broker on a node of its own, producers beside it (ScaDLES' layout);
    kafka: Apache Kafka from its official image on the broker node (docker runtime), producers on a
    `producer` node; external: a Kafka the user runs on this host (`upstream`, 127.0.0.1 by
    default), which the nodes reach at `bootstrap`, the run's gateway address, through a relay of
    that one port; producers on a `producer` node.
    """

    kind: Literal["tansu", "kafka", "external"] = "tansu"
    bootstrap: Optional[str] = Field(None, description="gateway:port where the nodes reach an external Kafka "
                                                       "(kind: external; what the broker advertises)")
    upstream: Optional[str] = Field(None, description="host:port where this host reaches the external Kafka "
                                                      "(default 127.0.0.1 and bootstrap's port)")
    image: Optional[str] = Field(None, description=f"Kafka image (kind: kafka; default {KAFKA_IMAGE})")
    profile: Union[str, Profile, None] = None
    producer_profile: Union[str, Profile, None] = Field(
        None, description="profile of the producer node (kind: kafka or external)")
    site: Optional[str] = Field(None, description="the site of the broker (and producer) node")

    @model_validator(mode="after")
    def _kind_fields(self) -> "BrokerSpec":
        if self.kind == "external":
            if not self.bootstrap:
                raise ValueError("kind external needs bootstrap: host:port")
            for name in ("bootstrap", "upstream"):
                value = getattr(self, name)
                if value is not None and split_host_port(value) is None:
                    raise ValueError(f"{name}: {excerpt(value)} is not host:port (one broker)")
            if self.profile is not None:
                raise ValueError("profile: an external broker is not a node of the run (use producer_profile)")
            if self.upstream is None:
                self.upstream = f"127.0.0.1:{split_host_port(self.bootstrap)[1]}"
        elif self.bootstrap is not None or self.upstream is not None:
            field_name = "bootstrap" if self.bootstrap is not None else "upstream"
            raise ValueError(f"{field_name}: only for kind external (kind {self.kind} runs its own broker)")
        if self.image is not None and self.kind != "kafka":
            raise ValueError(f"image: only for kind kafka, not {self.kind}")
        if self.kind == "kafka" and self.image is None:
            self.image = KAFKA_IMAGE
        if self.producer_profile is not None and self.kind == "tansu":
            raise ValueError("producer_profile: with kind tansu the producers run on the broker node (use profile)")
        return self


class Streaming(StrictModel):
    """ScaDLES-style streaming: each worker trains on samples that stream to it through Kafka."""

    broker: BrokerSpec = Field(default_factory=BrokerSpec)
    rates: Any = Field("S1'", description="samples/s per device: a number, a list (one per worker: numbers or "
                                          "{trace: FILE}), S1/S2/S1'/S2', {uniform: {low, high}}, "
                                          "{normal: {mean, std}}, {trace: FILE} (time,rate CSV; time 0 = run start)")
    buffer: Literal["persistence", "truncation"] = "persistence"
    buffer_cap: Optional[int] = Field(None, ge=1, description="most samples a device keeps (memory bound)")
    batch: Any = Field("fixed", description="fixed (workload.batch_size), {fixed: b}, stream or "
                                            "{stream: {b_min, b_max}} (b_i = rate clipped)")

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: Any) -> Any:
        from testbed.data.streaming.rates import ConstantRate, TraceRate, parse_rate_spec

        if isinstance(v, list):
            if not v:
                raise ValueError("an empty list of rates")
            for i, r in enumerate(v):
                try:
                    spec = parse_rate_spec(r)
                except ValueError as e:
                    raise ValueError(f"[{i}]: {e}") from None
                if not isinstance(spec, (ConstantRate, TraceRate)):
                    raise ValueError(f"[{i}]: a list of rates holds numbers or {{trace: FILE}}, one per worker")
        else:
            parse_rate_spec(v)
        return v

    @field_validator("batch")
    @classmethod
    def _batch(cls, v: Any) -> Any:
        from testbed.data.streaming.buffer import parse_batch_policy

        if v != "fixed":
            parse_batch_policy(v)
        return v
