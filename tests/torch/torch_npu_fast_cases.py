"""Rank-side code of tests/torch/test_torch_npu_fastpath.py: the backend's path for one dense
npu tensor (hccl/torch/npu.py: NpuCollectives.allreduce_one) and the Works it returns.

Returns plain lists and numbers (no tensors cross the process boundary).
"""
from __future__ import annotations


def fast_allreduce(rank: int) -> dict:
    import time
    import warnings

    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401  (npusim's npu device)

    import hccl.torch_backend  # noqa: F401

    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    pg = dist.distributed_c10d._get_default_group()
    out: dict = {}
    x = torch.full((256,), float(rank + 1), device="npu")
    for _ in range(3):                      # both ranks there: most calls finish at the call
        dist.barrier()
        w = dist.all_reduce(x, async_op=True)
        out.setdefault("done_at_call", []).append(w.is_completed())
        assert w.wait() is True
        fut = w.get_future()                # made after completion: completed at once
        out.setdefault("future", []).append(fut.wait()[0][:2].tolist())
    torch.npu.synchronize()
    out["x"] = x[:2].tolist()               # (1 + 2) * 2 * 2
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    torch.npu.synchronize()
    calls = len(pg.comm._calls)             # the MAX call's Call made: found from now on
    for _ in range(4):
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    torch.npu.synchronize()
    out["calls_added"] = len(pg.comm._calls) - calls
    # a late peer: rank 0's call cannot finish at the call; wait() still returns at once, the
    # future made before completion completes, and the next synchronize has the result
    y = torch.full((256,), float(rank + 1), device="npu")
    dist.barrier()
    if rank == 1:
        time.sleep(0.3)
    t0 = time.monotonic()
    w = dist.all_reduce(y, op=dist.ReduceOp.SUM, async_op=True)
    fut = w.get_future()
    out["late_pending"] = w.is_completed()
    w.wait()
    out["late_wait_s"] = time.monotonic() - t0
    torch.npu.synchronize()
    out["late"] = y[:2].tolist()
    out["late_future"] = fut.wait()[0][:2].tolist()
    out["late_completed"] = w.is_completed()
    # the general path still takes what the fast one does not: AVG, bool, non-contiguous
    z = torch.full((4,), float(rank), device="npu")
    dist.all_reduce(z, op=dist.ReduceOp.AVG)
    b = torch.tensor([rank == 0, False], device="npu")
    dist.all_reduce(b)
    nc = torch.arange(8.0).view(2, 4).npu().t()
    dist.all_reduce(nc)
    torch.npu.synchronize()
    out["avg"], out["bool"], out["nc"] = z.tolist(), b.tolist(), nc[0].tolist()
    # torch views a complex tensor as real: the short path takes the float32 view
    c = torch.full((2,), complex(rank, 1), dtype=torch.complex64, device="npu")
    dist.all_reduce(c)
    torch.npu.synchronize()
    out["complex"] = [[v.real, v.imag] for v in c.tolist()]
    dist.barrier()
    dist.destroy_process_group()
    return out
