"""Run one function in a few plain processes and collect what each puts on a queue.

The floors (``benchmarks.floor``, ``benchmarks.ringfloor``) time two bare processes with nothing
of npusim between them: no launcher, no store. ``run`` starts them with ``spawn`` (no fork of a
threaded parent), waits for one result per process and never leaves one behind.
"""
from __future__ import annotations

import multiprocessing as mp


def run(target, args: list, timeout: float) -> dict:
    """``target(*args[i], queue)`` in one spawned process per ``args[i]``; each puts one
    ``(key, value)`` pair on ``queue``. Returns those pairs as a dict; a process that has not
    ended 30 s after the results is killed. Raises ``queue.Empty`` when a result does not come
    within ``timeout`` seconds."""
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
