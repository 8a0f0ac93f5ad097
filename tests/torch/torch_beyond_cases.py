"""Rank-side code of the "beyond DDP" tests: torch.distributed calls past DDP's, on any backend.

``run_beyond(rank, backend)`` runs every case on deterministic per-rank inputs and returns
``{case: [numpy arrays]}``, so the parent compares gloo's and hccl's results without unpickling
torch state. ``p2p_orders(rank)`` posts receives before sends (rings, batch_isend_irecv).
"""
from __future__ import annotations

import numpy as np

from torch_cases import _inputs, _np


def _collectives(torch, dist, rank, world, out):
    last = world - 1
    for root in (0, last):
        case = f"gather/root{root}"
        t = _inputs(torch, rank, case, (3, 4), torch.float32)
        outs = [torch.empty_like(t) for _ in range(world)] if rank == root else None
        dist.gather(t, outs, dst=root)
        out[case] = [_np(o) for o in outs] if rank == root else []
        case = f"scatter/root{root}"
        ins = [_inputs(torch, r, case, (5,), torch.int64) for r in range(world)]
        o = torch.empty(5, dtype=torch.int64)
        dist.scatter(o, ins if rank == root else None, src=root)
        out[case] = [_np(o)]

    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "word": "x" * (rank + 1)})
    out["all_gather_object"] = [np.array([o["rank"] for o in objs]),
                                np.array([len(o["word"]) for o in objs])]
    got = [None] * world if rank == last else None
    dist.gather_object(("from", rank, list(range(rank))), got, dst=last)
    out["gather_object"] = [np.array([len(g[2]) + g[1] for g in got])] if rank == last else []
    recv = [None]
    dist.scatter_object_list(recv, [{"to": r, "n": r * 3} for r in range(world)]
                             if rank == 0 else None, src=0)
    out["scatter_object_list"] = [np.array([recv[0]["to"], recv[0]["n"]])]
    lst = [f"rank{rank}", rank * 2] if rank == 1 else [None, None]
    dist.broadcast_object_list(lst, src=1)
    out["broadcast_object_list"] = [np.array([len(lst[0]), lst[1]])]

    ins = [_inputs(torch, rank, f"agc/{k}", (k + 2,), torch.float64) for k in range(3)]
    outs = [[torch.empty_like(t) for t in ins] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    out["all_gather_coalesced"] = [_np(o) for per_rank in outs for o in per_rank]
    ts = [_inputs(torch, rank, f"arc/{k}", (k + 3,), torch.int32) for k in range(3)]
    dist.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = [_np(t) for t in ts]


def _bool_and_bitwise(torch, dist, rank, world, out):
    R = dist.ReduceOp
    for name, op in (("sum", R.SUM), ("product", R.PRODUCT), ("min", R.MIN), ("max", R.MAX),
                     ("band", R.BAND), ("bor", R.BOR), ("bxor", R.BXOR)):
        case = f"bool/all_reduce/{name}"
        t = _inputs(torch, rank, case, (4, 9), torch.int64) > 0
        dist.all_reduce(t, op=op)
        out[case] = [t.numpy().copy()]
    t = _inputs(torch, rank, "bool/bcast", (13,), torch.int64) > 0
    dist.broadcast(t, src=world - 1)
    out["bool/broadcast"] = [t.numpy().copy()]
    t = _inputs(torch, rank, "bool/ag", (6,), torch.int64) > 0
    outs = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(outs, t)
    out["bool/all_gather"] = [o.numpy().copy() for o in outs]
    for name, op in (("band", R.BAND), ("bor", R.BOR), ("bxor", R.BXOR)):
        for dtype in (torch.int32, torch.int64, torch.uint8, torch.int8):
            case = f"bitwise/all_reduce/{name}/{dtype}"
            g = torch.Generator().manual_seed(rank * 31 + len(case))
            t = torch.randint(0, 127, (5, 6), generator=g, dtype=torch.int64).to(dtype)
            dist.all_reduce(t, op=op)
            out[case] = [_np(t)]
        case = f"bitwise/reduce/{name}"
        t = torch.tensor([rank * 5 + 3, 1 << rank, 255 - rank], dtype=torch.int64)
        dist.reduce(t, dst=world - 1, op=op)
        out[case] = [_np(t)] if rank == world - 1 else []


def _any_source_and_sparse(torch, dist, rank, world, out):
    # rank 0 receives one message from every other rank without naming the source
    if rank == 0:
        got = {}
        for _ in range(world - 1):
            t = torch.empty(4, dtype=torch.int64)
            src = dist.recv(t)
            got[src] = t.tolist()
        out["recv/any_source"] = [np.array([[s, *got[s]] for s in sorted(got)])]
    else:
        dist.send(torch.arange(4, dtype=torch.int64) * 10 + rank, dst=0)
        out["recv/any_source"] = []
    for dtype in (torch.float64, torch.int64):
        i = torch.tensor([[rank, (rank + 1) % 5, 4], [0, 2, rank % 3]])
        v = (torch.arange(3) + rank * 3 + 1).to(dtype)
        t = torch.sparse_coo_tensor(i, v, (5, 3))
        dist.all_reduce(t)
        out[f"sparse/all_reduce/{dtype}"] = [_np(t.to_dense())]


def _groups_and_functional(torch, dist, rank, world, out):
    import torch.distributed._functional_collectives as funcol

    sub = dist.new_group(list(range(world - 1)) if world > 2 else [0, 1])
    if rank in range(max(world - 1, 2)):
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        out["subgroup/all_reduce"] = [_np(t)]
    else:
        out["subgroup/all_reduce"] = []
    dist.destroy_process_group(sub)
    g = dist.group.WORLD
    t = _inputs(torch, rank, "funcol/ar", (7,), torch.float64)
    out["funcol/all_reduce"] = [_np(funcol.all_reduce(t, "sum", g).wait())]
    t = _inputs(torch, rank, "funcol/ag", (2, 3), torch.float32)
    out["funcol/all_gather_tensor"] = [_np(funcol.all_gather_tensor(t, 0, g).wait())]
    t = _inputs(torch, rank, "funcol/rs", (world * 2, 3), torch.float64)
    out["funcol/reduce_scatter_tensor"] = [_np(funcol.reduce_scatter_tensor(t, "sum", 0, g)
                                               .wait())]
    t = _inputs(torch, rank, "funcol/a2a", (world * 2,), torch.int64)
    out["funcol/all_to_all_single"] = [_np(funcol.all_to_all_single(t, None, None, g).wait())]
    t = _inputs(torch, rank, "funcol/bc", (5,), torch.float32)
    out["funcol/broadcast"] = [_np(funcol.broadcast(t, world - 1, g).wait())]


def run_beyond(rank: int, backend: str) -> dict:
    import warnings

    import torch
    import torch.distributed as dist

    import hccl.torch_backend  # noqa: F401  (registers "hccl" and the npusim env:// store)
    # torch 2.13 deprecates the *_tensor spellings; sparse and object calls warn as well
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    dist.init_process_group(backend=backend)
    world, out = dist.get_world_size(), {}
    _collectives(torch, dist, rank, world, out)
    _bool_and_bitwise(torch, dist, rank, world, out)
    _any_source_and_sparse(torch, dist, rank, world, out)
    _groups_and_functional(torch, dist, rank, world, out)
    out.update(p2p_orders(rank, torch, dist))
    dist.destroy_process_group()
    return out


def p2p_orders(rank, torch, dist) -> dict:
    """Receives posted before their sends on every rank: rings both ways, batch_isend_irecv
    with the receives listed first, and a pipeline whose stages receive before they send."""
    world, out = dist.get_world_size(), {}
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for rnd in range(3):
        got_l, got_r = torch.empty(6, dtype=torch.float64), torch.empty(6, dtype=torch.float64)
        reqs = [dist.irecv(got_l, prv), dist.irecv(got_r, nxt)]
        mine = _inputs(torch, rank, f"ring/{rnd}", (6,), torch.float64)
        reqs += [dist.isend(mine, nxt), dist.isend(mine * 2, prv)]
        for r in reqs:
            r.wait()
        out[f"p2p/ring/{rnd}"] = [_np(got_l), _np(got_r)]
    got = [torch.empty(3, dtype=torch.int64) for _ in range(2)]
    ops = [dist.P2POp(dist.irecv, got[0], prv), dist.P2POp(dist.irecv, got[1], nxt),
           dist.P2POp(dist.isend, torch.arange(3) + 100 * rank, nxt),
           dist.P2POp(dist.isend, torch.arange(3) - 100 * rank, prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    out["p2p/batch_isend_irecv"] = [_np(g) for g in got]
    # pipeline: stage s receives from s-1 (posted first) then sends on; the last stage sends
    # the result back to stage 0 whose receive was also posted first
    act = torch.empty(4, dtype=torch.float64)
    back = dist.irecv(act, world - 1) if rank == 0 else dist.irecv(act, prv)
    if rank == 0:
        dist.isend(torch.ones(4, dtype=torch.float64), 1).wait()
    else:
        back.wait()
        dist.isend(act * (rank + 1), nxt).wait()
    if rank == 0:
        back.wait()
    out["p2p/pipeline"] = [_np(act)]
    return out


def both_backends(rank: int) -> dict:
    return {"gloo": run_beyond(rank, "gloo"), "hccl": run_beyond(rank, "hccl")}
