"""PyTorch's side of the data-parallel scaling bench
(distributed/benches/scaling.rs): the training example's LeNet wrapped in
DistributedDataParallel on the gloo backend, one thread per process, SGD
with momentum on random 28x28 images, `--batch` images per process.

    python3 benches/ddp_gloo.py --world 2 --steps 60 --warmup 10

Prints `examples_per_s<TAB>X` (all processes together) from rank 0.
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 8, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def timed_steps(model, seed, args, sync=lambda: None):
    """Seconds for args.steps SGD-momentum steps of `model` on one batch
    drawn from `seed`, after args.warmup steps; `sync` runs before and after
    the timed steps (a barrier in a job)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(args.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    return time.perf_counter() - start


def worker(rank, world, port, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(lenet())
    secs = timed_steps(model, 1000 + rank, args, dist.barrier)
    if rank == 0:
        print(f"examples_per_s\t{world * args.batch * args.steps / secs:.1f}", flush=True)
    dist.destroy_process_group()


def plain(args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    secs = timed_steps(lenet(), 1000, args)
    print(f"examples_per_s\t{args.batch * args.steps / secs:.1f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--plain", action="store_true", help="one process, no DDP wrapper")
    args = p.parse_args()
    if args.plain:
        plain(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
