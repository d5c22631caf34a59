"""An ordinary PyTorch DDP program (gloo), as one would launch it with torchrun: edgebed runs it
unmodified on its emulated nodes (scenarios/byo/ddp.yaml). The one edgebed line is
`edgebed.report`, which hands each step's numbers to the run's records (and does nothing when
the program runs elsewhere).

Each step's all-reduce is timed by a DDP communication hook: from the first bucket handed to the
hook to the last bucket's reduction done. One bucket holds the whole model (bucket_cap_mb), so
the time is one ring all-reduce of the model's gradients, which `edgebed bench ddp` compares
with the ring bound 2(N-1)/N x model bytes / link rate.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import edgebed
except ImportError:  # outside edgebed's environment: no reports
    edgebed = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = ap.parse_args()
    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10)).to(device)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ddp = DDP(model, bucket_cap_mb=64)
    ddp._set_static_graph()
    spans: list[float] = []  # this step's [first hook call, last reduction done]

    def timed_allreduce(state, bucket):
        spans.append(time.perf_counter())
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def done(f):
            spans.append(time.perf_counter())
            return f.value()[0].div_(world)
        return fut.then(done)

    ddp.register_comm_hook(None, timed_allreduce)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        x, y = torch.randn(64, 784, generator=gen).to(device), torch.randint(0, 10, (64,), generator=gen).to(device)
        spans.clear()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        step_s, allreduce_s = time.perf_counter() - t0, spans[-1] - spans[0]
        if edgebed is not None:
            edgebed.report(step=step, loss=loss.item(), allreduce_seconds=allreduce_s, step_seconds=step_s,
                           model_bytes=model_bytes, world_size=world)
        print(f"rank {rank} step {step} loss {loss.item():.3f} all-reduce {allreduce_s:.3f} s "
              f"({args.backend} on {device})", flush=True)
    dist.barrier()  # no collective in flight when the group goes: gloo aborted one rank's exit without it (CI)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
