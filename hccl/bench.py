"""nccl-tests style sweep: ``npurun --nproc-per-node N -m hccl.bench -b 8 -e 64M -f 2 -o all_reduce``.

One row per size: size (bytes), count (elements), type, redop, time (us), algbw and busbw (GB/s)
and #wrong (elements that differ from the expected value when ``-c 1``; every element of every
rank's send buffer depends on its rank and index, as in nccl-tests, see ``expected``). time is the mean over
``-n`` iterations of the slowest rank (``--timing median``: the median over calls of the slowest
rank's; ``--target-s``: as many calls as fill that time, as the peers' benchmarks do); busbw as nccl-tests defines it: algbw x 2(n-1)/n for
AllReduce, x (n-1)/n for AllGather / ReduceScatter / AlltoAll, x 1 for Broadcast / Reduce.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

import hccl
import runtime
from hccl import DataType, ReduceOp

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'64M' -> 67108864 (K, M, G suffixes, powers of 1024)."""
    t = text.strip().upper().rstrip("B")
    mult = _UNITS.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in _UNITS else t) * mult)


def busbw_factor(op: str, n: int) -> float:
    """Bus bandwidth / algorithm bandwidth of ``op`` on ``n`` ranks, as nccl-tests defines it."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def enqueue(op: str, comm, send, recv, count, dt, redop, stream, root: int = 0) -> None:
    """Enqueue collective ``op`` (its hccl function's name) with the bench's argument
    conventions (AllToAll: ``count`` per peer both ways); benchmarks/stress.py uses it too."""
    if op == "all_reduce":
        hccl.all_reduce(send, recv, count, dt, redop, comm, stream)
    elif op == "all_gather":
        hccl.all_gather(send, recv, count, dt, comm, stream)
    elif op == "reduce_scatter":
        hccl.reduce_scatter(send, recv, count, dt, redop, comm, stream)
    elif op == "broadcast":
        hccl.broadcast(recv, count, dt, root, comm, stream)
    elif op == "reduce":
        hccl.reduce(send, recv, count, dt, redop, root, comm, stream)
    elif op == "all_to_all":
        hccl.all_to_all(send, count, recv, count, dt, comm, stream)
    elif op == "barrier":
        hccl.barrier(comm, stream)
    else:
        raise SystemExit(f"hccl.bench: unknown collective {op!r}")


def _layout(op: str, nbytes: int, n: int, itemsize: int):
    """(count per HCCL call, send elements, recv elements) for S = nbytes as nccl-tests counts it."""
    total = max(nbytes // itemsize, 0)
    c = total // n if op in ("all_gather", "reduce_scatter", "all_to_all") else total
    return (c, *_layout_counts(op, n, c))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hccl.bench", description=__doc__.splitlines()[0])
    ap.add_argument("-b", "--minbytes", default="8")
    ap.add_argument("-e", "--maxbytes", default="32M")
    ap.add_argument("-f", "--stepfactor", type=float, default=2)
    ap.add_argument("-o", "--op", default="all_reduce",
                    choices=["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"])
    ap.add_argument("-d", "--datatype", default="float32")
    ap.add_argument("-r", "--redop", default="sum")
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup_iters", type=int, default=5)
    ap.add_argument("-c", "--check", type=int, default=1)
    ap.add_argument("--sizes", default=None,
                    help="comma-separated sizes (e.g. 1K,64K,1M); replaces -b/-e/-f")
    ap.add_argument("--timing", choices=["mean", "median"], default="mean",
                    help="mean: nccl-tests (iterations back to back, mean of the slowest rank); "
                         "median: each call waited for, median over calls of the slowest rank "
                         "(the peers' benchmarks' convention: enqueue-to-completion)")
    ap.add_argument("--target-s", type=float, default=None,
                    help="the peers' benchmarks' policy instead of -n / -w: warm up for ~0.1 s "
                         "(at least -w calls), then as many calls as fill TARGET_S seconds "
                         "(5 to 20,000), every rank agreeing")
    ap.add_argument("--json", default=None, help="rank 0 writes the rows here")
    a = ap.parse_args(argv)
    runtime.set_device(hccl.config.job().local_rank or 0)
    comm = hccl.init_comm()
    n, rank = comm.size, comm.rank
    dt = DataType.of(a.datatype)
    redop = ReduceOp[a.redop.upper()]
    s = runtime.Stream()
    if rank == 0:
        calls = (f"iters {a.iters}, warmup {a.warmup_iters}" if a.target_s is None else
                 f"iters to fill {a.target_s:g} s after ~0.1 s of warm-up")
        print(f"# npusim hccl.bench: {a.op}, {n} ranks, {dt.name}, {redop.name}, {calls}", flush=True)
        print(f"#{'size':>12} {'count':>12} {'type':>6} {'redop':>6} {'time':>10} {'algbw':>8} "
              f"{'busbw':>8} {'#wrong':>7}\n#{'(B)':>12} {'(elements)':>12} {'':>6} {'':>6} "
              f"{'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}", flush=True)
    sizes = [parse_size(x) for x in a.sizes.split(",")] if a.sizes else \
        _sweep(parse_size(a.minbytes), parse_size(a.maxbytes), a.stepfactor)
    t_dev = runtime.empty(1, np.float64)
    total_wrong = 0
    rows = []
    for size in sizes:
        count, ns, nr = _layout(a.op, size, n, dt.itemsize)
        send = runtime.to_device(send_values(a.op, rank, n, count, dt, redop))
        recv = send if a.op == "broadcast" else runtime.empty(nr, dt.numpy)
        iters = a.iters
        if a.target_s is None:
            for _ in range(a.warmup_iters):
                enqueue(a.op, comm, send, recv, count, dt, redop, s)
        else:
            iters = _iters_for(a, lambda: enqueue(a.op, comm, send, recv, count, dt, redop, s),
                               s, t_dev, comm)
        comm.barrier(stream=s)
        s.synchronize()
        if a.timing == "median":
            t, wall = _median_of_slowest(iters, comm, send, recv, count, dt, redop, s, a.op)
            wall = _agree_max(wall, t_dev, comm, s)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                enqueue(a.op, comm, send, recv, count, dt, redop, s)
            s.synchronize()
            t = wall = _agree_max((time.perf_counter() - t0) / max(iters, 1), t_dev, comm, s)
        wrong = 0
        if a.check:
            wrong = count_wrong(a.op, recv.to_host(stream=s), rank, n, count, dt, redop)
        total_wrong += wrong
        nbytes = count * dt.itemsize * (n if a.op in ("all_gather", "reduce_scatter", "all_to_all") else 1)
        algbw = nbytes / t / 1e9 if t > 0 else 0.0
        if rank == 0:
            print(f" {nbytes:>12} {count:>12} {dt.name.lower():>6} {redop.name.lower():>6} {t * 1e6:>10.1f} "
                  f"{algbw:>8.3f} {algbw * busbw_factor(a.op, n):>8.3f} {wrong:>7}", flush=True)
        rows.append({"coll": a.op, "world": n, "bytes": nbytes, "time_us": t * 1e6,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(a.op, n),
                     "wrong": wrong, "timing": a.timing, "iters": iters,
                     "wall_us": wall * 1e6})
        if recv is not send:
            recv.free()
        send.free()
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"results": rows}, f, indent=1)
    comm.destroy()
    runtime.reset_device()
    return 1 if total_wrong else 0


def _sweep(lo: int, hi: int, factor: float) -> list[int]:
    out, size = [], lo
    while size <= hi:
        out.append(size)
        size = max(size + 1, int(size * factor))
    return out


def _agree_max(value: float, t_dev, comm, s) -> float:
    """The largest ``value`` of all ranks (a MAX all_reduce through ``t_dev``)."""
    t_dev.copy_from_host(np.array([value], np.float64))
    comm.all_reduce(t_dev, op=ReduceOp.MAX, stream=s)
    return float(t_dev.to_host(stream=s)[0])


def _iters_for(a, call, s, t_dev, comm) -> int:
    """The peers' policy (../shared/peers/gloo_bench.py): warm up for at least ``-w`` calls and
    ~0.1 s (every rank stops at the same call), estimate a call from three more, and return
    the number of calls that fill ``--target-s`` seconds (5 to 20,000), the same on every rank."""
    t0 = time.perf_counter()
    for k in range(1, 1000):
        call()
        s.synchronize()
        if k >= max(a.warmup_iters, 3) and _agree_max(time.perf_counter() - t0, t_dev, comm, s) > 0.1:
            break
    t0 = time.perf_counter()
    for _ in range(3):
        call()
        s.synchronize()
    est = _agree_max((time.perf_counter() - t0) / 3, t_dev, comm, s)
    return int(min(20000, max(5, math.ceil(a.target_s / max(est, 1e-7)))))


def _median_of_slowest(iters, comm, send, recv, count, dt, redop, s, op) -> tuple[float, float]:
    """Each call enqueued and waited for: (the median over calls of the slowest rank's time,
    this rank's wall-clock time per call). The second is the loop's throughput; on a node with
    more ranks than cores, ranks descheduled in turn make the slowest rank's time of a call
    larger than the calls' mean."""
    ts = np.empty(iters, np.float64)
    start = time.perf_counter()
    for i in range(iters):
        t0 = time.perf_counter()
        enqueue(op, comm, send, recv, count, dt, redop, s)
        s.synchronize()
        ts[i] = time.perf_counter() - t0
    wall = (time.perf_counter() - start) / iters
    dev = runtime.to_device(ts)
    comm.all_reduce(dev, op=ReduceOp.MAX, stream=s)
    slowest = dev.to_host(stream=s)
    dev.free()
    return float(np.median(slowest)), wall


# The check, as nccl-tests does it: every element of every rank's send buffer holds a value of
# (rank, index), so a chunk in the wrong place, from the wrong rank or reduced twice differs from
# the expected buffer (a constant per rank would let a misplaced chunk pass). The values are small
# integers (1..4; 1..2 for PROD) so every reduction is exact in every data type, in any order.
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def rank_values(rank: int, index: np.ndarray, redop: ReduceOp) -> np.ndarray:
    """Rank ``rank``'s value at each element ``index`` of its send buffer (int64, 1..4 or 1..2
    for PROD): a splitmix64 hash of (rank, index), so no two ranks' chunks look alike."""
    with np.errstate(over="ignore"):        # arithmetic modulo 2**64 is the point
        x = index.astype(np.uint64) * _MIX[0] + np.uint64(rank + 1) * _MIX[1]
        x ^= x >> np.uint64(31)
        x *= _MIX[2]
        x ^= x >> np.uint64(29)
    k = 2 if redop == ReduceOp.PROD else 4
    return (x % np.uint64(k)).astype(np.int64) + 1


def send_values(op: str, rank: int, n: int, count: int, dt: DataType, redop: ReduceOp) -> np.ndarray:
    """The send buffer of ``rank`` for ``op`` (``count`` per HCCL call, as ``_layout``)."""
    ns = _layout_counts(op, n, count)[0]
    return rank_values(rank, np.arange(ns), redop).astype(dt.numpy)


def expected(op: str, rank: int, n: int, count: int, dt: DataType, redop: ReduceOp,
             root: int = 0) -> np.ndarray | None:
    """What ``rank``'s recv buffer must hold after ``op`` (None: not defined, a non-root's
    Reduce). AllToAll's block q on rank r is block r of rank q's send; AllGather's block q is
    rank q's send; ReduceScatter's is the reduction of block ``rank`` of every rank's send."""
    c = count
    every = [rank_values(q, np.arange(_layout_counts(op, n, c)[0]), redop) for q in range(n)]
    fold = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
            ReduceOp.MIN: np.minimum}[redop].reduce
    if op == "all_reduce":
        out = fold(np.stack(every))
    elif op == "reduce":
        if rank != root:
            return None
        out = fold(np.stack(every))
    elif op == "reduce_scatter":
        out = fold(np.stack([e[rank * c:(rank + 1) * c] for e in every]))
    elif op == "broadcast":
        out = every[root]
    elif op == "all_gather":
        out = np.concatenate(every)
    elif op == "all_to_all":
        out = np.concatenate([e[rank * c:(rank + 1) * c] for e in every])
    else:
        raise ValueError(f"hccl.bench: no check for collective {op!r}")
    return out.astype(dt.numpy)     # exact small integers (integer types wrap as in dt)


def count_wrong(op: str, out: np.ndarray, rank: int, n: int, count: int, dt: DataType,
                redop: ReduceOp, root: int = 0) -> int:
    """Elements of ``out`` (``rank``'s recv buffer) that differ from ``expected``."""
    exp = expected(op, rank, n, count, dt, redop, root)
    if exp is None:
        return 0
    if out.shape != exp.shape:
        raise ValueError(f"hccl.bench: {op} recv has {out.size} elements, expected {exp.size}")
    return int(np.count_nonzero(out != exp))


def _layout_counts(op: str, n: int, c: int) -> tuple[int, int]:
    """(send elements, recv elements) of a call with per-call count ``c``."""
    if op == "all_gather":
        return c, c * n
    if op == "reduce_scatter":
        return c * n, c
    if op == "all_to_all":
        return c * n, c * n
    return c, c


if __name__ == "__main__":
    sys.exit(main())
