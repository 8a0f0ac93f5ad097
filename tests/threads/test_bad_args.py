"""Contradictory arguments to the public hccl API are refused at the call (E_PARA, naming the
argument and the numbers) and leave the communicator usable.

Only rank 0 makes the bad calls; then every rank runs a collective. Had a refused call consumed a
sequence number or enqueued anything on rank 0, that collective would be a mismatch or a wrong sum.
"""
import numpy as np
import pytest

import hccl
import runtime
from hccl import DataType, ReduceOp, Result

from conftest import run_ranks

pytestmark = pytest.mark.timeout(60)
F32 = DataType.FP32


def _refused(cases: dict, comm) -> dict:
    """Run each bad call on rank 0; return {name: message}, checking each raised E_PARA."""
    msgs = {}
    if comm.rank == 0:
        for name, call in cases.items():
            with pytest.raises(hccl.InvalidArgumentError) as ei:
                call()
            assert ei.value.result == Result.E_PARA, name
            msgs[name] = str(ei.value)
    x = runtime.to_device(np.full(7, comm.rank + 1, np.float32))
    hccl.all_reduce(x, x, 7, F32, ReduceOp.SUM, comm)      # the communicator still works
    hccl.barrier(comm)
    return {"msgs": msgs, "sum": x.to_host()}


def _check_still_works(outs, size):
    for out in outs:
        np.testing.assert_array_equal(out["sum"], np.full(7, size * (size + 1) / 2, np.float32))
    return outs[0]["msgs"]


def test_dtype_of_the_array_contradicts_the_call():
    def body(comm):
        f64 = runtime.to_device(np.arange(10, dtype=np.float64))
        f32 = runtime.empty(10, np.float32)
        i32 = runtime.empty(40, np.int32)
        return _refused({
            "f64_as_fp32": lambda: hccl.all_reduce(f64, f64, 10, F32, ReduceOp.SUM, comm),
            "recv_other": lambda: hccl.all_reduce(f32, f64, 10, F32, ReduceOp.SUM, comm),
            "method_recv": lambda: comm.all_reduce(f32, f64),
            "gather": lambda: hccl.all_gather(f32, i32, 10, F32, comm),
            "bcast": lambda: hccl.broadcast(i32, 10, "float32", 0, comm),
            "send": lambda: hccl.send(f64, 10, np.float32, 1, comm),
        }, comm)
    msgs = _check_still_works(run_ranks(2, body), 2)
    m = msgs["f64_as_fp32"]
    assert "send" in m and "float64" in m and "FP32" in m and "FP64" in m
    assert "recv" in msgs["recv_other"] and "float64" in msgs["recv_other"]
    assert "recv" in msgs["method_recv"] and "float64" in msgs["method_recv"]
    assert "int32" in msgs["gather"] and "FP32" in msgs["gather"]
    assert "int32" in msgs["bcast"] and "buf" in msgs["bcast"]
    assert "float64" in msgs["send"]


def test_float64_array_as_fp32_was_corrupting_and_matching_dtype_still_reduces():
    def body(comm):
        x = runtime.to_device(np.full(4, 1.5, np.float64))
        with pytest.raises(hccl.InvalidArgumentError, match="float64"):
            hccl.all_reduce(x, x, 4, DataType.FP32, ReduceOp.SUM, comm)
        hccl.all_reduce(x, x, 4, DataType.FP64, ReduceOp.SUM, comm)
        hccl.all_reduce(x, x, 4, "float64", ReduceOp.SUM, comm)   # numpy name: same type
        hccl.all_reduce(x, x, 4, np.float64, "sum", comm)
        return x.to_host()
    for out in run_ranks(3, body):
        np.testing.assert_array_equal(out, np.full(4, 1.5 * 27, np.float64))


def test_counts_against_buffer_sizes_per_collective():
    def body(comm):
        n = comm.size
        a10 = runtime.empty(10, np.float32)
        a19 = runtime.empty(10 * n - 1, np.float32)
        a20 = runtime.empty(10 * n, np.float32)
        base = runtime.empty(20, np.float32)
        view = base[0:5]                       # 20 bytes of a 80-byte allocation
        return _refused({
            "gather_recv": lambda: hccl.all_gather(a10, a19, 10, F32, comm),
            "rs_send": lambda: hccl.reduce_scatter(a19, a10, 10, F32, ReduceOp.SUM, comm),
            "a2a_send": lambda: hccl.all_to_all(a19, 10, a20, 10, F32, comm),
            "a2a_recv": lambda: hccl.all_to_all(a20, 10, a19, 10, F32, comm),
            "a2a_counts": lambda: hccl.all_to_all(a20, 10, a20, 9, F32, comm),
            "reduce_send": lambda: hccl.reduce(a10, a20, 11, F32, ReduceOp.SUM, 0, comm),
            "bcast": lambda: hccl.broadcast(a10, 11, F32, 0, comm),
            "p2p": lambda: hccl.send(a10, 11, F32, 1, comm),
            "view": lambda: hccl.all_reduce(view, view, 10, F32, ReduceOp.SUM, comm),
            "method_a2a": lambda: comm.all_to_all(runtime.empty(2 * n + 1, np.float32), a20),
        }, comm)
    msgs = _check_still_works(run_ranks(2, body), 2)
    assert "recv holds 76 bytes" in msgs["gather_recv"] and "80 bytes" in msgs["gather_recv"]
    assert "send_count=10 x 2 ranks" in msgs["gather_recv"]
    assert "send holds 76 bytes" in msgs["rs_send"] and "recv_count=10 x 2" in msgs["rs_send"]
    assert "send holds 76" in msgs["a2a_send"] and "recv holds 76" in msgs["a2a_recv"]
    assert "send_count=10" in msgs["a2a_counts"] and "recv_count=9" in msgs["a2a_counts"]
    assert "44 bytes" in msgs["reduce_send"] and "40 bytes" in msgs["reduce_send"]
    assert "buf holds 40 bytes" in msgs["bcast"] and "buf holds 40" in msgs["p2p"]
    # a view is bounded by its own 20 bytes, not by the 80 of the allocation behind it
    assert "holds 20 bytes" in msgs["view"] and "40 bytes" in msgs["view"]
    assert "5 elements" in msgs["method_a2a"] and "size 2" in msgs["method_a2a"]


@pytest.mark.parametrize("count", [-1, 2.0, True, np.bool_(True), "3", None, 1 << 70])
def test_bad_count(count):
    def body(comm):
        a = runtime.empty(4, np.float32)
        return _refused({"c": lambda: hccl.all_reduce(a, a, count, F32, ReduceOp.SUM, comm)}, comm)
    msg = _check_still_works(run_ranks(2, body), 2)["c"]
    assert "count=" in msg


def test_ranks_out_of_range_and_self():
    def body(comm):
        a = runtime.empty(4, np.float32)
        return _refused({
            "root_high": lambda: hccl.broadcast(a, 4, F32, 3, comm),
            "root_neg": lambda: hccl.reduce(a, a, 4, F32, ReduceOp.SUM, -1, comm),
            "root_bool": lambda: hccl.broadcast(a, 4, F32, True, comm),
            "root_float": lambda: hccl.broadcast(a, 4, F32, 1.0, comm),
            "dest": lambda: hccl.send(a, 4, F32, 3, comm),
            "src": lambda: hccl.recv(a, 4, F32, -2, comm),
            "dest_self": lambda: hccl.send(a, 4, F32, 0, comm),
            "src_self": lambda: comm.recv(a, 0),
            "reduce_root_recv": lambda: hccl.reduce(a, None, 4, F32, ReduceOp.SUM, 0, comm),
        }, comm)
    msgs = _check_still_works(run_ranks(3, body), 3)
    assert "root=3" in msgs["root_high"] and "0..2" in msgs["root_high"]
    assert "root=-1" in msgs["root_neg"] and "root=True" in msgs["root_bool"]
    assert "root=1.0" in msgs["root_float"]
    assert "dest=3" in msgs["dest"] and "src=-2" in msgs["src"]
    assert "this rank" in msgs["dest_self"] and "this rank" in msgs["src_self"]
    assert "recv=None" in msgs["reduce_root_recv"]


def test_freed_and_out_of_allocation_pointers():
    def body(comm):
        p = runtime.malloc(64)
        q = p + 16
        runtime.free(p)
        live = runtime.malloc(64)
        arr = runtime.empty(8, np.float32)
        arr.free()
        return _refused({
            "freed": lambda: hccl.all_reduce(p, p, 4, F32, ReduceOp.SUM, comm),
            "offset_freed": lambda: hccl.broadcast(q, 4, F32, 0, comm),
            "past_end": lambda: hccl.broadcast(live + 64, 1, F32, 0, comm),
            "before": lambda: hccl.broadcast(live - 4, 1, F32, 0, comm),
            "tail_short": lambda: hccl.broadcast(live + 60, 2, F32, 0, comm),
            "freed_array": lambda: hccl.all_reduce(arr, arr, 8, F32, ReduceOp.SUM, comm),
        }, comm)
    msgs = _check_still_works(run_ranks(2, body), 2)
    assert "free" in msgs["freed"] and "send" in msgs["freed"]
    assert "free" in msgs["offset_freed"] and "buf" in msgs["offset_freed"]
    assert "outside" in msgs["past_end"] and "outside" in msgs["before"]
    assert "holds 4 bytes" in msgs["tail_short"] and "8 bytes" in msgs["tail_short"]
    assert "free" in msgs["freed_array"]


def test_send_and_recv_overlapping_other_than_in_place():
    def body(comm):
        n, r = comm.size, comm.rank
        big = runtime.empty(40, np.float32)
        p = big.ptr
        return _refused({
            "ar_partial": lambda: hccl.all_reduce(p, p + 8, 10, F32, ReduceOp.SUM, comm),
            "ar_recv_before": lambda: hccl.all_reduce(p + 8, p, 10, F32, ReduceOp.SUM, comm),
            "reduce": lambda: hccl.reduce(p, p + 4, 10, F32, ReduceOp.SUM, 0, comm),
            "a2a": lambda: hccl.all_to_all(p, 5, p + 20, 5, F32, comm),
            # HCCL's in-place AllGather has send at block `rank` of recv: block 1 here is not
            "gather": lambda: hccl.all_gather(p + 40 * (r + 1), p, 10, F32, comm),
            "rs": lambda: hccl.reduce_scatter(p, p + 40 * (r + 1), 10, F32, ReduceOp.SUM, comm),
        }, comm)
    msgs = _check_still_works(run_ranks(2, body), 2)
    for name, m in msgs.items():
        assert "overlap" in m and "send" in m and "recv" in m, name
    assert "(40 bytes)" in msgs["ar_partial"] and "+8 bytes" in msgs["ar_partial"]
    assert "-8 bytes" in msgs["ar_recv_before"]
    assert "+40 bytes" in msgs["gather"] or "-40 bytes" in msgs["gather"]


def test_hccl_in_place_layouts_are_accepted_and_correct():
    def body(comm):
        n, size, r, it = 5, comm.size, comm.rank, 4
        buf = runtime.to_device(np.concatenate(
            [np.full(n, r if k == r else -1, np.float32) for k in range(size)]))
        hccl.all_gather(buf.ptr + r * n * it, buf, n, F32, comm)       # send inside recv
        s = runtime.to_device(np.arange(n * size, dtype=np.float32) + r)
        hccl.reduce_scatter(s, s.ptr + r * n * it, n, F32, ReduceOp.SUM, comm)  # recv inside send
        same = runtime.to_device(np.full(n * size, r, np.float32))
        hccl.all_to_all(same, n, same, n, F32, comm)
        return buf.to_host(), s.to_host()[r * n:(r + 1) * n], same.to_host()
    size = 3
    for r, (ag, rs, a2a) in enumerate(run_ranks(size, body)):
        np.testing.assert_array_equal(ag, np.repeat(np.arange(size, dtype=np.float32), 5))
        want = sum(np.arange(5 * size, dtype=np.float32) + k for k in range(size))[r * 5:(r + 1) * 5]
        np.testing.assert_array_equal(rs, want)
        np.testing.assert_array_equal(a2a, np.repeat(np.arange(size, dtype=np.float32), 5))


def test_sub_comm_membership():
    def body(comm):
        return _refused({
            "dup": lambda: comm.create_sub_comm([0, 1, 1]),
            "range": lambda: comm.create_sub_comm([0, 3]),
            "neg": lambda: comm.create_sub_comm([-1, 0]),
            "empty": lambda: comm.create_sub_comm([]),
            "not_member": lambda: comm.create_sub_comm([1, 2]),
            "float": lambda: comm.create_sub_comm([0, 1.5]),
            "bool": lambda: comm.create_sub_comm([False, True]),
            "str": lambda: comm.create_sub_comm("01"),
            "none": lambda: comm.create_sub_comm(None),
        }, comm)
    msgs = _check_still_works(run_ranks(3, body), 3)
    assert "[1]" in msgs["dup"] and "more than once" in msgs["dup"]
    assert "[3]" in msgs["range"] and "0..2" in msgs["range"]
    assert "[-1]" in msgs["neg"]
    assert "at least one" in msgs["empty"]
    assert "rank 0 is not a member" in msgs["not_member"]
    assert "1.5" in msgs["float"] and "False" in msgs["bool"] and "'01'" in msgs["str"]


def test_unsorted_sub_comm_ranks_follow_the_list_order():
    def body(comm):
        if comm.rank == 1:     # not in [2, 0]: refused, and it does not take part
            with pytest.raises(hccl.InvalidArgumentError, match="rank 1 is not a member"):
                comm.create_sub_comm([2, 0])
            return None
        sub = comm.create_sub_comm([2, 0])
        x = runtime.to_device(np.full(3, comm.rank + 1, np.int32))
        sub.all_reduce(x, op=ReduceOp.PROD)
        out = (sub.rank, sub.ranks, x.to_host())
        sub.destroy()
        return out
    outs = run_ranks(3, body)
    assert outs[0][:2] == (1, [2, 0]) and outs[2][:2] == (0, [2, 0])
    for r in (0, 2):
        np.testing.assert_array_equal(outs[r][2], np.full(3, 3, np.int32))


def test_destroyed_comm_and_foreign_stream():
    def body(comm):
        a = runtime.empty(4, np.float32)
        dead = comm.create_sub_comm(list(range(comm.size)))
        dead.destroy()
        other = 1 - comm.rank + 2                 # a device no rank of this test binds
        runtime.set_device(other)
        foreign = runtime.Stream()
        runtime.set_device(comm.rank)
        out = _refused({
            "destroyed": lambda: hccl.all_reduce(a, a, 4, F32, ReduceOp.SUM, dead),
            "destroyed_sub": lambda: dead.create_sub_comm([0]),
            "foreign_stream": lambda: hccl.all_reduce(a, a, 4, F32, ReduceOp.SUM, comm, foreign),
            "not_stream": lambda: hccl.all_reduce(a, a, 4, F32, ReduceOp.SUM, comm, "s0"),
            "not_comm": lambda: hccl.all_reduce(a, a, 4, F32, ReduceOp.SUM, "world"),
        }, comm)
        foreign.destroy()
        runtime.reset_device(other)
        return out
    msgs = _check_still_works(run_ranks(2, body), 2)
    assert "destroyed" in msgs["destroyed"] and "destroyed" in msgs["destroyed_sub"]
    assert "device 0" in msgs["foreign_stream"] and "device 3" in msgs["foreign_stream"]
    assert "stream" in msgs["not_stream"] and "'world'" in msgs["not_comm"]


@pytest.mark.parametrize("dtype", ["bool", np.bool_, np.complex64, ">f4", "float128", 12, -1, True])
def test_dtypes_hccl_does_not_have(dtype):
    def body(comm):
        a = runtime.empty(16, np.uint8)
        return _refused({"d": lambda: hccl.all_reduce(a, a, 1, dtype, ReduceOp.MAX, comm)}, comm)
    msg = _check_still_works(run_ranks(2, body), 2)["d"]
    assert "dtype=" in msg and "FP32" in msg


@pytest.mark.parametrize("alias,want", [("fp16", DataType.FP16), ("half", DataType.FP16),
                                        ("bf16", DataType.BFP16), ("bfloat16", DataType.BFP16),
                                        ("BFP16", DataType.BFP16), (np.int8, DataType.INT8),
                                        ("uint64", DataType.UINT64), (10, DataType.FP64)])
def test_dtype_aliases_resolve_and_reduce(alias, want):
    assert DataType.of(alias) is want

    def body(comm):
        x = runtime.to_device(np.full(3, comm.rank + 1, want.numpy))
        hccl.all_reduce(x, x, 3, alias, ReduceOp.PROD, comm)
        return x.to_host()
    for out in run_ranks(3, body):
        np.testing.assert_array_equal(out.astype(np.float64), np.full(3, 6.0))
