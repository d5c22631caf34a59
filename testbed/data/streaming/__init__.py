"""Streaming data plane helpers (pure: no Kafka, no network), after ScaDLES.

* `rates`: per-device streaming rates (the paper's sets S1, S2, S1', S2', constants, traces)
  and send-time schedules for producers.
* `buffer`: a device's stream buffer (persistence / truncation, optional memory cap), batch
  policies (fixed b, or b_i = S_i clipped to [b_min, b_max]) and the paper's Eq. 2-3.
* `sample_wire`: one sample as a Kafka (key, value) record, and back.
"""

from testbed.data.streaming.buffer import (
    BUFFER_POLICIES,
    CIFAR_SAMPLE_BYTES,
    STREAM_COLUMNS,
    BatchPolicy,
    BufferPolicy,
    FixedBatch,
    SimStep,
    StreamBatch,
    StreamBuffer,
    backlog_bytes,
    batch_size_for,
    eq2_backlog,
    eq3_backlog,
    parse_batch_policy,
    simulate_buffer,
    truncation_backlog,
)
from testbed.data.streaming.rates import (
    DEFAULT_FLOOR,
    RATE_SETS,
    ConstantRate,
    NormalRate,
    RateSchedule,
    RateSpec,
    TraceRate,
    UniformRate,
    device_schedules,
    paced,
    parse_rate_spec,
    read_rate_trace,
    sample_device_rates,
    schedule_for,
)
from testbed.data.streaming.sample_wire import decode_batch, decode_sample, encode_sample, header_size, sample_overhead

__all__ = [
    "BUFFER_POLICIES", "CIFAR_SAMPLE_BYTES", "DEFAULT_FLOOR", "RATE_SETS", "STREAM_COLUMNS",
    "BatchPolicy", "BufferPolicy", "ConstantRate", "FixedBatch", "NormalRate", "RateSchedule",
    "RateSpec", "SimStep", "StreamBatch", "StreamBuffer", "TraceRate", "UniformRate",
    "backlog_bytes", "batch_size_for", "decode_batch", "decode_sample", "device_schedules",
    "encode_sample", "eq2_backlog", "eq3_backlog", "header_size", "paced", "parse_batch_policy",
    "parse_rate_spec", "read_rate_trace", "sample_device_rates", "sample_overhead",
    "schedule_for", "simulate_buffer", "truncation_backlog",
]  # fmt: skip
