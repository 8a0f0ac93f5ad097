"""An eager call that repeats a validated one skips the checks, and nothing a check caught
slips through (hccl.call: the communicator's Calls)."""
import gc
import threading

import numpy as np
import pytest

import hccl
import runtime
from hccl import DataType, InvalidArgumentError, ReduceOp
from runtime.errors import MemoryAccessError, TaskError

from conftest import run_ranks

pytestmark = pytest.mark.timeout(60)


def test_a_repeated_call_is_remembered_once_and_stays_exact():
    def body(comm):
        x = runtime.to_device(np.full(64, comm.rank + 1, np.float32))
        y = runtime.empty(64, np.float32)
        s = runtime.Stream()
        outs = []
        for _ in range(3):
            hccl.all_reduce(x, y, 64, DataType.FP32, ReduceOp.SUM, comm, s)
            outs.append(y.to_host(s))
        comm.all_reduce(x, op=ReduceOp.MAX, stream=s)              # another key: in place, MAX
        outs.append(x.to_host(s))
        return outs, len(comm._calls)

    for outs, n in run_ranks(2, body):
        for out in outs[:3]:
            np.testing.assert_array_equal(out, np.full(64, 3, np.float32))
        np.testing.assert_array_equal(outs[3], np.full(64, 2, np.float32))
        assert n == 2


def test_a_freed_buffer_is_refused_at_the_call_after_a_validated_call():
    def body(comm):
        x = runtime.to_device(np.ones(16, np.float32))
        hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, comm)
        runtime.synchronize()
        x.free()
        with pytest.raises(InvalidArgumentError, match="use after free"):
            hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, comm)
        p = runtime.malloc(64)                      # a pointer: remembered by value
        hccl.all_reduce(p, p, 16, DataType.FP32, ReduceOp.SUM, comm)
        runtime.synchronize()
        runtime.free(p)
        q = runtime.malloc(64)                      # the pool may hand out the same address
        with pytest.raises(InvalidArgumentError, match="use after free"):
            hccl.all_reduce(p, p, 16, DataType.FP32, ReduceOp.SUM, comm)
        hccl.all_reduce(q, q, 16, DataType.FP32, ReduceOp.SUM, comm)   # still works
        runtime.synchronize()
        return True

    assert run_ranks(2, body) == [True, True]


def test_a_buffer_freed_after_the_call_fails_the_task_as_before():
    def body(comm):
        x = runtime.to_device(np.ones(16, np.float32))
        s = runtime.Stream()
        hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, comm, s)
        s.synchronize()
        go = threading.Event()
        runtime.launch(go.wait, stream=s)            # the next call waits behind this
        hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, comm, s)
        x.free()
        go.set()
        with pytest.raises(TaskError) as e:
            s.synchronize()
        return type(e.value.__cause__)

    assert run_ranks(1, body) == [MemoryAccessError]


def test_arguments_equal_to_a_remembered_call_are_still_checked():
    def body(comm):
        x = runtime.to_device(np.ones(16, np.float32))
        hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, comm)
        hccl.broadcast(x, 16, DataType.FP32, 0, comm)
        errors = []
        for bad in (16.0, True):             # 16.0 == 16 and True == 1, but neither is a count
            with pytest.raises(InvalidArgumentError) as e:
                hccl.all_reduce(x, x, bad, DataType.FP32, ReduceOp.SUM, comm)
            errors.append(str(e.value))
        with pytest.raises(InvalidArgumentError, match="root"):
            hccl.broadcast(x, 16, DataType.FP32, False, comm)     # False == 0: not a rank
        with pytest.raises(InvalidArgumentError, match="holds 64 bytes"):
            hccl.all_reduce(x, x, 17, DataType.FP32, ReduceOp.SUM, comm)
        with pytest.raises(InvalidArgumentError, match="unhashable|must be|not"):
            hccl.all_reduce(x, x, [16], DataType.FP32, ReduceOp.SUM, comm)
        runtime.synchronize()
        return errors

    for errors in run_ranks(2, body):
        assert "count=16.0" in errors[0] and "count=True" in errors[1]


def test_a_destroyed_communicator_or_stream_is_refused_after_a_validated_call():
    def body(comm):
        x = runtime.to_device(np.ones(16, np.float32))
        s = runtime.Stream()
        hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, comm, s)
        s.destroy()
        with pytest.raises(InvalidArgumentError, match="destroyed"):
            hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, comm, s)
        sub = comm.create_sub_comm([comm.rank])
        hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, sub)
        runtime.synchronize()
        sub.destroy()
        with pytest.raises(InvalidArgumentError, match="destroyed"):
            hccl.all_reduce(x, x, 16, DataType.FP32, ReduceOp.SUM, sub)
        return len(sub._calls)

    assert run_ranks(2, body) == [0, 0]


def test_the_memo_keeps_no_array_alive_and_stays_bounded():
    from hccl import call as calls

    def body(comm):
        runtime.synchronize()
        before = runtime.memory_allocated()
        for _ in range(3 * calls.BOUND):
            x = runtime.to_device(np.ones(1024, np.float32))
            hccl.all_reduce(x, x, 1024, DataType.FP32, ReduceOp.SUM, comm)
            runtime.synchronize()
            del x
        gc.collect()
        return runtime.memory_allocated() - before, len(comm._calls)

    for grown, n in run_ranks(2, body):
        assert grown == 0
        assert 1 <= n <= calls.BOUND
