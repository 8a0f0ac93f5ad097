"""The floor of a small AllReduce in Python: ``python -m benchmarks.floor [--bytes 1024]``.

Two processes swap ``--bytes`` through shared memory and add the peer's into their own, the
least a Python collective must do: each copies its buffer into its half of a shared segment,
publishes a sequence number in its flag and spins (no yield, no sleep) until the peer's flag
reaches it, then ``np.add``s the peer's half into an accumulator; a second flag round keeps a
rank from overwriting a half its peer still reads. Nothing of npusim runs: no stream, executor,
pair, ring, record. Prints the median microseconds of one swap-and-add (the slower rank's), the
figure ``benchmarks.percall`` sets its per-call time against in the same run.

Ordering: a reader that sees the flag must see the bytes written before it, which plain Python
stores give on x86-64 only (TSO), as for ``hccl.transport.shm``; elsewhere this program refuses
to run rather than measure a race. The segment is a file under /dev/shm that this process
creates and unlinks itself (no resource tracker).
"""
from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import platform
import secrets
import statistics
import time

import numpy as np

_FLAGS = 64             # two int64 flags, then each rank's half


def _plain() -> None:
    """Run as a plain program whatever the launcher did to the parent (a rank started in
    SCHED_BATCH and bound to one core would put both spinning processes on that core)."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
        if hasattr(os, "SCHED_BATCH") and os.sched_getscheduler(0) == os.SCHED_BATCH:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        pass


class Swaps:
    """One rank's side of the swap-and-add through the segment at ``path`` (made by
    ``create``), in blocks: ``block(n)`` times ``n`` swaps and returns their microseconds. The
    peer runs as many swaps; the sequence numbers go on across blocks, so a job may interleave
    blocks with other work (``benchmarks.percall`` does, with its own calls)."""

    def __init__(self, r: int, path: str, nbytes: int):
        fd = os.open(path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, _FLAGS + 2 * nbytes)
        finally:
            os.close(fd)
        n = max(1, nbytes // 4)
        self._flags = np.ndarray((2,), np.int64, self._mm, 0)
        halves = [np.ndarray((n,), np.float32, self._mm, _FLAGS + i * nbytes) for i in range(2)]
        self._mine, self._theirs = halves[r], halves[1 - r]
        self._r, self._peer, self._seq = r, 1 - r, 0
        self._own = np.ones(n, np.float32)
        self._acc = np.empty(n, np.float32)

    def block(self, swaps: int) -> list[float]:
        flags, r, peer, seq = self._flags, self._r, self._peer, self._seq
        mine, theirs, own, acc = self._mine, self._theirs, self._own, self._acc
        perf, times = time.perf_counter, []
        for _ in range(swaps):
            seq += 1
            t0 = perf()
            mine[:] = own
            flags[r] = seq
            while flags[peer] < seq:
                pass
            np.add(own, theirs, out=acc)
            times.append((perf() - t0) * 1e6)
            seq += 1                    # the second round: the peer has read my half
            flags[r] = seq
            while flags[peer] < seq:
                pass
        self._seq = seq
        return times

    def close(self) -> None:
        del self._flags, self._mine, self._theirs
        self._mm.close()


def create(nbytes: int) -> str:
    """A fresh segment for two ``Swaps`` of ``nbytes`` each (the caller unlinks it)."""
    if platform.machine() != "x86_64":
        raise SystemExit("benchmarks.floor: its flags rely on x86-64's store order (see the "
                         f"module note); this is {platform.machine()}")
    path = f"/dev/shm/npusim-floor-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, _FLAGS + 2 * max(4, nbytes))
    finally:
        os.close(fd)
    return path


def _rank(r: int, path: str, nbytes: int, swaps: int, out) -> None:
    _plain()
    sw = Swaps(r, path, nbytes)
    times = sw.block(swaps)
    out.put((r, statistics.median(times[len(times) // 10:])))
    sw.close()


def run_procs(target, args: list, timeout: float) -> dict:
    """``target(*args[i], queue)`` in one spawned process per ``args[i]`` (no fork of a threaded
    parent); each puts one ``(key, value)`` pair on ``queue``. Returns those pairs as a dict
    (``queue.Empty`` when one does not come within ``timeout`` s); a process still running 30 s
    after is killed. The floors' two bare processes (this module's, ``benchmarks.ringfloor``'s)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, out)) for a in args]
    for p in procs:
        p.start()
    try:
        return dict(out.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()


def measure(nbytes: int = 1024, swaps: int = 20000) -> float:
    """The slower rank's median microseconds per swap-and-add of ``nbytes``."""
    path = create(nbytes)
    try:
        res = run_procs(_rank, [(r, path, max(4, nbytes), swaps) for r in range(2)], 300)
    finally:
        os.unlink(path)
    return max(res.values())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--swaps", type=int, default=20000)
    a = ap.parse_args(argv)
    print(f"{a.bytes} B swapped and added by two processes through shared memory: "
          f"{measure(a.bytes, a.swaps):.2f} us per swap (median, slower rank)")


if __name__ == "__main__":
    main()
