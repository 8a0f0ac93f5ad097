"""Soak: one long job of small and large collectives, probing each rank's RSS, fds and threads.

``NPUSIM_SHM=1 npurun --nproc-per-node 3 -m benchmarks.soak --small 30000 --large 1000``

Runs ``--small`` collectives of at most a few KiB (AllReduce one-shot, AllGather, ReduceScatter,
Broadcast, AlltoAll, send/recv, Barrier, in turn) and ``--large`` ones of 4-16 MiB (AllReduce in
and out of place, AllGather, Broadcast, through shared memory when it is on), interleaved evenly.
Every large result and every 97th small one is checked exactly against numpy. After the warm-up
(``--warmup`` of the run: pyzmq's zero-copy GC thread, the pool's first segments and the
shared-memory mappings of each peer appear once) each rank probes ``/proc/self``: VmRSS,
open file descriptors and threads, ``--probes`` times evenly. Rank 0 prints every rank's probes
and, per rank, the range of each figure over the first and the second half of the probes
(a leak raises the second; a cache that fills and drains moves inside the same band).
Exit status 1 on a wrong result.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np

import hccl
import runtime
from hccl import DataType, ReduceOp

MiB = 1 << 20
SMALL_OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv",
             "barrier"]
LARGE_OPS = ["all_reduce", "all_reduce_inplace", "all_gather", "broadcast"]
LARGE_MIB = [4, 8, 12, 16]


FIELDS = ("VmRSS", "RssAnon", "RssShmem", "Threads")


def probe() -> tuple[int, int, int, int, int]:
    """(VmRSS, RssAnon, RssShmem in KiB, open file descriptors, threads) of this process.

    RssAnon is the host heap; RssShmem counts the device memory (a memfd) this rank touched,
    its own and the pages of its peers' it read through shared memory.
    """
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in FIELDS:
                got[key] = int(rest.split()[0])
    return (got["VmRSS"], got["RssAnon"], got["RssShmem"], len(os.listdir("/proc/self/fd")),
            got["Threads"])


class Small:
    """Preallocated buffers for the small collectives (count int32 elements per rank)."""

    def __init__(self, comm, count: int):
        self.comm, self.count = comm, count
        n = comm.size
        self.send = runtime.to_device(np.full(count * n, comm.rank + 1, np.int32))
        self.recv = runtime.empty(count * n, np.int32)

    def run(self, op: str, stream) -> np.ndarray | None:
        """Enqueue one; return the expected content of ``recv[:len]`` or None (nothing to check)."""
        c, comm, dt = self.count, self.comm, DataType.INT32
        n, r = comm.size, comm.rank
        if op == "all_reduce":
            hccl.all_reduce(self.send, self.recv, c, dt, ReduceOp.SUM, comm, stream)
            return np.full(c, n * (n + 1) // 2, np.int32)
        if op == "all_gather":
            hccl.all_gather(self.send, self.recv, c, dt, comm, stream)
            return np.repeat(np.arange(1, n + 1, dtype=np.int32), c)
        if op == "reduce_scatter":
            hccl.reduce_scatter(self.send, self.recv, c, dt, ReduceOp.MAX, comm, stream)
            return np.full(c, n, np.int32)
        if op == "broadcast":
            runtime.memcpy_async(self.recv, self.send, c * 4, stream=stream)
            hccl.broadcast(self.recv, c, dt, 0, comm, stream)
            return np.full(c, 1, np.int32)
        if op == "all_to_all":
            hccl.all_to_all(self.send, c, self.recv, c, dt, comm, stream)
            return np.repeat(np.arange(1, n + 1, dtype=np.int32), c)
        if op == "sendrecv":
            nxt, prv = (r + 1) % n, (r - 1) % n
            calls = [lambda: hccl.send(self.send, c, dt, nxt, comm, stream),
                     lambda: hccl.recv(self.recv, c, dt, prv, comm, stream)]
            for call in (calls if r % 2 == 0 else calls[::-1]):
                call()
            return np.full(c, prv + 1, np.int32)
        hccl.barrier(comm, stream)
        return None


def large(comm, op: str, mib: int, stream) -> int:
    """One large collective on freshly allocated buffers; returns the number of wrong elements."""
    n, r = comm.size, comm.rank
    count = mib * MiB // 4
    dt = DataType.INT32
    if op == "all_gather":
        count //= n
    send = runtime.to_device(np.full(count, r + 1, np.int32))
    recv = send if op in ("all_reduce_inplace", "broadcast") else runtime.empty(
        count * (n if op == "all_gather" else 1), np.int32)
    if op.startswith("all_reduce"):
        hccl.all_reduce(send, recv, count, dt, ReduceOp.SUM, comm, stream)
        exp = np.full(count, n * (n + 1) // 2, np.int32)
    elif op == "all_gather":
        hccl.all_gather(send, recv, count, dt, comm, stream)
        exp = np.repeat(np.arange(1, n + 1, dtype=np.int32), count)
    else:
        hccl.broadcast(recv, count, dt, mib % n, comm, stream)
        exp = np.full(count, mib % n + 1, np.int32)
    stream.synchronize()
    wrong = int(np.count_nonzero(recv.to_host() != exp))
    if recv is not send:
        recv.free()
    send.free()
    return wrong


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=30000, help="small collectives (default 30000)")
    ap.add_argument("--large", type=int, default=1000, help="large collectives (default 1000)")
    ap.add_argument("--small-count", type=int, default=256, help="int32 elements per rank block")
    ap.add_argument("--warmup", type=float, default=0.05, help="fraction of the run before probing")
    ap.add_argument("--probes", type=int, default=20)
    ap.add_argument("--gc", action="store_true",
                    help="gc.collect() before each probe (tells cyclic garbage from a leak)")
    a = ap.parse_args(argv)
    runtime.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    comm = hccl.init_comm()
    stream = runtime.Stream()
    small = Small(comm, a.small_count)
    total = a.small + a.large
    every = total // max(a.large, 1) if a.large else total + 1  # a large one every `every` steps
    start = int(total * a.warmup)
    probe_at = {start + (total - 1 - start) * k // max(a.probes - 1, 1) for k in range(a.probes)}
    probes, wrong, done_small, done_large = [], 0, 0, 0
    t0 = time.monotonic()
    for i in range(total):
        if a.large and i % every == every - 1 and done_large < a.large:
            op = LARGE_OPS[done_large % len(LARGE_OPS)]
            wrong += large(comm, op, LARGE_MIB[(done_large // len(LARGE_OPS)) % len(LARGE_MIB)],
                           stream)
            done_large += 1
        else:
            exp = small.run(SMALL_OPS[done_small % len(SMALL_OPS)], stream)
            if exp is not None and done_small % 97 == 0:
                stream.synchronize()
                wrong += int(np.count_nonzero(small.recv.to_host()[:len(exp)] != exp))
            done_small += 1
        if i in probe_at:
            stream.synchronize()
            if a.gc:
                gc.collect()
            probes.append((i + 1, done_small, done_large, time.monotonic() - t0, *probe()))
    stream.synchronize()
    report(comm, stream, probes, wrong, done_small, done_large, time.monotonic() - t0)
    comm.destroy()
    runtime.reset_device()
    return 1 if wrong else 0


def report(comm, stream, probes, wrong, n_small, n_large, seconds) -> None:
    """Gather every rank's probes on rank 0 (an AllGather of int64 rows) and print them."""
    rows = np.array([[*p[:3], *p[4:]] for p in probes] or [[0] * 8], np.int64)
    mine = runtime.to_device(np.concatenate([rows.ravel(), [wrong]]).astype(np.int64))
    every = runtime.empty(mine.size * comm.size, np.int64)
    hccl.all_gather(mine, every, mine.size, DataType.INT64, comm, stream)
    stream.synchronize()
    allr = every.to_host().reshape(comm.size, -1)
    if comm.rank != 0:
        return
    print(f"# benchmarks.soak: world {comm.size}, NPUSIM_SHM={os.environ.get('NPUSIM_SHM', '1')}, "
          f"{n_small} small + {n_large} large collectives in {seconds:.1f} s", flush=True)
    print(f"{'rank':>4} {'step':>7} {'small':>6} {'large':>6} {'rss_MiB':>8} {'anon':>7} "
          f"{'shmem':>7} {'fds':>4} {'threads':>7}")
    probes_of = [allr[r, :-1].reshape(-1, 8) for r in range(comm.size)]
    for r, pr in enumerate(probes_of):
        for step, s, lg, rss, anon, shmem, fds, th in pr:
            print(f"{r:>4} {step:>7} {s:>6} {lg:>6} {rss / 1024:>8.1f} {anon / 1024:>7.1f} "
                  f"{shmem / 1024:>7.1f} {fds:>4} {th:>7}")
    print("# after warm-up, per rank: [min, max] of the first and of the second half of the probes,"
          " and last - first")
    for r, pr in enumerate(probes_of):
        half = len(pr) // 2 or 1
        cols = []
        for name, k, scale in (("rss", 3, 1024), ("anon", 4, 1024), ("shmem", 5, 1024),
                               ("fds", 6, 1), ("threads", 7, 1)):
            a, b = pr[:half, k] / scale, pr[half:, k] / scale if len(pr) > 1 else pr[:, k] / scale
            fmt = ".1f" if scale > 1 else ".0f"
            cols.append(f"{name} [{a.min():{fmt}}, {a.max():{fmt}}] -> [{b.min():{fmt}}, "
                        f"{b.max():{fmt}}] ({(pr[-1, k] - pr[0, k]) / scale:+{fmt}})")
        print(f"rank {r}: " + ", ".join(cols) + f", wrong {allr[r, -1]}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
