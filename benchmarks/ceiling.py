"""The memory ceiling of a collective on this node: ``python -m benchmarks.ceiling``.

A collective of S bytes on n ranks of one node moves at least some bytes through the memory of
every rank, whatever its transport. This module runs exactly that work in numpy, in n processes
at once (each repetition starts on a barrier), with no communication at all, and reports it as
nccl-tests' busbw; hccl.bench's conventions (out of place, Broadcast in place from rank 0):

- AllReduce: a rank reduces the n blocks of S/n of its share (n-1 adds into its recv block, the
  first straight from two inputs) and copies the n-1 blocks the others reduced: the
  reduce-scatter + all-gather data movement, the least any algorithm has;
- ReduceScatter: the reduce of its share only (S = the send buffer);
- AllGather: n copies of S/n into the recv buffer (S = the recv buffer; its own block too, out
  of place);
- Broadcast: every rank but the root writes S.

A rank's "peer" blocks are a second local array: reading a peer's memory in place costs the
same memory traffic. No implementation on this node can beat these figures, since the copies and
adds are the ones it has to make; ``benchmarks.compare`` prints npusim's share of them. With more ranks
than cores the processes also share the cores, as the ranks do.

Example: ``python -m benchmarks.ceiling --worlds 2,4 --sizes 16M,64M``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time

import numpy as np

from hccl.bench import busbw_factor, parse_size

COLLS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
_BARRIER_S = 60.0          # no repetition waits longer than this for the other processes


def work(coll: str, n: int, rank: int, nbytes: int):
    """The numpy work of one rank for collective ``coll`` of ``nbytes`` on ``n`` ranks, as a
    function of no arguments (its buffers allocated and touched here, not in the timing)."""
    if coll not in COLLS:
        raise ValueError(f"ceiling: unknown collective {coll!r} (one of {', '.join(COLLS)})")
    if n < 1 or nbytes < 4 * n:
        raise ValueError(f"ceiling: {nbytes} bytes on {n} ranks: at least 4 bytes per rank")
    c = nbytes // 4 // n                         # float32 elements per block
    if coll == "broadcast":
        src, dst = np.ones(c * n, np.float32), np.zeros(c * n, np.float32)
        return (lambda: None) if rank == 0 else (lambda: np.copyto(dst, src))
    if coll == "all_gather":
        peer, recv = np.ones(c * n, np.float32), np.zeros(c * n, np.float32)

        def gather():
            for k in range(n):
                np.copyto(recv[k * c:(k + 1) * c], peer[k * c:(k + 1) * c])
        return gather
    send, peer = np.ones(c * n, np.float32), np.ones(c * n, np.float32)
    recv = np.zeros(c * n, np.float32)
    mine = slice(rank * c, (rank + 1) * c)
    others = [slice(k * c, (k + 1) * c) for k in range(n) if k != rank]

    def reduce():
        out = recv[mine]
        if not others:
            np.copyto(out, send[mine])
            return
        np.add(send[mine], peer[others[0]], out=out)
        for s in others[1:]:
            np.add(out, peer[s], out=out)
    if coll == "reduce_scatter":
        return reduce

    def all_reduce():
        reduce()
        for s in others:
            np.copyto(recv[s], peer[s])
    return all_reduce


def _rank_main(coll, n, rank, nbytes, reps, barrier, results) -> None:
    try:
        fn = work(coll, n, rank, nbytes)
        fn()                                     # pages touched, caches warm
        times = []
        for _ in range(reps):
            barrier.wait(_BARRIER_S)
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        results.put((rank, times, None))
    except BaseException as e:  # noqa: BLE001 - reported by the parent, which never hangs
        barrier.abort()
        results.put((rank, None, f"{type(e).__name__}: {e}"))


def measure(coll: str, n: int, nbytes: int, reps: int = 7) -> dict:
    """Run the ceiling work of ``coll`` on ``n`` processes at once, ``reps`` times.

    Returns ``time_us`` (median over repetitions of the slowest process) and ``busbw_GBps``.
    Raises RuntimeError naming the process that failed; every process is gone on return.
    """
    work(coll, n, 0, nbytes)                     # bad arguments raise here, in the caller
    ctx = mp.get_context("spawn")                # no fork of a threaded parent
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(coll, n, r, nbytes, reps, barrier, results),
                         daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    got, errors = {}, []
    deadline = time.monotonic() + _BARRIER_S * (reps + 2)
    try:
        while len(got) + len(errors) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"ceiling {coll} x{n}: no result after {_BARRIER_S * (reps + 2):g} s")
            try:
                rank, times, err = results.get(timeout=min(left, 1.0))
            except Exception:                    # queue.Empty: check the processes are alive
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead and len(got) + len(errors) < n:
                    raise RuntimeError(f"ceiling {coll} x{n}: process {dead[0]} exited with "
                                       f"{procs[dead[0]].exitcode}") from None
                continue
            if err is None:
                got[rank] = times
            else:
                errors.append(f"process {rank}: {err}")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
        results.join_thread()
    if errors:
        raise RuntimeError(f"ceiling {coll} x{n}, {nbytes} bytes: {'; '.join(errors)}")
    slowest = [max(got[r][i] for r in got) for i in range(reps)]
    t = statistics.median(slowest)
    return {"coll": coll, "world": n, "bytes": nbytes, "time_us": t * 1e6,
            "busbw_GBps": nbytes / t / 1e9 * busbw_factor(coll, n) if t > 0 else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ceiling", description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--colls", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args(argv)
    print("| world | collective | size (B) | time (us) | busbw GB/s |\n|---|---|---|---|---|")
    for w in (int(x) for x in a.worlds.split(",")):
        for coll in a.colls.split(","):
            for size in (parse_size(s) for s in a.sizes.split(",")):
                r = measure(coll, w, size, a.reps)
                print(f"| {w} | {coll} | {size} | {r['time_us']:,.0f} | {r['busbw_GBps']:.2f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
