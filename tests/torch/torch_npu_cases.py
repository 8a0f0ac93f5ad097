"""Rank-side code of tests/torch/test_torch_npu_backend.py: the "hccl" backend on npu tensors.

Returns plain lists and numbers (no tensors cross the process boundary).
"""
from __future__ import annotations


def npu_collectives(rank: int) -> dict:
    import threading
    import time
    import warnings

    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401  (npusim's npu device)

    import hccl.torch_backend  # noqa: F401
    import runtime
    from hccl.torch import work as torch_work

    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    torch.npu.set_device(rank)
    dist.init_process_group("hccl")
    world = dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    staged = []
    real_buffer = torch_work.Staging.buffer

    def counting(self, count, dtype):
        staged.append(count)
        return real_buffer(self, count, dtype)
    torch_work.Staging.buffer = counting
    out: dict = {}

    def npu(values):
        return torch.tensor(values, dtype=torch.float32).npu()

    x = npu([1.0 + rank, 2.0, 3.0])
    dist.all_reduce(x)
    out["all_reduce"] = x.tolist()
    y = npu([float(rank)] * 3)
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    out["avg"] = y.tolist()
    mx = npu([float(rank), -float(rank)])
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    out["max"] = mx.tolist()
    b = npu([rank + 5.0] * 2)
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = b.tolist()
    outs = [torch.empty(2, device="npu") for _ in range(world)]
    dist.all_gather(outs, npu([float(rank)] * 2))
    out["all_gather"] = [o.tolist() for o in outs]
    o = torch.empty(2 * world, device="npu")
    dist.all_gather_into_tensor(o, npu([float(rank)] * 2))
    out["all_gather_into_tensor"] = o.tolist()
    rs = torch.empty(2, device="npu")
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * world).npu() + rank)
    out["reduce_scatter_tensor"] = rs.tolist()
    rl = torch.empty(2, device="npu")
    dist.reduce_scatter(rl, [npu([float(i + rank)] * 2) for i in range(world)])
    out["reduce_scatter"] = rl.tolist()
    rd = npu([rank + 1.0] * 3)
    dist.reduce(rd, dst=0)
    out["reduce"] = rd.tolist()
    a2 = torch.empty(world, device="npu")
    dist.all_to_all_single(a2, torch.arange(float(world)).npu() + 10 * rank)
    out["all_to_all_single"] = a2.tolist()
    nc = torch.arange(12.0).view(3, 4).npu().t()          # non-contiguous, in place
    dist.all_reduce(nc)
    out["non_contiguous"] = nc.tolist()
    if rank == 0:
        dist.send(npu([7.0, 8.0]), 1)
    elif rank == 1:
        t = torch.empty(2, device="npu")
        dist.recv(t, 0)
        out["recv"] = t.tolist()
    out["staged"] = list(staged)            # none of the above staged a buffer

    # the collective runs after the kernels that produced its input, and wait() does not block
    # the host: hold the current stream, queue a kernel on it, all_reduce, wait, release
    s = torch.npu.current_stream()
    go = threading.Event()
    runtime.launch(lambda: go.wait(30), stream=s.npu_stream)
    z = torch.ones(4, device="npu")
    z.mul_(rank + 2)                       # a task queued behind the held kernel
    t0 = time.monotonic()
    w = dist.all_reduce(z, async_op=True)
    w.wait()
    out["wait_returned_while_held"] = not go.is_set() and time.monotonic() - t0 < 5
    go.set()
    out["ordered"] = z.tolist()            # sum over ranks of (rank + 2)

    # repeated calls on the same tensor: one bound Call; no device memory allocated per call
    g = torch.ones(1024, device="npu")
    dist.all_reduce(g)
    torch.npu.synchronize()
    calls, mem = len(pg.comm._calls), torch.npu.memory_allocated()
    for _ in range(5):
        dist.all_reduce(g)
    torch.npu.synchronize()
    out["calls_added"] = len(pg.comm._calls) - calls
    out["memory_added"] = torch.npu.memory_allocated() - mem
    out["g"] = g[:2].tolist()
    out["staged_after"] = list(staged)
    # CPU tensors still stage as before
    c = torch.ones(3)
    dist.all_reduce(c)
    out["cpu"] = c.tolist()
    out["cpu_staged"] = len(staged) - len(out["staged_after"])
    # bad input: npu tensors of two NPUs in one call
    try:
        dist.all_gather([torch.empty(1, device="npu"), torch.empty(1, device="npu:7")],
                        torch.ones(1, device="npu"))
        out["mixed"] = None
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["mixed"] = f"{type(e).__name__}: {e}"
    torch_work.Staging.buffer = real_buffer
    dist.barrier()
    dist.destroy_process_group()
    return out


def device_id_and_batched_p2p(rank: int) -> dict:
    """init_process_group(device_id=npu:N), as torch_npu scripts write it for eager init, then
    a subgroup and batch_isend_irecv on npu and CPU tensors (torch asks the group for its
    backend on the device in each: hccl/torch/backend.py, ``_get_backend``)."""
    import torch
    import torch.distributed as dist
    import torch_npu  # noqa: F401

    import hccl.torch_backend  # noqa: F401

    torch.npu.set_device(rank)
    dist.init_process_group("hccl", device_id=torch.device(f"npu:{rank}"))
    world = dist.get_world_size()
    out: dict = {}
    x = torch.full((3,), float(rank + 1), device="npu")
    dist.all_reduce(x)
    out["all_reduce"] = x.tolist()
    sub = dist.new_group(list(range(world)))
    dist.all_reduce(x, group=sub)
    out["subgroup"] = x.tolist()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for dev in ("npu", "cpu"):
        got = torch.zeros(2, device=dev)
        ops = [dist.P2POp(dist.irecv, got, prv),
               dist.P2POp(dist.isend, torch.full((2,), 10.0 * rank, device=dev), nxt)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        out[f"batch_p2p_{dev}"] = got.tolist()
    dist.destroy_process_group()
    return out
