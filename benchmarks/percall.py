"""Where an eager small AllReduce's microseconds go: ``npurun --nproc-per-node 2 -m
benchmarks.percall [--bytes 1024] [--json OUT]``.

Each figure is a median over ``--calls`` calls (every rank runs them together), taken apart
into what a user's call pays:

- ``issue``: the host's part of ``comm.all_reduce`` (checks, the plan lookup, the sequence
  number, the flight record, the enqueue), timed while the stream is held behind a gate, so
  nothing else runs;
- ``stream``: a no-op kernel's ``launch`` + ``synchronize``: the hand-off to the stream's worker
  and the two wake-ups, one rank, no peer;
- ``replay``: a task graph of that one AllReduce replayed + synchronize: the stream plus the
  exchange with the peers, without the per-call host work;
- ``eager``: ``comm.all_reduce`` + ``synchronize``, the whole;
- ``exchange`` = replay - stream: the messages, the peers' wake-ups and the reduction.

and, for a step of 8 such calls, eager against the fused replay (benchmarks.graph_step).
Rank 0 prints one line per figure and, with ``--json``, writes them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np

import hccl
import runtime
from benchmarks import graph_step


def _noop():
    pass


def measure(comm, nbytes: int, calls: int, warmup: int) -> dict:
    """The figures of the module's docstring (us), on every rank."""
    s = runtime.Stream()
    x = runtime.to_device(np.ones(max(1, nbytes // 4), np.float32))
    op = hccl.ReduceOp.MAX                  # values stay put over many calls

    def eager():
        comm.all_reduce(x, op=op, stream=s)
        s.synchronize()

    def stream():
        runtime.launch(_noop, stream=s)
        s.synchronize()

    g = runtime.Graph("one")
    with runtime.graph(g, stream=s):
        comm.all_reduce(x, op=op, stream=s)

    def replay():
        g.replay(s)
        s.synchronize()

    out = {"stream_us": graph_step.median_us(stream, calls, warmup),
           "eager_us": graph_step.median_us(eager, calls, warmup),
           "replay_us": graph_step.median_us(replay, calls, warmup)}
    out["exchange_us"] = out["replay_us"] - out["stream_us"]
    gate = threading.Event()                # issue: the stream waits behind the gate
    issue_ts = []
    for _ in range(max(1, calls // 50)):
        runtime.launch(gate.wait, stream=s)
        for _ in range(50):
            t0 = time.perf_counter()
            comm.all_reduce(x, op=op, stream=s)
            issue_ts.append(time.perf_counter() - t0)
        gate.set()
        s.synchronize()
        gate.clear()
    out["issue_us"] = statistics.median(issue_ts) * 1e6
    step = graph_step.measure(comm, s, 8, nbytes, max(50, calls // 4), 10)
    out.update({f"step8_{k}": v for k, v in step.items()})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--json", help="rank 0 writes the figures here")
    a = ap.parse_args(argv)
    runtime.set_device()
    comm = hccl.init_comm()
    r = measure(comm, a.bytes, a.calls, a.warmup)
    if comm.rank == 0:
        r.update(world=comm.size, bytes=a.bytes, calls=a.calls)
        for k in ("issue_us", "stream_us", "exchange_us", "replay_us", "eager_us"):
            print(f"world {comm.size}, {a.bytes} B all_reduce, {k[:-3]:>9}: {r[k]:8.1f} us")
        print(f"world {comm.size}, step of 1 kernel + 8 x {a.bytes} B all_reduce: eager "
              f"{r['step8_eager_us']:.0f} us, replay {r['step8_replay_us']:.0f} us, fused replay "
              f"{r['step8_fused_replay_us']:.0f} us; results "
              f"{'right' if r['step8_ok'] else 'WRONG'}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"results": r}, f, indent=1)
    comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
