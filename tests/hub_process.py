"""A control hub, or a coordinator's replica board, in a process of its own, so that its memory
is its alone (tests/runtimes/test_hub_bytes.py).

`python hub_process.py hub RUN_DIR`: its first line on stdout is JSON: the up and down URLs, and
the whole keys of its run's nodes (w0 and w1 workers, ps, eval). Then, for each line on stdin:
"memory" -> {"rss": MiB, "peak": MiB} (VmRSS and VmHWM), "drops" -> what it dropped, by reason;
end of input closes it.

`python hub_process.py board DOWN PS_KEYS NUMEL`: a ReplicaBoard of workers w0 and w1 for a model
of one float32 tensor "weight" of NUMEL values, which reads nothing until asked; "{}" once made.
Then "memory" as above, "refresh" -> each worker's latest step, "dropped" -> what its listener
dropped, by reason; end of input closes it."""

import ctypes
import json
import socket
import sys
from pathlib import Path

from testbed.runtimes.control.channel_auth import RunKeys
from testbed.runtimes.control.hub import ControlHub

NODES = {"w0": "worker", "w1": "worker", "ps": "ps", "eval": "evaluator"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def memory() -> dict[str, float]:
    """VmRSS after the allocator gave back what it could (glibc's malloc_trim): what the process
    holds, not what its allocator kept of what it freed; and VmHWM."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {"rss": int(fields["VmRSS"].split()[0]) / 1024, "peak": int(fields["VmHWM"].split()[0]) / 1024}


def serve_hub(run_dir: str) -> None:
    keys = RunKeys()
    nodes = {name: keys.admit(name, role).to_text() for name, role in NODES.items()}
    up, down = _free_port(), _free_port()
    hub = ControlHub(None, "127.0.0.1", up, down, Path(run_dir), keys)
    print(json.dumps({"up": f"tcp://127.0.0.1:{up}", "down": f"tcp://127.0.0.1:{down}", "keys": nodes}), flush=True)
    try:
        for line in sys.stdin:
            words = line.split()
            if words == ["memory"]:
                print(json.dumps(memory()), flush=True)
            elif words == ["drops"]:
                print(json.dumps(dict(hub.drops)), flush=True)
    finally:
        hub.close()


def serve_board(down: str, ps_keys: str, numel: str) -> None:
    import torch

    from testbed.node.channel_keys import ChannelKeys, use
    from testbed.node.roles.replicas import ReplicaBoard, replica_limit

    use(ChannelKeys.from_text(ps_keys))
    weight = torch.zeros(int(numel))
    board = ReplicaBoard(down, {"w0", "w1"}, {"weight": weight.shape}, max_bytes=replica_limit({"weight": weight}))
    print("{}", flush=True)
    try:
        for line in sys.stdin:
            if line.split() == ["memory"]:
                print(json.dumps(memory()), flush=True)
            elif line.split() == ["refresh"]:
                print(json.dumps({w: rep["step"] for w, rep in board.refresh(100).items()}), flush=True)
            elif line.split() == ["dropped"]:
                print(json.dumps(dict(board._listener.dropped)), flush=True)
    finally:
        board.close()


if __name__ == "__main__":
    {"hub": serve_hub, "board": serve_board}[sys.argv[1]](*sys.argv[2:])
