"""Ranks as threads: one simulated device and one hccl world communicator per thread."""
from __future__ import annotations

import itertools
import threading

import pytest

import hccl
import runtime
from hccl.comm import Comm, World, comm_id_of
from hccl.transport.inproc import InprocFabric


_worlds = itertools.count(1)


def run_ranks(size: int, fn, *args, timeout: float = 60.0):
    """Run ``fn(comm, *args)`` on ``size`` threaded ranks; return the per-rank results.

    Each thread binds device ``rank`` (a fresh context) and gets a world communicator over an
    in-process fabric. The first exception of any rank is re-raised (with the rank in a note).
    """
    fabric = InprocFabric(size)
    results: list = [None] * size
    errors: list = [None] * size
    # unique per call: the flight recorder's progress is per (comm id, rank) and process-wide,
    # and an id() may be reused by the next test's fabric
    uid = f"threads-{next(_worlds)}"

    def body(rank):
        runtime.set_device(rank)
        world = World(fabric.transport(rank), uid=uid)
        comm = Comm(world, list(range(size)), comm_id_of(uid), "world")
        try:
            results[rank] = fn(comm, *args)
            runtime.synchronize()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            errors[rank] = e
        finally:
            comm.destroy()
            try:
                runtime.reset_device(rank)
            except BaseException as e:  # noqa: BLE001
                errors[rank] = errors[rank] or e

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    alive = [r for r, t in enumerate(threads) if t.is_alive()]
    fabric.close()
    if alive:
        raise AssertionError(f"ranks {alive} did not finish within {timeout} s")
    for r, e in enumerate(errors):
        if e is not None:
            e.add_note(f"(raised on threaded rank {r} of {size})")
            raise e
    return results


@pytest.fixture
def ranks():
    return run_ranks
