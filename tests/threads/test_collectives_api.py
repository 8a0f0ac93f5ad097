"""The public collective API on threaded ranks: every op x dtype x redop x world size x count."""
import numpy as np
import pytest

import collective_cases as cc
import hccl
import runtime

from conftest import run_ranks

SLICE = 4096                       # small HCCL_BUFFSIZE stand-in: big counts get sliced


def counts_for(size):
    # 0, 1, 7, 1000, a count not divisible by the world size, one larger than a slice (fp64: 48 KiB)
    return [0, 1, 7, 1000, 13 * size + 1, 6000]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, pytest.param(8, marks=pytest.mark.slow)])
def test_every_collective_dtype_op_count(size, monkeypatch):
    monkeypatch.setenv("NPUSIM_SLICE_BYTES", str(SLICE))
    # the executor tests run every dtype at every size; through the API the larger worlds take a
    # representative subset (1-, 2-, 4-, 8-byte integers and every float kind)
    dtypes = cc.DTYPES if size <= 3 else ["int8", "uint16", "int32", "uint64", "float16",
                                           "bfloat16", "float32", "float64"]
    cases = cc.cases(counts_for(size), dtypes=dtypes, size=size)

    def body(comm):
        return [cc.run_case(comm, case) for case in cases]

    outs = run_ranks(size, body, timeout=280)
    for i, case in enumerate(cases):
        for rank in range(size):
            cc.check(outs[rank][i], cc.expected(size, rank, case), case, size)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 3, 5])
def test_all_reduce_bitwise_identical_on_every_rank(size, monkeypatch):
    monkeypatch.setenv("NPUSIM_SLICE_BYTES", str(SLICE))
    cases = [{"op": "all_reduce", "dtype": d, "redop": "SUM", "count": 5001}
             for d in ("float16", "bfloat16", "float32", "float64")]
    outs = run_ranks(size, lambda comm: [cc.run_case(comm, c) for c in cases])
    for i in range(len(cases)):
        for r in range(1, size):
            assert outs[r][i].tobytes() == outs[0][i].tobytes()
