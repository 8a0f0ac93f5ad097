"""hccl.bench's #wrong check (nccl-tests style): a real collective on threaded ranks is counted
right, and a chunk in the wrong place, from the wrong rank, or a constant fill is counted wrong."""
from __future__ import annotations

import numpy as np
import pytest

import runtime
from hccl import bench
from hccl.types import DataType, ReduceOp

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]


def run_bench_call(comm, op, count, dt, redop):
    """One call with the bench's buffers; this rank's recv as bench checks it."""
    n, rank = comm.size, comm.rank
    ns, nr = bench._layout_counts(op, n, count)
    send = runtime.to_device(bench.send_values(op, rank, n, count, dt, redop))
    assert send.size == ns
    recv = send if op == "broadcast" else runtime.empty(nr, dt.numpy)
    s = runtime.current_stream()
    bench.enqueue(op, comm, send, recv, count, dt, redop, s)
    return recv.to_host(stream=s)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_a_real_collective_has_no_wrong_element_and_a_misplaced_chunk_is_counted(ranks, op, size):
    count, dt, redop = 37, DataType.FP32, ReduceOp.SUM
    outs = ranks(size, run_bench_call, op, count, dt, redop)
    for rank, out in enumerate(outs):
        assert bench.count_wrong(op, out, rank, size, count, dt, redop) == 0, (op, rank)
    rank = 0                                  # the root of broadcast / reduce: defined everywhere
    out = outs[rank].copy()
    if op in ("all_gather", "all_to_all"):    # blocks 0 and 1 swapped: another rank's chunk
        out[:count], out[count:2 * count] = outs[rank][count:2 * count], outs[rank][:count]
    else:                                     # the chunk shifted by one element
        out = np.roll(out, 1)
    assert bench.count_wrong(op, out, rank, size, count, dt, redop) > count // 2, op


@pytest.mark.parametrize("op", OPS)
def test_a_constant_per_rank_would_not_pass(op):
    """The old check filled rank r with r + 1 everywhere; such a buffer is now wrong."""
    n, c = 3, 64
    nr = bench._layout_counts(op, n, c)[1]
    for redop in ReduceOp:
        exp = bench.expected(op, 0, n, c, DataType.FP32, redop)
        const = np.full(nr, exp[0], np.float32)
        assert bench.count_wrong(op, const, 0, n, c, DataType.FP32, redop) > 0, (op, redop)


@pytest.mark.parametrize("dt", [DataType.INT8, DataType.FP16, DataType.BFP16, DataType.UINT8,
                                DataType.FP64])
@pytest.mark.parametrize("redop", list(ReduceOp))
def test_values_depend_on_rank_and_index_and_reduce_exactly(dt, redop):
    v = [bench.rank_values(r, np.arange(256), redop) for r in range(8)]
    assert all(len(np.unique(x)) > 1 for x in v)                        # index matters
    assert all((v[a] != v[b]).mean() > 0.25 for a in range(8) for b in range(a))   # rank matters
    exp = bench.expected("all_reduce", 0, 8, 256, dt, redop)
    fold = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
            ReduceOp.MIN: np.minimum}[redop]
    acc = v[0].astype(dt.numpy)
    for x in v[1:]:                           # the reduction in the data type, in rank order
        acc = fold(acc, x.astype(dt.numpy))
    assert np.array_equal(acc, exp)
