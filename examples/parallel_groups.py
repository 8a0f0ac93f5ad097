"""Tensor x pipeline x data parallel sub-communicators from a world of N, as Megatron lays them out.

    npurun --nproc-per-node 16 examples/parallel_groups.py --tp 2 --pp 2          # dp = 16/4 = 4
    npurun --nproc-per-node 128 examples/parallel_groups.py --tp 4 --pp 4         # 4 x 4 x 8
    HCCL_EXEC_TIMEOUT=60 npurun --nproc-per-node 16 examples/parallel_groups.py --tp 2 --pp 2 \
        --hang-rank 5

Layout (tensor-parallel ranks adjacent, as Megatron-LM's default order): rank
r = pp_index * (dp * tp) + dp_index * tp + tp_index. A tensor-parallel (TP) group is tp
consecutive ranks; a data-parallel (DP) group takes one rank of each TP group of a pipeline
stage; a pipeline (PP) group takes the rank at the same (dp, tp) place in every stage. Every rank
creates every group in the same order (``comm.new_group``, torch's habit: non-members get None).

Each step runs each group's collective: an AllReduce in the TP group (activations), a broadcast
from the first stage along the PP group (standing in for the pipeline's sends), an AllReduce in
the DP group (gradients), and checks the values. With ``--hang-rank R`` rank R stops (sleeps in
user code) before its TP AllReduce of step 1: rank 0 prints where R sits and which groups it
blocks (its TP group at once; through them the DP and PP groups of its peers); npurun's hang
notice and verdict then name R with its stack and the communicator it never entered.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import hccl
import runtime


def layout(world: int, tp: int, pp: int) -> dict:
    """{"tp": [[ranks]...], "pp": [...], "dp": [...]} for a world of ``world`` ranks."""
    if tp < 1 or pp < 1 or world % (tp * pp):
        raise SystemExit(f"parallel_groups: --tp {tp} x --pp {pp} must divide the world size "
                         f"{world} (dp = world / (tp * pp))")
    dp = world // (tp * pp)

    def rank(p, d, t):
        return p * dp * tp + d * tp + t
    return {
        "tp": [[rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)],
        "dp": [[rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)],
        "pp": [[rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
    }


def groups_of(groups: dict, r: int) -> dict:
    """{"tp": (index, ranks), ...}: the groups rank ``r`` belongs to."""
    return {kind: next((i, g) for i, g in enumerate(gs) if r in g) for kind, gs in groups.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel group size")
    ap.add_argument("--pp", type=int, default=2, help="pipeline-parallel group size")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--count", type=int, default=256, help="float32 elements per collective")
    ap.add_argument("--hang-rank", type=int, default=None)
    a = ap.parse_args(argv)
    runtime.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    world = hccl.init_comm()
    n, me = world.size, world.rank
    if a.hang_rank is not None and not 0 <= a.hang_rank < n:
        raise SystemExit(f"parallel_groups: --hang-rank {a.hang_rank} is not a rank of the "
                         f"world of {n} (0..{n - 1})")
    groups = layout(n, a.tp, a.pp)
    mine = {}
    for kind in ("tp", "dp", "pp"):             # every rank, every group, the same order
        for i, ranks in enumerate(groups[kind]):
            c = world.new_group(ranks)
            if c is not None:
                mine[kind] = (i, ranks, c)
    if me == 0:
        dp = n // (a.tp * a.pp)
        print(f"parallel_groups: world {n} = tp {a.tp} x pp {a.pp} x dp {dp}: "
              f"{len(groups['tp'])} TP, {len(groups['pp'])} PP, {len(groups['dp'])} DP groups",
              flush=True)
        if a.hang_rank is not None:
            g = groups_of(groups, a.hang_rank)
            tp_peers = [r for r in g["tp"][1] if r != a.hang_rank]
            dp_blocked = sorted({i for r in tp_peers for i, gs in enumerate(groups["dp"])
                                 if r in gs} | {g["dp"][0]})
            pp_blocked = sorted({i for r in tp_peers for i, gs in enumerate(groups["pp"])
                                 if r in gs} | {g["pp"][0]})
            print(f"parallel_groups: rank {a.hang_rank} will stop before step 1: it is in TP "
                  f"group {g['tp'][0]} {g['tp'][1]}, DP group {g['dp'][0]} {g['dp'][1]}, PP "
                  f"group {g['pp'][0]} {g['pp'][1]}; it blocks TP group {g['tp'][0]} at once, "
                  f"then DP groups {dp_blocked} and PP groups {pp_blocked}", flush=True)
    x = runtime.empty(a.count, np.float32)
    t0 = time.perf_counter()
    for step in range(a.steps):
        if step == 1 and me == a.hang_rank:
            print(f"parallel_groups: rank {me} stops now, before step 1", flush=True)
            time.sleep(3600)                    # stuck in user code: the others wait for it
        _, tp_ranks, tp = mine["tp"]
        x.copy_from_host(np.full(a.count, me + 1, np.float32))
        tp.all_reduce(x)
        want = sum(r + 1 for r in tp_ranks)
        _, pp_ranks, pp = mine["pp"]
        pp.broadcast(x, root=0)                 # the first stage's TP sum
        want = sum(r + 1 for r in groups_of(groups, pp_ranks[0])["tp"][1])
        _, dp_ranks, dp = mine["dp"]
        dp.all_reduce(x)
        want = sum(sum(r + 1 for r in groups_of(groups, groups_of(groups, d)["pp"][1][0])
                       ["tp"][1]) for d in dp_ranks)
        got = x.to_host()
        if not np.all(got == want):
            raise SystemExit(f"parallel_groups: rank {me} step {step}: got {got[0]}, "
                             f"want {want}")
    world.barrier()
    runtime.synchronize()
    if me == 0:
        print(f"parallel_groups: {a.steps} steps of TP/PP/DP collectives OK in "
              f"{time.perf_counter() - t0:.2f} s", flush=True)
    for _, _, c in mine.values():
        c.destroy()
    world.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
