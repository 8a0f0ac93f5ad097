"""Rank-side code of tests/procs/test_graph_replay_procs.py: replays of a step of kernels and
small AllReduces over processes (shared memory), eager against replayed, bitwise."""
from __future__ import annotations


def _axpy(x, y):
    x += y


def replay_step(rank: int) -> dict:
    import time

    import numpy as np

    import hccl
    import runtime

    runtime.set_device()
    comm = hccl.init_comm()
    s = runtime.Stream()
    rng = np.random.default_rng(1234 + rank)
    hosts = [rng.standard_normal(n).astype(np.float32) for n in (256, 3, 1000, 64)]

    def run(graph_fuse):
        w = runtime.to_device(np.ones(8, np.float32))
        grads = [runtime.to_device(h) for h in hosts]

        def step():
            runtime.launch(_axpy, w, w, stream=s)       # w doubles every step
            for g in grads:
                comm.all_reduce(g, stream=s)
        if graph_fuse is None:
            for _ in range(20):
                step()
        else:
            g = runtime.Graph(fuse=graph_fuse)
            with runtime.graph(g, stream=s):
                step()
            for i in range(20):
                g.replay(s)
                if i == 10:             # nobody waits: the worker's patrol runs the replays
                    t0 = time.monotonic()
                    while not s.query() and time.monotonic() - t0 < 10:
                        time.sleep(0.001)
        s.synchronize()
        return [g.to_host().tobytes() for g in grads] + [w.to_host().tobytes()]

    eager = run(None)
    plain = run(False)
    fused = run(True)
    comm.barrier(stream=s)
    s.synchronize()
    comm.destroy()
    return {"plain": plain == eager, "fused": fused == eager}
