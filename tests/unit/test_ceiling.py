"""benchmarks.ceiling: the memory work of a collective, and its measurement in n processes at once."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from benchmarks import ceiling


def _arrays(fn) -> dict:
    """The numpy arrays a work function closes over, by name."""
    cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
    for inner in ("reduce",):
        if inner in cells:
            cells.update(_arrays(cells[inner]))
    return {k: v for k, v in cells.items() if isinstance(v, np.ndarray)}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_all_reduce_work_reduces_its_share_and_copies_the_rest(n):
    rank = n - 1
    fn = ceiling.work("all_reduce", n, rank, 64 * n)
    arrs = _arrays(fn)
    fn()
    c = 16
    recv = arrs["recv"]
    # its block: send + (n - 1) peer blocks, all ones; the others copied from the peer array
    assert np.array_equal(recv[rank * c:(rank + 1) * c], np.full(c, n, np.float32))
    rest = np.delete(recv, np.s_[rank * c:(rank + 1) * c])
    assert np.array_equal(rest, np.ones(c * (n - 1), np.float32))


def test_reduce_scatter_and_gather_and_broadcast_work():
    rs = ceiling.work("reduce_scatter", 4, 2, 4 * 4 * 8)
    a = _arrays(rs)
    rs()
    assert np.array_equal(a["recv"][16:24], np.full(8, 4, np.float32))
    assert not a["recv"][:16].any() and not a["recv"][24:].any()     # nothing else written
    ag = ceiling.work("all_gather", 3, 0, 3 * 4 * 5)
    a = _arrays(ag)
    ag()
    assert np.array_equal(a["recv"], np.ones(15, np.float32))
    root, other = ceiling.work("broadcast", 2, 0, 64), ceiling.work("broadcast", 2, 1, 64)
    assert root() is None
    a = _arrays(other)
    other()
    assert np.array_equal(a["dst"], np.ones(16, np.float32))


def test_bad_arguments_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        ceiling.work("alltoall", 2, 0, 1024)
    with pytest.raises(ValueError, match="7 bytes on 2 ranks"):
        ceiling.work("all_reduce", 2, 0, 7)
    with pytest.raises(ValueError, match="unknown collective"):
        ceiling.measure("alltoall", 2, 1024)         # before any process starts
    assert not mp.active_children()


@pytest.mark.timeout(120)
def test_measure_runs_every_process_and_leaves_none():
    r = ceiling.measure("all_reduce", 3, 3 << 16, reps=3)
    assert r["coll"] == "all_reduce" and r["world"] == 3 and r["bytes"] == 3 << 16
    assert r["time_us"] > 0
    # busbw as nccl-tests defines it for AllReduce: bytes / time x 2(n-1)/n
    assert r["busbw_GBps"] == pytest.approx((3 << 16) / (r["time_us"] * 1e3) * 4 / 3)
    assert not mp.active_children()

