"""Rank-side code of the torch backend tests: the same collectives run under any backend.

``run_suite(rank, backend)`` initialises torch.distributed with ``backend`` from the job's
environment, runs every case on deterministic per-rank inputs and returns ``{case: [tensors]}``
(numpy arrays, so the parent compares them without unpickling torch state).
"""
from __future__ import annotations

import numpy as np


def _inputs(torch, rank, case, shape, dtype):
    g = torch.Generator().manual_seed(1000 * rank + sum(map(ord, case)))
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, shape, generator=g, dtype=torch.int64).to(dtype)


def _np(t):
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return t.numpy().copy()


def run_suite(rank: int, backend: str) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    import hccl.torch_backend  # noqa: F401  (registers "hccl" and the npusim env:// store)
    # torch 2.13 deprecates the *_tensor spellings, which torch_npu scripts still use
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    dist.init_process_group(backend=backend)
    world = dist.get_world_size()
    out: dict = {}
    f32, f64, f16, bf16 = torch.float32, torch.float64, torch.float16, torch.bfloat16
    ints = [torch.int32, torch.int64, torch.int8, torch.uint8]

    ops = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
           "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    for dtype in [f32, f64, f16, bf16, *ints]:
        for name, op in ops.items():
            if name == "product" and dtype in (torch.int8, torch.uint8):
                continue       # overflow behaviour is not what is under test
            case = f"all_reduce/{name}/{dtype}"
            t = _inputs(torch, rank, case, (5, 7), dtype)
            dist.all_reduce(t, op=op)
            out[case] = [_np(t)]
    # AVG: gloo has none; the hccl result is compared with gloo's SUM / world by the test
    for dtype in (f32, f64):
        case = f"all_reduce/avg/{dtype}"
        t = _inputs(torch, rank, case, (33,), dtype)
        if backend == "gloo":
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= world
        else:
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
        out[case] = [_np(t)]

    # a non-contiguous tensor (a transposed view) is reduced in place through its strides
    base = _inputs(torch, rank, "noncontig", (6, 4), f32)
    view = base.t()
    dist.all_reduce(view)
    out["all_reduce/noncontiguous"] = [_np(base)]

    for root in (0, world - 1):
        case = f"broadcast/root{root}"
        t = _inputs(torch, rank, case, (17,), f64)
        dist.broadcast(t, src=root)
        out[case] = [_np(t)]
        t = _inputs(torch, rank, case + "/int", (9,), torch.int64)
        dist.broadcast(t, src=root)
        out[case + "/int"] = [_np(t)]

    for name in ("sum", "max"):
        case = f"reduce/{name}"
        root = world - 1
        t = _inputs(torch, rank, case, (11,), f32)
        dist.reduce(t, dst=root, op=ops[name])
        out[case] = [_np(t)] if rank == root else []

    for dtype in (f32, torch.int32, bf16):
        case = f"all_gather/{dtype}"
        t = _inputs(torch, rank, case, (3, 5), dtype)
        outs = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(outs, t)
        out[case] = [_np(o) for o in outs]
        whole = torch.empty((world * 3, 5), dtype=dtype)
        dist.all_gather_into_tensor(whole, t)
        out[case + "/into_tensor"] = [_np(whole)]

    for name in ("sum", "max"):
        for dtype in (f64, torch.int64):
            case = f"reduce_scatter_tensor/{name}/{dtype}"
            t = _inputs(torch, rank, case, (world * 4, 2), dtype)
            o = torch.empty((4, 2), dtype=dtype)
            dist.reduce_scatter_tensor(o, t, op=ops[name])
            out[case] = [_np(o)]
    case = "reduce_scatter/list"
    ins = [_inputs(torch, rank, f"{case}/{i}", (6,), f32) for i in range(world)]
    o = torch.empty(6)
    dist.reduce_scatter(o, ins)
    out[case] = [_np(o)]

    case = "all_to_all_single/even"
    t = _inputs(torch, rank, case, (world * 3, 2), f32)
    o = torch.empty_like(t)
    dist.all_to_all_single(o, t)
    out[case] = [_np(o)]
    # uneven splits: rank r sends (r + d + 1) rows to rank d
    case = "all_to_all_single/uneven"
    in_splits = [rank + d + 1 for d in range(world)]
    out_splits = [s + rank + 1 for s in range(world)]
    t = _inputs(torch, rank, case, (sum(in_splits), 3), torch.int64)
    o = torch.empty((sum(out_splits), 3), dtype=torch.int64)
    dist.all_to_all_single(o, t, out_splits, in_splits)
    out[case] = [_np(o)]

    dist.barrier()

    # point to point around the ring; even ranks send first so no rank waits for a cycle
    case = "send_recv/ring"
    mine = _inputs(torch, rank, case, (8,), f64)
    got = torch.empty(8, dtype=f64)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if rank % 2 == 0:
        dist.send(mine, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(mine, nxt)
    out[case] = [_np(got)]

    # a sub-group of the first and last ranks
    pair = dist.new_group([0, world - 1])
    case = "new_group/all_reduce"
    t = _inputs(torch, rank, case, (10,), f32)
    if rank in (0, world - 1):
        dist.all_reduce(t, group=pair)
    out[case] = [_np(t)]

    # async: three collectives in flight, then wait
    ts = [_inputs(torch, rank, f"async/{i}", (100,), f32) for i in range(3)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    out["async/all_reduce"] = [_np(t) for t in ts]
    fut = dist.all_reduce(_inputs(torch, rank, "future", (4,), f64), async_op=True).get_future()
    out["async/future"] = [_np(fut.wait()[0])]

    dist.destroy_process_group()
    return out


def both_backends(rank: int) -> dict:
    """The suite on gloo, then on hccl, in the same process (torch is imported once)."""
    return {"gloo": run_suite(rank, "gloo"), "hccl": run_suite(rank, "hccl")}


def tolerance(key: str) -> dict:
    if "float16" in key or "bfloat16" in key:
        return {"rtol": 1e-2, "atol": 1e-2}
    return {"rtol": 1e-5, "atol": 1e-6}


def compare(gloo: dict, hccl: dict) -> list[str]:
    """Differences between the two backends' results (empty when they agree)."""
    bad = []
    assert gloo.keys() == hccl.keys()
    for key in gloo:
        a, b = gloo[key], hccl[key]
        if len(a) != len(b):
            bad.append(f"{key}: {len(a)} vs {len(b)} tensors")
            continue
        for x, y in zip(a, b):
            if x.shape != y.shape or x.dtype != y.dtype:
                bad.append(f"{key}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
            elif x.dtype.kind in "iub":
                if not np.array_equal(x, y):
                    bad.append(f"{key}: integers differ: {x.ravel()[:6]} vs {y.ravel()[:6]}")
            elif not np.allclose(x, y, **tolerance(key)):
                bad.append(f"{key}: max |diff| {np.max(np.abs(x - y))}")
    return bad


# ---------------------------------------------------------------------- DDP
DDP_STEPS, DDP_BATCH, DDP_IN, DDP_OUT = 6, 48, 16, 4


def ddp_model(torch):
    """The model every test process builds (float64, so ordering noise stays near 1e-15)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(DDP_IN, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, DDP_OUT)).double()


def ddp_data(torch):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(DDP_STEPS, DDP_BATCH, DDP_IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, DDP_OUT, (DDP_STEPS, DDP_BATCH), generator=g)
    return x, y


def train(torch, model, x, y, rows=slice(None)):
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for step in range(DDP_STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[step, rows]), y[step, rows])
        loss.backward()
        opt.step()


def ddp_replica(rank: int) -> list:
    """Train under DDP on "hccl"; each rank starts from different weights (DDP's start-up
    broadcast must replace them with rank 0's) and trains on its slice of every batch."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import hccl.torch_backend  # noqa: F401
    dist.init_process_group(backend="hccl")
    world = dist.get_world_size()
    model = ddp_model(torch)
    if rank:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(rank)
    ddp = DDP(model, bucket_cap_mb=0.01)          # ~10 KB buckets: several all_reduces per step
    x, y = ddp_data(torch)
    local = DDP_BATCH // world
    train(torch, ddp, x, y, slice(rank * local, (rank + 1) * local))
    params = [p.detach().numpy().copy() for p in model.parameters()]
    dist.destroy_process_group()
    return params


def single_process_reference() -> list:
    import torch
    model = ddp_model(torch)
    x, y = ddp_data(torch)
    train(torch, model, x, y)
    return [p.detach().numpy().copy() for p in model.parameters()]


# ---------------------------------------------------------------------- errors
def async_mismatch(rank: int) -> dict:
    """Rank 0 all_reduces while the others all_gather: every Work.wait() raises the mismatch."""
    import torch
    import torch.distributed as dist

    import hccl
    import hccl.torch_backend  # noqa: F401
    dist.init_process_group(backend="hccl")
    t = torch.ones(8)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
    else:
        work = dist.all_gather_into_tensor(torch.empty(8 * dist.get_world_size()), t,
                                           async_op=True)
    out = {}
    try:
        work.wait()
        out["first"] = None
    except Exception as e:  # noqa: BLE001 - the test inspects it
        out["first"] = (isinstance(e, hccl.CollectiveMismatchError), str(e))
    later = dist.all_reduce(torch.ones(2), async_op=True)     # the communicator stays aborted
    try:
        later.wait()
        out["later"] = None
    except Exception as e:  # noqa: BLE001
        out["later"] = isinstance(e, hccl.HcclError)
    out["future_failed"] = later.get_future().done() and not later.is_success()
    dist.destroy_process_group()
    return out


def bad_calls(rank: int) -> dict:
    """Bad arguments raise InvalidArgumentError at the call; the group keeps working."""
    import torch
    import torch.distributed as dist

    import hccl
    import hccl.torch_backend  # noqa: F401
    dist.init_process_group(backend="hccl")
    world = dist.get_world_size()
    calls = {
        "band": lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND),
        "int_avg": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                           op=dist.ReduceOp.AVG),
        "gather_size": lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)),
        "float8": lambda: dist.all_reduce(torch.ones(2).to(torch.float8_e5m2)),
        "splits": lambda: dist.all_to_all_single(torch.empty(4), torch.ones(4), [1] * world,
                                                 [5] + [0] * (world - 1)),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except hccl.InvalidArgumentError as e:
            out[name] = str(e)
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out["after"] = t.tolist()
    dist.destroy_process_group()
    return out


def ddp_and_mismatch(rank: int) -> dict:
    return {"ddp": ddp_replica(rank), "bad": bad_calls(rank), "mismatch": async_mismatch(rank)}
