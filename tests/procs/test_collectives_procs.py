"""The collective test bodies over real processes and the ZeroMQ transport (world sizes 2, 3).

The test process hosts the rendezvous store with ``hccl.get_root_info()``; each rank is a fresh
interpreter (multiprocessing spawn) that joins with ``comm_init_root_info`` and checks its own
results against numpy, returning the failures as text.
"""
import multiprocessing as mp
import os
import sys
import traceback

import pytest

import hccl

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


def _rank_main(rank, size, root_info, cases, slice_bytes, q):
    try:
        sys.path.insert(0, TESTS)
        os.environ["NPUSIM_SLICE_BYTES"] = str(slice_bytes)
        os.environ["NPUSIM_HBM_BYTES"] = str(1 << 30)
        import collective_cases as cc
        import runtime
        runtime.set_device(rank)
        comm = hccl.comm_init_root_info(size, root_info, rank)
        failures = []
        for case in cases:
            try:
                cc.check(cc.run_case(comm, case), cc.expected(size, rank, case), case, size)
            except AssertionError as e:
                failures.append(f"{case}: {str(e)[:300]}")
        comm.destroy()
        runtime.reset_device()
        q.put((rank, failures))
    except BaseException:
        q.put((rank, [traceback.format_exc()]))


def run_procs(size, cases, slice_bytes=4096, timeout=120):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    info = hccl.get_root_info()
    procs = [ctx.Process(target=_rank_main, args=(r, size, info, cases, slice_bytes, q), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    try:
        results = dict(q.get(timeout=timeout) for _ in range(size))
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    return results


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", [2, 3])
def test_collectives_over_processes(size):
    sys.path.insert(0, TESTS)
    import collective_cases as cc
    cases = cc.cases([0, 7, 13 * size + 1, 6000], size=size)
    results = run_procs(size, cases, timeout=200)
    assert sorted(results) == list(range(size))
    bad = {r: f for r, f in results.items() if f}
    assert not bad, bad
