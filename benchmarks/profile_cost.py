"""What profiling costs a training step: the same step with and without a recording, same run:
``npurun --nproc-per-node 2 -m benchmarks.profile_cost [--kernels 16] [--steps 40]`` (or plain
``python -m benchmarks.profile_cost`` for one process, kernels only).

A step is ``--kernels`` small kernels (an axpy of ``--elems`` float32) on one stream, then (under
npurun) one AllReduce (MAX) of the same buffer, a ``runtime.profiler.step()`` mark and a synchronize.
Blocks of ``--steps`` steps alternate, ``--rounds`` times, between no recording and a
``runtime.profile`` recording (its file written after the block, not timed), so machine load
hits both alike. Prints, on rank 0, the median step time of each, their ratio and the cost per
recorded task.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import hccl
import runtime
from runtime import profiler


def _axpy(x, y):
    x += y


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=16, help="kernels per step (default 16)")
    p.add_argument("--elems", type=int, default=4096, help="float32 elements (default 4096)")
    p.add_argument("--steps", type=int, default=40, help="steps per block (default 40)")
    p.add_argument("--rounds", type=int, default=5, help="off/on block pairs (default 5)")
    args = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    runtime.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    comm = None
    if world > 1:
        comm = hccl.init_comm()
    s = runtime.Stream()
    x = runtime.to_device(np.zeros(args.elems, np.float32))
    y = runtime.to_device(np.full(args.elems, 1e-3, np.float32))

    def step():
        for _ in range(args.kernels):
            runtime.launch(_axpy, x, y, stream=s, name="axpy")
        if comm is not None:
            comm.all_reduce(x, op=hccl.ReduceOp.MAX, stream=s)    # values stay put
        profiler.step()
        s.synchronize()

    def block(times: list) -> None:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        if comm is not None:          # both blocks start together on every rank
            comm.barrier(stream=s)
            s.synchronize()

    off, on = [], []
    block([])                          # warm-up: first touches, connections
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            block(off)
            with runtime.profile(os.path.join(d, f"r{r}.json")):
                block(on)
    rank = comm.rank if comm is not None else 0
    if rank == 0:
        a, b = statistics.median(off) * 1e6, statistics.median(on) * 1e6
        tasks = args.kernels + (1 if comm is not None else 0)
        print(f"step of {args.kernels} kernels{' + 1 AllReduce' if comm else ''}, world {world}, "
              f"{args.rounds} x {args.steps} steps each way, load {os.getloadavg()[0]:.1f}: "
              f"median {a:.0f} us without profiling, {b:.0f} us with; ratio {b / a:.3f} "
              f"({(b - a) / tasks:+.1f} us per recorded task)", flush=True)
    if comm is not None:
        comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
