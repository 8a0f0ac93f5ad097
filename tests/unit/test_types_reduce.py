"""hccl.types, hccl.errors, hccl.config and hccl.reduce: pure units."""
from __future__ import annotations

import logging
import pickle

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hccl import config
from hccl.errors import (CollectiveMismatchError, HcclError, HcclTimeoutError,
                         InvalidArgumentError, RemoteRankError)
from hccl.reduction import reduce_into, reduce_reference
from hccl.types import DataType, Fingerprint, OpType, ReduceOp, Result

BF16 = np.dtype(ml_dtypes.bfloat16)


# --- types ------------------------------------------------------------------------------------

def test_datatype_values_are_hccls():
    assert [(m.name, int(m)) for m in DataType] == [
        ("INT8", 0), ("INT16", 1), ("INT32", 2), ("FP16", 3), ("FP32", 4), ("INT64", 5),
        ("UINT64", 6), ("UINT8", 7), ("UINT16", 8), ("UINT32", 9), ("FP64", 10), ("BFP16", 11)]


@pytest.mark.parametrize("dt", list(DataType))
def test_datatype_numpy_round_trip(dt):
    assert DataType.of(dt.numpy) is dt
    assert DataType.of(dt.numpy.name) is dt
    assert DataType.of(dt.name.lower()) is dt
    assert DataType.of(int(dt)) is dt
    assert DataType.of(np.zeros(2, dt.numpy)) is dt
    assert dt.itemsize == dt.numpy.itemsize


def test_datatype_of_accepts_common_names_and_scalar_types():
    assert DataType.of(np.float32) is DataType.FP32
    assert DataType.of("bf16") is DataType.BFP16
    assert DataType.of(ml_dtypes.bfloat16) is DataType.BFP16
    assert DataType.of("fp16") is DataType.FP16
    assert DataType.of("half") is DataType.FP16
    assert DataType.BFP16.numpy == BF16
    assert DataType.FP16.is_float and not DataType.INT8.is_float


@pytest.mark.parametrize("bad", [np.bool_, np.complex64, "float128x", "nope", 12, -1, object()])
def test_datatype_of_rejects_what_hccl_cannot_reduce(bad):
    with pytest.raises(InvalidArgumentError, match="FP32") as ei:
        DataType.of(bad)
    assert ei.value.result is Result.E_PARA


def test_enums_print_their_names():
    assert str(DataType.FP32) == "FP32" and f"{ReduceOp.MAX}" == "MAX"
    assert f"{OpType.ALLREDUCE:>10}" == " ALLREDUCE"
    assert str(Result.E_TIMEOUT) == "E_TIMEOUT"


def test_reduce_op_and_result_and_op_type_values():
    assert [int(ReduceOp.of(n)) for n in ("sum", "PROD", "max", "Min")] == [0, 1, 2, 3]
    assert ReduceOp.of(2) is ReduceOp.MAX
    with pytest.raises(InvalidArgumentError, match="SUM, PROD, MAX, MIN"):
        ReduceOp.of("avg")
    assert (Result.SUCCESS, Result.E_PARA, Result.E_TIMEOUT, Result.E_REMOTE) == (0, 1, 9, 21)
    assert len(Result) == 22 and [int(r) for r in Result] == list(range(22))
    assert [o.name for o in OpType] == ["ALLREDUCE", "ALLGATHER", "REDUCE_SCATTER", "BROADCAST",
                                        "REDUCE", "ALLTOALL", "SEND", "RECV", "BARRIER"]
    assert OpType.of("all_gather") is OpType.ALLGATHER
    assert OpType.of("reduce_scatter") is OpType.REDUCE_SCATTER


def test_fingerprint_is_five_ints_and_reads_like_the_call():
    fp = Fingerprint.make("allreduce", 1024, np.float32, "sum", root=3)
    assert tuple(int(x) for x in fp) == (0, 1024, 4, 0, -1)
    assert str(fp) == "ALLREDUCE(count=1024, FP32, SUM)"
    ag = Fingerprint.make(OpType.ALLGATHER, 512, "fp32", "sum")
    assert str(ag) == "ALLGATHER(count=512, FP32)"
    bc = Fingerprint.make(OpType.BROADCAST, 8, "bf16", root=2)
    assert str(bc) == "BROADCAST(count=8, BFP16, root=2)"
    assert Fingerprint.from_wire((1, 512, 4, -1, -1)) == Fingerprint.make("allgather", 512, "fp32")
    assert str(Fingerprint.make("barrier", 0)) == "BARRIER()"
    assert str(Fingerprint.from_wire((99, 1, 77, -1, -1))) == "99(count=1, 77)"


# --- errors -----------------------------------------------------------------------------------

def _round_trip(e):
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is type(e) and str(e2) == str(e) and e2.result == e.result
    return e2


def test_errors_carry_results_fields_and_pickle():
    e = _round_trip(HcclError("boom", Result.E_INTERNAL, seq=4))
    assert e.seq == 4 and e.result is Result.E_INTERNAL
    t = _round_trip(HcclTimeoutError(peer=2, world_peer=5, seq=12, waited=30.0, timeout=30.0))
    assert isinstance(t, TimeoutError) and t.result is Result.E_TIMEOUT
    assert (t.peer, t.world_peer, t.seq, t.waited) == (2, 5, 12, 30.0)
    assert "seq 12" in str(t) and "rank 2" in str(t) and "30.0 s" in str(t)
    calls = [Fingerprint.make("allreduce", 1024, "fp32", "sum"),
             Fingerprint.make("allgather", 512, "fp32")]
    m = _round_trip(CollectiveMismatchError(seq=12, ranks=[0, 1], calls=calls))
    assert str(m).startswith(
        "seq 12: rank 0 ALLREDUCE(count=1024, FP32, SUM) vs rank 1 ALLGATHER(count=512, FP32)")
    assert m.ranks == [0, 1] and m.calls == calls and m.seq == 12
    r = _round_trip(RemoteRankError(rank=3, reason="killed by SIGKILL", seq=2))
    assert r.result is Result.E_REMOTE and r.rank == 3 and "SIGKILL" in str(r)
    a = _round_trip(InvalidArgumentError("count 5 > buffer"))
    assert isinstance(a, ValueError) and a.result is Result.E_PARA
    assert all(issubclass(c, HcclError) for c in
               (HcclTimeoutError, CollectiveMismatchError, RemoteRankError, InvalidArgumentError))


def test_errors_can_be_raised_and_chained_after_unpickling():
    e = pickle.loads(pickle.dumps(HcclTimeoutError("custom text", peer=1)))
    with pytest.raises(HcclTimeoutError, match="custom text"):
        raise e


# --- config -----------------------------------------------------------------------------------

KNOBS = ["HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_BUFFSIZE", "HCCL_ALGO", "HCCL_IF_IP",
         "ASCEND_GLOBAL_LOG_LEVEL", "NPUSIM_TRACE_BUFFER", "NPUSIM_SLICE_BYTES",
         "NPUSIM_WIRE_SLICE_BYTES"]


@pytest.fixture
def env(monkeypatch):
    for k in KNOBS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_config_defaults(env):
    assert config.connect_timeout() == 120.0
    assert config.exec_timeout() == 1800.0
    assert config.buffsize_mb() == 200 and config.slice_bytes() == 8 << 20   # wire slice cap
    assert config.algo() == "ring"
    assert config.if_ip() is None
    assert config.log_level() == 3 and config.logging_level() == logging.ERROR
    assert config.trace_buffer() == 2000


def test_config_reads_values_at_call_time(env):
    env.setenv("HCCL_EXEC_TIMEOUT", "2.5")
    env.setenv("HCCL_CONNECT_TIMEOUT", "30")
    env.setenv("HCCL_BUFFSIZE", "1")
    env.setenv("HCCL_ALGO", "level0:NA;level1:Ring")
    env.setenv("HCCL_IF_IP", "127.0.0.1")
    env.setenv("ASCEND_GLOBAL_LOG_LEVEL", "0")
    env.setenv("NPUSIM_TRACE_BUFFER", "0")
    assert config.exec_timeout() == 2.5 and config.connect_timeout() == 30.0
    assert config.slice_bytes() == 1 << 20
    env.setenv("NPUSIM_WIRE_SLICE_BYTES", "65536")
    assert config.slice_bytes() == 65536                 # min(HCCL_BUFFSIZE, wire slice)
    env.setenv("NPUSIM_SLICE_BYTES", "4096")
    assert config.slice_bytes() == 4096
    assert config.algo() == "ring"
    assert config.if_ip() == "127.0.0.1"
    assert config.logging_level() == logging.DEBUG
    assert config.trace_buffer() == 0
    env.setenv("HCCL_ALGO", "tree")
    assert config.algo() == "tree"


@pytest.mark.parametrize("name,value", [
    ("HCCL_EXEC_TIMEOUT", "abc"), ("HCCL_EXEC_TIMEOUT", "0"), ("HCCL_EXEC_TIMEOUT", "-1"),
    ("HCCL_EXEC_TIMEOUT", "inf"), ("HCCL_CONNECT_TIMEOUT", "nan"), ("HCCL_BUFFSIZE", "0"),
    ("HCCL_BUFFSIZE", "1.5"), ("HCCL_IF_IP", "not-an-ip"), ("ASCEND_GLOBAL_LOG_LEVEL", "7"),
    ("NPUSIM_TRACE_BUFFER", "-3"), ("HCCL_ALGO", "level1:"), ("HCCL_ALGO", "level0:NA"),
])
def test_config_bad_values_name_the_variable(env, name, value):
    env.setenv(name, value)
    fn = {"HCCL_EXEC_TIMEOUT": config.exec_timeout, "HCCL_CONNECT_TIMEOUT": config.connect_timeout,
          "HCCL_BUFFSIZE": config.slice_bytes, "HCCL_IF_IP": config.if_ip,
          "ASCEND_GLOBAL_LOG_LEVEL": config.log_level, "NPUSIM_TRACE_BUFFER": config.trace_buffer,
          "HCCL_ALGO": config.algo}[name]
    with pytest.raises(InvalidArgumentError, match=name):
        fn()


# --- reduce -----------------------------------------------------------------------------------

def _sample(dt: np.dtype, n: int, rng) -> np.ndarray:
    if dt.kind == "f" or dt == BF16:
        return (rng.standard_normal(n) * 3).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


@pytest.mark.parametrize("op", list(ReduceOp))
@pytest.mark.parametrize("dt", list(DataType))
def test_reduce_into_matches_numpy(dt, op):
    rng = np.random.default_rng(int(dt) * 10 + int(op))
    a, b = _sample(dt.numpy, 1000, rng), _sample(dt.numpy, 1000, rng)
    fn = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply, ReduceOp.MAX: np.maximum,
          ReduceOp.MIN: np.minimum}[op]
    if dt in (DataType.FP16, DataType.BFP16):       # through fp32, rounded back once
        want = fn(a.astype(np.float32), b.astype(np.float32)).astype(dt.numpy)
    else:
        with np.errstate(all="ignore"):
            want = fn(a, b)
    dst = a.copy()
    b.flags.writeable = False                        # a received message is read-only
    with np.errstate(all="ignore"):
        reduce_into(dst, b, op)
    assert dst.dtype == dt.numpy
    np.testing.assert_array_equal(dst.view(np.uint8), want.view(np.uint8))


def test_integers_wrap_like_numpy():
    x = np.array([127, -128, 100], np.int8)
    reduce_into(x, np.array([1, -1, 100], np.int8), ReduceOp.SUM)
    assert x.tolist() == [-128, 127, -56]
    y = np.array([250, 16], np.uint8)
    reduce_into(y, np.array([10, 16], np.uint8), "prod")
    assert y.tolist() == [(250 * 10) % 256, 0]
    z = np.array([2**63 - 1], np.int64)
    reduce_into(z, np.array([1], np.int64), ReduceOp.SUM)
    assert z[0] == -2**63


def test_half_precision_rounds_once_per_step():
    # 2048 + 1 is not representable in fp16: rounds to even (2048); bf16 has 8 bits of mantissa
    h = np.array([2048, 1], np.float16)
    reduce_into(h, np.array([1, 2**-14], np.float16), ReduceOp.SUM)
    assert h.tolist() == [2048.0, 1.0]
    b = np.array([256, 3], BF16)
    reduce_into(b, np.array([1, 0.5], BF16), ReduceOp.SUM)
    assert b.astype(np.float32).tolist() == [256.0, 3.5]


def test_reduce_into_handles_blocks_nan_and_shape_checks():
    n = (1 << 18) * 2 + 3                              # crosses the fp32 block boundary
    a = np.full(n, 1.5, np.float16)
    reduce_into(a, np.full(n, 2.0, np.float16), ReduceOp.PROD)
    assert (a == 3.0).all()
    m = np.array([np.nan, 1.0], np.float32)
    reduce_into(m, np.array([0.0, np.nan], np.float32), ReduceOp.MAX)
    assert np.isnan(m).all()
    with pytest.raises(ValueError, match="same dtype"):
        reduce_into(np.zeros(3, np.float32), np.zeros(3, np.float64), ReduceOp.SUM)
    with pytest.raises(ValueError):
        reduce_into(np.zeros(3, np.int32), np.zeros(4, np.int32), ReduceOp.SUM)
    e = np.zeros(0, BF16)
    reduce_into(e, np.zeros(0, BF16), ReduceOp.MIN)


def test_reduce_reference():
    xs = [np.array([1, 2, 3], np.int16) * (r + 1) for r in range(4)]
    assert reduce_reference(xs, ReduceOp.SUM).tolist() == [10, 20, 30]
    assert reduce_reference(xs, ReduceOp.PROD).tolist() == [24, 384, 1944]
    assert reduce_reference(xs, ReduceOp.MAX).tolist() == [4, 8, 12]
    f = [np.array([1e8, 1.0], np.float32), np.array([-1e8, 1.0], np.float32)]
    assert reduce_reference(f, ReduceOp.SUM).tolist() == [0.0, 2.0]
    assert reduce_reference([np.ones(2, BF16)] * 3, ReduceOp.SUM).dtype == BF16


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.int32, st.integers(0, 64)), st.data())
def test_property_int_sum_is_modular(a, data):
    b = data.draw(hnp.arrays(np.int32, a.shape))
    dst = a.copy()
    reduce_into(dst, b, ReduceOp.SUM)
    want = ((a.astype(np.int64) + b.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint64, np.float16, np.float32,
                                   np.float64, DataType.BFP16.numpy])
@pytest.mark.parametrize("op", list(ReduceOp))
def test_reduce3_gives_the_bytes_of_copy_then_reduce_into(dtype, op):
    """The ring's first write of a chunk (dst = send op payload) must not change one bit."""
    from hccl.reduction import reduce3
    rng = np.random.default_rng(int(op) + 7)
    n = (1 << 18) + 77                               # more than one widening block
    a = (rng.standard_normal(n) * 100).astype(dtype)
    b = (rng.standard_normal(n) * 100).astype(dtype)
    ref, out, same = a.copy(), np.empty_like(a), a.copy()
    with np.errstate(over="ignore"):                 # fp16 products overflow to inf: both alike
        reduce_into(ref, b, op)
        reduce3(out, a, b, op)
        reduce3(same, same, b, op)                   # dst may be a
    assert out.tobytes() == ref.tobytes()
    assert same.tobytes() == ref.tobytes()
    with pytest.raises(ValueError, match="same dtype and size"):
        reduce3(out[:-1], a, b, op)


def test_ring_all_reduce_out_of_place_never_copies_send_into_recv():
    from hccl import schedule as sch
    from hccl.types import OpType
    for size in (2, 3, 5):
        for rank in range(size):
            steps = sch.build(OpType.ALLREDUCE, rank, size, 1000, 4, 1 << 20, algo="ring")
            assert not any(isinstance(s, sch.Copy) for s in steps)
            firsts = [s for s in steps if isinstance(s, sch.Recv) and s.reduce]
            assert firsts and all(s.src == sch.SEND for s in firsts)
