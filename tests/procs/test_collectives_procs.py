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


def _rank_main(rank, size, root_info, cases, slice_bytes, q, env=None):
    try:
        sys.path.insert(0, TESTS)
        os.environ["NPUSIM_SLICE_BYTES"] = str(slice_bytes)
        os.environ.update(env or {})
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
        t = comm.world.transport
        shm = (t.shm_sends, t.shm_recvs)
        comm.destroy()
        runtime.reset_device()
        q.put((rank, failures if env is None else (failures, shm)))
    except BaseException:
        q.put((rank, [traceback.format_exc()]))


def run_procs(size, cases, slice_bytes=4096, timeout=120, env=None):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    info = hccl.get_root_info()
    procs = [ctx.Process(target=_rank_main, args=(r, size, info, cases, slice_bytes, q, env),
                         daemon=True) for r in range(size)]
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


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shm", ["1", "0"])
def test_collectives_through_shared_memory(shm):
    """Every payload of at least 1 byte through the peers' device memory (NPUSIM_SHM_MIN_BYTES=1),
    sliced and pipelined; and the same cases with the path off."""
    sys.path.insert(0, TESTS)
    import collective_cases as cc
    size = 3
    cases = [c for c in cc.cases([7, 6000], size=size) if c["dtype"] in ("float32", "int64",
                                                                        "bfloat16", "uint8")]
    results = run_procs(size, cases, slice_bytes=1024, timeout=200,
                        env={"NPUSIM_SHM": shm, "NPUSIM_SHM_MIN_BYTES": "1"})
    assert sorted(results) == list(range(size))
    bad = {r: f for r, (f, _) in results.items() if f}
    assert not bad, bad
    for r, (_, (sends, recvs)) in results.items():
        if shm == "1":
            assert sends > len(cases) and recvs > len(cases), (r, sends, recvs)
        else:
            assert sends == recvs == 0
