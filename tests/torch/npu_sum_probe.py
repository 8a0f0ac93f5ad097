"""One float64 all_reduce of fixed per-rank vectors, saved by rank 0: run under npurun on npu
tensors with "hccl" and under torchrun on CPU tensors with gloo, it shows in which order each
backend adds the ranks' values (tests/torch/test_torch_npu_ddp.py, world 3).

    python npu_sum_probe.py OUT {npu,cpu} {hccl,gloo}
"""
import os
import sys

import torch
import torch.distributed as dist

import hccl.torch_backend  # noqa: F401  (the "hccl" backend; npurun's env:// store)

N = 4096


def values(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7 + rank)
    return torch.randn(N, generator=g, dtype=torch.float64) * 10.0 ** (rank % 3)


def main(out: str, device: str, backend: str) -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "npu":
        import torch_npu  # noqa: F401
        torch.npu.set_device(local)
        device = f"npu:{local}"
    dist.init_process_group(backend)
    x = values(dist.get_rank()).to(device)
    dist.all_reduce(x)
    if dist.get_rank() == 0:
        torch.save(x.cpu(), out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
