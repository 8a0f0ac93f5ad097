"""A torch job on the "hccl" backend that hangs or desyncs (run by npurun in test_torch_hangs.py).

Usage: torch_hang_job.py sleep|mismatch. ``sleep``: rank 2 stays in user code (load_batch) while
the others wait in the second all_reduce. ``mismatch``: rank 1 calls all_gather_into_tensor where
the others call all_reduce.
"""
import os
import sys
import threading

import torch
import torch.distributed as dist

import hccl.torch_backend  # noqa: F401


def load_batch(stop: threading.Event):
    stop.wait(120)          # "stuck" in user code until npurun stops the job


def main(scenario: str) -> None:
    dist.init_process_group(backend="hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1024)
    dist.all_reduce(t)                                    # seq 1: everyone
    if scenario == "sleep" and rank == 2:
        load_batch(threading.Event())
    if scenario == "mismatch" and rank == 1:
        dist.all_gather_into_tensor(torch.empty(1024 * world), t)
    else:
        dist.all_reduce(t)                                # seq 2
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    assert os.environ.get("WORLD_SIZE"), "run me with npurun"
    main(sys.argv[1])
