"""Column names of the run records: the contract between writer (metrics.py) and reader (records.py).

Kept free of imports so that node containers, which carry neither pandas nor matplotlib,
can write records.
"""

STEP_COLUMNS: list[str] = [
    "time", "node", "step", "loss", "batch_size", "lr", "bytes_sent", "bytes_received",
    "compute_seconds", "comm_seconds", "model_version",
    "compressed",  # adaptive compression (ScaDLES): whether this step's push was compressed; empty otherwise
]  # fmt: skip
# eval.csv: `time` = when the PS took the model; `evaluated_at` = when the evaluator wrote the row
# (the difference is the evaluator's backlog); `node` = the node that wrote it (last: older runs lack it)
EVAL_COLUMNS: list[str] = ["time", "step", "updates_received", "accuracy", "loss", "samples", "evaluated_at",
                           "node"]
TRAFFIC_COLUMNS: list[str] = ["time", "node", "link", "direction", "bytes", "delta_bytes", "packets"]
EVENT_COLUMNS: list[str] = ["time", "scheduled_time", "target", "action", "detail"]
SERVER_COLUMNS: list[str] = ["time", "version", "worker", "staleness", "lr", "payload_bytes"]
# one row per closed round of a strategy with client selection (fedavg): who was online (the PS's
# view), selected, finished in time and dropped; names space-separated; report_seconds: when each
# finished client's update came, seconds after the round opened, in `finished`'s order
ROUND_COLUMNS: list[str] = ["time", "round", "reason", "open_seconds", "n_online", "n_selected", "n_finished",
                            "n_dropped", "online", "selected", "finished", "dropped", "report_seconds"]
RESOURCE_COLUMNS: list[str] = ["time", "node", "cpu_seconds", "memory_bytes", "throttled_seconds",
                                "gpu_memory_bytes", "gpu_util",  # GPU: where NVML shows the node's processes
                                # fidelity (records.fidelity): quota in cores now, runnable-but-waiting
                                # seconds, CFS periods and throttled periods (cumulative)
                                "cpu_quota", "wait_seconds", "nr_periods", "nr_throttled"]
# stream.csv, one row per step; `buffered` = samples left right after the step's take
STREAM_STEP_COLUMNS: list[str] = ["time", "node", "step", "wait_seconds", "batch_size", "buffered"]
# buffer.csv, one row per device about every second (between takes); `rate` = its nominal rate then
BUFFER_COLUMNS: list[str] = ["time", "node", "arrived", "trained", "dropped", "buffered", "buffered_bytes", "rate"]
# peers.csv, decentralized strategies: one row per step and link; `entries` = gradient entries the
# link carried, `threshold` = the smallest |entry| it carried (DLion's contribution threshold)
PEER_COLUMNS: list[str] = ["time", "node", "peer", "step", "kind", "bytes", "entries", "threshold"]
# shaping.csv, one row per shaped access-link direction about every second (the fidelity monitor's
# link input): the HTB class's rate then (bit/s, empty: it never limits) and its cumulative counters,
# backlog = bytes queued at that moment
SHAPING_COLUMNS: list[str] = ["time", "node", "direction", "rate_bps", "bytes", "packets", "drops", "overlimits",
                               "backlog"]
# fidelity.csv (records.fidelity), written at the run's end: one row per judged interval of a node
# (got/promised in cores, wait = share of the interval waiting for a CPU, throttling excluded) or a link direction
# (bit/s; wait = 1 when saturated); verdict faithful/idle/starved/unlimited/unknown/startup or
# faithful/unsaturated/shortfall/unshaped
FIDELITY_COLUMNS: list[str] = ["kind", "name", "start", "end", "got", "promised", "wait", "verdict"]
# report.csv, a command workload's own metrics (edgebed.report): one row per metric and call
REPORT_COLUMNS: list[str] = ["time", "node", "step", "key", "value"]

# The run directory's folder of requests to the runner (`edgebed link/kill/...`, a worker's drawn
# crash): the CLI and nodes write one JSON file per request, the runner's timeline reads them.
CONTROL_DIR = ".control"
# link_rates.csv, runs with link traces only: the rate and one-way delay each traced direction was
# set to (a step: it holds until the node's next row of that direction; empty: not traced);
# trace_time = where in its trace it was
LINK_RATE_COLUMNS: list[str] = ["time", "node", "direction", "rate_bps", "trace_time", "latency_s"]
LINK_RATES_FILE = "link_rates.csv"
