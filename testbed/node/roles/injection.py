"""Randomized data injection for non-IID data, with the samples really sent between workers.

ScaDLES (scadles.txt Sec. IV-D) and SelSync (selsync.txt Sec. III-C, Eq. 3): at every step a
random subset of ceil(alpha * N) workers shares a beta fraction of its current batch with the
other workers, which train on those samples beside their own; their local batch shrinks to
b' = b / (1 + alpha*beta*N) (Eq. 3) so that the total stays near b. The authors' code draws
the "foreign" samples locally (NOTES.md); edgebed sends them, worker to worker over the
workers' own links, so that their traffic is real and shaped like everything else.

The sharing subset of a step is drawn from (seed, step), so every worker knows whether it
shares without asking anyone. Receivers never wait: they take up to their per-step quota,
alpha*beta*N*b', of what has arrived (from peers' recent steps), keeping a bounded backlog.
"""

from __future__ import annotations

import math
import random
from collections import deque

import torch
import zmq

from testbed.node import channel, transport
from testbed.node.wire import Message


def local_batch(injection, batch_size: int, n_workers: int) -> int:
    """b' of Eq. 3 (or the batch size, or a fixed number)."""
    if injection.local_batch == "same":
        return batch_size
    if injection.local_batch == "eq3":
        return max(1, round(batch_size / (1 + injection.alpha * injection.beta * n_workers)))
    return int(injection.local_batch)


def sharing_workers(workers: list[str], alpha: float, seed: int, step: int) -> list[str]:
    """The ceil(alpha * N) workers that share at `step` (the same answer on every worker)."""
    k = min(len(workers), max(1, math.ceil(alpha * len(workers))))
    return sorted(random.Random(seed * 1_000_003 + step).sample(sorted(workers), k))


class DataInjection:
    def __init__(self, cfg, injection, seed: int, zctx: zmq.Context, own_batch: int):
        self.node = cfg.node
        self.workers = list(cfg.workers)
        self.alpha, self.beta, self.seed = injection.alpha, injection.beta, seed
        n = len(self.workers)
        # expected samples in per step: ceil(alpha*N) senders (fewer when this one is among them),
        # beta of each one's batch
        self.quota = max(1, round(self.alpha * self.beta * n * own_batch))
        self.backlog = 4 * self.quota
        self.inbox = transport.peer_inbox(zctx, cfg.node, cfg.delay, seed=seed)
        self.inbox.senders = transport.known_senders(cfg.peers, cfg.addresses)
        self.outbox = {p: transport.peer_outbox(zctx, link.address, cfg.node, cfg.delay)
                       for p, link in cfg.peers.items()}
        self.links = channel.open_table(cfg, "peers.csv")
        self.queue: deque = deque()  # (x, y) one sample each
        self.t0 = cfg.t0
        self.received_samples = 0

    def share(self, step: int, xb: torch.Tensor, yb: torch.Tensor, now: float) -> int:
        """Send beta of this batch to every other worker when this worker shares at `step`;
        the bytes sent."""
        if self.node not in sharing_workers(self.workers, self.alpha, self.seed, step) or not self.outbox:
            return 0
        k = max(1, round(self.beta * len(yb)))  # the batch is already a random draw: its first k
        msg_tensors = {"x": xb[:k].contiguous(), "y": yb[:k].contiguous()}
        sent = 0
        for peer, ep in self.outbox.items():
            n = ep.send(Message("samples", msg_tensors, {"step": step}))
            sent += n
            self.links.write(time=now, node=self.node, peer=peer, step=step, kind="samples", bytes=n, entries=k)
        return sent

    def take(self) -> tuple[torch.Tensor | None, torch.Tensor | None, int]:
        """Up to `quota` injected samples that have arrived, and the bytes received."""
        got = 0
        for _, msg, nbytes in self.inbox.recv(0):
            got += nbytes
            if msg.kind != "samples":
                continue
            for x, y in zip(msg.tensors["x"], msg.tensors["y"]):
                self.queue.append((x, y))
        while len(self.queue) > self.backlog:  # stale samples go first
            self.queue.popleft()
        if not self.queue:
            return None, None, got
        take = [self.queue.popleft() for _ in range(min(self.quota, len(self.queue)))]
        self.received_samples += len(take)
        return torch.stack([t[0] for t in take]), torch.stack([t[1] for t in take]), got

    def close(self) -> None:
        for ep in self.outbox.values():
            ep.close()
        self.inbox.close()
        self.links.close()
