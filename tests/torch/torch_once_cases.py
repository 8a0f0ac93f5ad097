"""Rank-side code of tests/torch/test_torch_backend_once.py: every collective of the "hccl"
backend on CPU and on npu tensors (one code path, hccl/torch/ops.py), and the deferred Works of
the npu all_reduce's short branch (hccl/torch/npu.py, work.py's ``Completer.defer``).

Returns plain lists and numbers (no tensors cross the process boundary).
"""
from __future__ import annotations


def _bits(t) -> list:
    """``t``'s elements as integers of its bytes (bitwise comparison across processes)."""
    import torch
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.dtype == torch.bool:
        return t.to(torch.uint8).tolist()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view).tolist()


def every_collective(rank: int) -> dict:
    import warnings

    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401  (npusim's npu device)

    import hccl.torch_backend  # noqa: F401
    from hccl.torch import work as torch_work

    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    world = dist.get_world_size()
    staged = []
    real_buffer = torch_work.Staging.buffer

    def counting(self, count, dtype):
        staged.append(count)
        return real_buffer(self, count, dtype)
    torch_work.Staging.buffer = counting
    out: dict = {}
    g = torch.Generator().manual_seed(7 + rank)
    for dev in ("cpu", "npu"):
        before = len(staged)
        res = out[dev] = {}

        def mk(*shape, dtype=torch.float32, seed=None):
            x = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
            return x.to(dtype).to(dev)
        g.manual_seed(7 + rank)
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            x = mk(5, dtype=dt)
            dist.all_reduce(x, op=dist.ReduceOp.AVG)
            res[f"avg {dt}"] = _bits(x)
        x = mk(3, 4).t()                # non-contiguous
        dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
        res["prod nc"] = _bits(x)
        for op in ("BAND", "BOR", "BXOR"):
            i = torch.tensor([rank * 5 + 3, 12 - rank, 255], dtype=torch.int32).to(dev)
            dist.all_reduce(i, op=getattr(dist.ReduceOp, op))
            res[op] = i.tolist()
        bt = torch.tensor([rank == 0, True, False]).to(dev)
        dist.all_reduce(bt, op=dist.ReduceOp.BAND)
        res["bool band"] = bt.tolist()
        r = torch.tensor([rank + 1, 6], dtype=torch.int64).to(dev)
        dist.reduce(r, dst=1, op=dist.ReduceOp.BXOR)
        res["reduce bxor"] = r.tolist()
        r = mk(4)
        dist.reduce(r, dst=0, op=dist.ReduceOp.AVG)
        res["reduce avg"] = _bits(r)
        b = mk(2, 3)
        dist.broadcast(b, src=1)
        res["broadcast"] = _bits(b)
        gl = [torch.empty(3).to(dev) for _ in range(world)] if rank == 0 else None
        dist.gather(mk(3), gl, dst=0)
        res["gather"] = [_bits(t) for t in gl] if gl else []
        so = torch.empty(2, 2).to(dev)
        sl = [torch.full((2, 2), 10.0 * i + 1).to(dev) for i in range(world)] if rank == 1 \
            else None
        dist.scatter(so, sl, src=1)
        res["scatter"] = so.tolist()
        rs = torch.empty(3).to(dev)
        dist.reduce_scatter(rs, [mk(3) for _ in range(world)], op=dist.ReduceOp.AVG)
        res["reduce_scatter avg"] = _bits(rs)
        # uneven all_to_all_single: rank r sends r + 1 rows to every rank
        ins = torch.arange(float((rank + 1) * world * 2)).view(-1, 2).to(dev) + 100 * rank
        o = torch.empty(sum(s + 1 for s in range(world)), 2).to(dev)
        dist.all_to_all_single(o, ins, [s + 1 for s in range(world)], [rank + 1] * world)
        res["a2a uneven"] = o.tolist()
        eo = torch.empty(world * 2).to(dev)
        dist.all_to_all_single(eo, torch.arange(world * 2.0).to(dev) + 10 * rank)
        res["a2a even"] = eo.tolist()
        lo = [torch.empty(k + 1).to(dev) for k in range(world)]
        dist.all_to_all(lo, [torch.full((rank + 1,), float(rank * 10 + k)).to(dev)
                             for k in range(world)])
        res["a2a list"] = [t.tolist() for t in lo]
        if dev == "npu":
            torch.npu.synchronize()
        out[f"staged {dev}"] = len(staged) - before
    torch_work.Staging.buffer = real_buffer
    dist.barrier()
    dist.destroy_process_group()
    return out


def deferred_works(rank: int) -> dict:
    import time
    import warnings

    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401

    import hccl.torch_backend  # noqa: F401

    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    pg = dist.distributed_c10d._get_default_group()
    completer = pg._completer
    out: dict = {}
    x = torch.full((64,), float(rank + 1), device="npu")
    dist.all_reduce(x)                      # the Call bound
    torch.npu.synchronize()
    def late_peer():
        dist.barrier()
        deadline = time.monotonic() + 5
        while completer._queued and time.monotonic() < deadline:
            time.sleep(0.001)   # the barrier's Work counted queued until its thread is done
        if rank == 1:
            time.sleep(0.3)

    # late peer: rank 0's Work is deferred, not handed to the completer thread
    late_peer()
    w = dist.all_reduce(x, async_op=True)
    out["deferred"] = len(completer._deferred) if rank == 0 else None
    out["queued"] = completer._queued
    torch.npu.synchronize()                 # the collective is done; its Work not completed yet
    out["finished_before_next"] = w._finished
    y = torch.ones(64, device="npu")
    dist.all_reduce(y)                      # the group's next call completes it first
    out["finished_after_next"] = w._finished and w.is_success()
    out["x"] = x[:2].tolist()
    # a deferred Work whose future is asked for: handed to the thread, which completes it
    late_peer()
    w2 = dist.all_reduce(x, async_op=True)
    fut = w2.get_future()
    out["future"] = fut.wait()[0][:2].tolist()
    out["completed"] = w2.is_completed()
    # is_completed() completes a deferred Work whose end is reached
    late_peer()
    w3 = dist.all_reduce(x, async_op=True)
    torch.npu.synchronize()
    out["polled"] = w3.is_completed()
    out["left"] = len(completer._deferred)
    # a temporary all-reduced and dropped is not kept alive by the backend past the next call
    import gc
    import weakref
    tmp = torch.ones(16, device="npu")
    ref = weakref.ref(tmp)
    dist.all_reduce(tmp)
    torch.npu.synchronize()
    del tmp
    dist.all_reduce(y)
    torch.npu.synchronize()
    deadline = time.monotonic() + 5
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()        # (a Work the completer thread holds: released once it is done)
        time.sleep(0.01)
    out["freed"] = ref() is None
    dist.barrier()
    dist.destroy_process_group()
    return out
