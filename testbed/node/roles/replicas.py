"""How decentralized workers hand their replicas to the coordinator for evaluation: up to the
runner's hub over the control network, which forwards them to the coordinator (out of band like
a testbed's monitoring plane), so that evaluation puts no bytes on the emulated links."""

from __future__ import annotations

import io
import time

import torch

from testbed.node import channel
from testbed.node.roles.eval_schedule import EvalSchedule
from testbed.scenario.schema import Scenario

REPLICA_REFRESH = 4  # with eval_seconds: replica writes per evaluation period
# Parts the coordinator's ZeroMQ holds before it takes them (past it the hub drops parts for it):
# at most this many times channel.CHUNK bytes, apart from the replicas being put together.
REPLICA_QUEUE = 256


def replica_limit(params: dict[str, torch.Tensor]) -> int:
    """Bytes of a replica of these tensors (send_replica's), with room for torch.save's framing
    (a few hundred bytes a tensor, a few kilobytes in all) and the node's name."""
    return sum(t.numel() * t.element_size() for t in params.values()) + 1024 * len(params) + (64 << 10)


def send_replica(cfg, params: dict, step: int) -> None:
    buf = io.BytesIO()
    torch.save({"node": cfg.node, "step": step, "params": {k: v.detach().cpu() for k, v in params.items()}}, buf)
    channel.send(cfg.records, "replica", buf.getvalue())


class ReplicaBoard:
    """The coordinator's latest replica of each worker, as the hub forwards them, each on a topic
    naming the worker whose key sent it. A replica is kept only if it is that worker's, a known
    one's, with the model's tensors: a node's bytes never end the run, nor stand for another's.
    What it holds is bounded by `max_bytes` (replica_limit; -1: not bounded) for each worker:
    its latest replica and the one being put together; and REPLICA_QUEUE parts in ZeroMQ's queue."""

    def __init__(self, control: str, workers: set[str], shapes: dict[str, torch.Size], max_bytes: int = -1):
        self.workers, self.shapes = workers, shapes
        self.latest: dict[str, dict] = {}
        self.refused = 0
        # (no control channel: a coordinator made outside a run, as in tests, hears no replica)
        self._listener = channel.Listener(control, [b"replica:"], max_message=max_bytes,
                                          queue=REPLICA_QUEUE) if control else None  # every worker's

    def refresh(self, timeout_ms: int = 0) -> dict[str, dict]:
        """Take what has come (the coordinator does between messages: ZeroMQ's queue stays short)."""
        for t, payload in self._listener.poll(timeout_ms, REPLICA_QUEUE) if self._listener is not None else []:
            rep = self._load(payload)
            if rep is None or rep["node"] != channel.topic_name(t, "replica"):
                self.refused += 1
            else:
                self.latest[rep["node"]] = rep
        return self.latest

    def _load(self, payload: bytes):
        try:
            rep = torch.load(io.BytesIO(payload), weights_only=True)
            params = rep["params"]
            ok = (rep["node"] in self.workers and isinstance(rep["step"], int)
                  and all(params[n].shape == s for n, s in self.shapes.items()))
        except Exception:
            return None
        return rep if ok else None

    def wait_for(self, steps: dict[str, int], timeout: float) -> dict[str, dict]:
        """Until each worker's replica is at least at its step in `steps` (or `timeout` seconds):
        the final replicas travel apart from the workers' goodbyes."""
        deadline = time.monotonic() + (timeout if self._listener is not None else 0.0)
        while time.monotonic() < deadline:
            have = self.refresh(50)
            if all(w in have and have[w]["step"] >= s for w, s in steps.items()):
                break
        return self.latest

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()


def replica_schedule(sc: Scenario) -> EvalSchedule:
    """When a worker writes its replica: every eval_interval steps, or often enough for eval_seconds."""
    seconds = sc.workload.eval_seconds
    return EvalSchedule(sc.workload.eval_interval, None if seconds is None else seconds / REPLICA_REFRESH)
