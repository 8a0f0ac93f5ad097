"""The floor of an exchange between two ranks in Python: ``python -m benchmarks.ringfloor``.

Two processes swap ``--bytes`` through npusim's shared-memory rings (``hccl.transport.shm``:
post, poll, the bell's wait) and nothing else: no executor, no routing, no matching, no flight
record, no stream. Each prints the median time of a swap (post its message, wait for the peer's
and add it into an accumulator), once with the waiter spinning first (two ranks on two cores)
and once sleeping at once (the rule on a crowded node). Set against the ``exchange`` column of
``benchmarks.percall`` (docs/figures.md), the difference is the collective's own Python.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np

from benchmarks.floor import run_procs
from hccl.transport import shm

_FP = (0, 0, 0, 0, 0)


def _rank(r: int, conn, nbytes: int, swaps: int, spin: float, out) -> None:
    ch = shm.Channel(r, 2, "ringfloor", spin=spin)
    try:
        conn.send(ch.name)
        ch.attach(1 - r, conn.recv())
        conn.send("attached")
        conn.recv()
        ch.unlink()
        payload = np.ones(max(1, nbytes // 4), np.float32)
        acc = np.zeros_like(payload)
        got = [0]

        def take(kind, n, comm_id, seq, step, fp, value, view):
            np.add(acc, np.frombuffer(view, np.float32), out=acc)
            got[0] += 1

        ts = []
        for i in range(swaps):
            t0 = time.perf_counter()
            ch.post(1 - r, 1, 7, i, 0, _FP, 0, payload.data.cast("B"))
            while got[0] <= i:
                seen = ch.value()
                if not ch.poll(1 - r, take):
                    ch.wait(seen, 1.0)
            ts.append(time.perf_counter() - t0)
        out.put((r, statistics.median(ts[swaps // 10:]) * 1e6))
    finally:
        ch.close()


def measure(nbytes: int, swaps: int, spin_us: float) -> list[float]:
    """Each rank's median swap (us) of ``nbytes``, waiters spinning ``spin_us`` first."""
    a, b = mp.Pipe()
    res = run_procs(_rank, [(r, c, nbytes, swaps, spin_us * 1e-6) for r, c in ((0, a), (1, b))],
                    600)
    return [res[0], res[1]]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--swaps", type=int, default=20000)
    args = ap.parse_args(argv)
    for spin in (200.0, 0.0):
        r0, r1 = measure(args.bytes, args.swaps, spin)
        print(f"{args.bytes} B swapped through the rings, waiter spinning {spin:.0f} us first: "
              f"median {r0:.1f} / {r1:.1f} us per swap (rank 0 / rank 1)")


if __name__ == "__main__":
    main()
