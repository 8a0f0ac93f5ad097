"""A training step of small work, eager against a replayed task graph:
``npurun --nproc-per-node 2 -m benchmarks.graph_step [--allreduces 8] [--bytes 1024]``.

The step is one kernel and ``--allreduces`` AllReduces (MAX, so values stay put) of ``--bytes``
each on one stream, then a synchronize. Eager issues every call; a graph captures the step once
and replays it, with its adjacent AllReduces fused into one exchange (the default) and without
(``runtime.Graph(fuse=False)``). Prints, on rank 0, the median step time of each (over
``--steps`` steps after ``--warmup``, every rank agreeing on the count) and the ratios, with the
results checked equal.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import hccl
import runtime


def _axpy(x, y):
    x += y


def median_us(fn, calls: int, warmup: int) -> float:
    """The median time of ``fn()`` in microseconds over ``calls`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def measure(comm, s, allreduces: int, nbytes: int, steps: int, warmup: int) -> dict:
    """Median step times (us) of the step eager, replayed unfused and replayed fused, and
    whether every result is right. Collective: every rank of ``comm`` calls it."""
    n = max(1, nbytes // 4)
    w = runtime.to_device(np.ones(n, np.float32))
    grads = [runtime.to_device(np.full(n, 1.0 / comm.size, np.float32))
             for _ in range(allreduces)]

    def issue():
        runtime.launch(_axpy, w, grads[0], stream=s)
        for g in grads:
            comm.all_reduce(g, op=hccl.ReduceOp.MAX, stream=s)

    def timed(step) -> float:
        def step_and_wait():
            step()
            s.synchronize()
        return median_us(step_and_wait, steps, warmup)

    out = {"eager_us": timed(issue)}
    for fuse, key in ((False, "replay_us"), (True, "fused_replay_us")):
        graph = runtime.Graph("step", fuse=fuse)
        with runtime.graph(graph, stream=s):
            issue()
        out[key] = timed(lambda: graph.replay(s))
    comm.barrier(stream=s)
    s.synchronize()
    # a MAX of equal values keeps them: the graphs' AllReduces computed what eager's did
    out["ok"] = all(np.allclose(g.to_host(), 1.0 / comm.size) for g in grads)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--allreduces", type=int, default=8)
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args(argv)
    runtime.set_device()
    comm = hccl.init_comm()
    s = runtime.Stream()
    r = measure(comm, s, args.allreduces, args.bytes, args.steps, args.warmup)
    if comm.rank == 0:
        e, plain, fused = r["eager_us"], r["replay_us"], r["fused_replay_us"]
        print(f"world {comm.size}: a step of 1 kernel + {args.allreduces} x {args.bytes} B "
              f"all_reduce, median of {args.steps}: eager {e:.0f} us, graph replay {plain:.0f} us "
              f"({e / plain:.2f}x), fused graph replay {fused:.0f} us ({e / fused:.2f}x); "
              f"results {'equal' if r['ok'] else 'DIFFER'}")
    comm.destroy()


if __name__ == "__main__":
    main()
