"""A torch DDP job on the "hccl" backend whose rank KILL SIGKILLs itself mid-backward.

Usage (under npurun): peerkill_job.py [--kill-rank R] [--kill-step S] [--steps N]

In attempt 0, rank R kills itself with SIGKILL inside ``loss.backward()`` of step S: from a
gradient hook of the first layer's weight, the last gradient of the backward pass, so DDP's
earlier buckets' all_reduces are in flight (enqueued, or waiting for rank R's share) while it
dies. A restarted attempt (TORCHELASTIC_RESTART_COUNT > 0) kills nothing and trains to the end;
rank 0 then prints ``peerkill job done``.
"""
import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import hccl.torch_backend  # noqa: F401

DIM, HIDDEN, CLASSES = 32, 64, 10


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--kill-step", type=int, default=20)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--at-exit", action="store_true",
                   help="kill rank R after its last collective instead: its peers exit 0")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group(backend="hccl")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    layers = [torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU()]
    for _ in range(4):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, CLASSES))
    # small buckets: several all_reduces per backward, the later layers' first
    ddp = DDP(model, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    step = 0

    def die(grad):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_step and not args.at_exit:
            os.kill(os.getpid(), signal.SIGKILL)
        return grad

    model[0].weight.register_hook(die)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(64, DIM, generator=g)
        y = torch.randint(0, CLASSES, (64,), generator=g)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    dist.barrier()
    if args.at_exit and attempt == 0 and rank == args.kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        print(f"peerkill job done (attempt {attempt}, {args.steps} steps)", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
