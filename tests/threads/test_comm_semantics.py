"""Collectives as stream tasks: ordering, events, asynchrony, concurrent communicators, bad
arguments, sub-communicators, mismatch and timeout on threaded ranks."""
import threading
import time

import numpy as np
import pytest

import hccl
import runtime
from hccl import DataType, ReduceOp, Result
from runtime import errors as rt_errors

from conftest import run_ranks

pytestmark = pytest.mark.timeout(60)


def test_collective_sees_kernel_output_enqueued_before_it():
    def body(comm):
        s = runtime.Stream()
        x = runtime.zeros(1000, np.float32)

        def slow_fill(v):
            time.sleep(0.1)
            v[:] = comm.rank + 1
        runtime.launch(slow_fill, x, stream=s)
        comm.all_reduce(x, stream=s)
        return x.to_host(stream=s)
    outs = run_ranks(3, body)
    for o in outs:
        np.testing.assert_array_equal(o, np.full(1000, 6, np.float32))


def test_event_after_collective_orders_another_stream():
    def body(comm):
        compute, comm_stream = runtime.Stream(), runtime.Stream()
        x = runtime.to_device(np.full(4096, comm.rank, np.float64))
        y = runtime.zeros(4096, np.float64)
        comm.all_reduce(x, stream=comm_stream)
        done = comm_stream.record_event()
        compute.wait_event(done)
        runtime.launch(lambda a, b: np.copyto(b, a * 2), x, y, stream=compute)
        return y.to_host(stream=compute)
    outs = run_ranks(4, body)
    for o in outs:
        np.testing.assert_array_equal(o, np.full(4096, 12.0))


def test_call_returns_before_the_collective_completes():
    def body(comm):
        s = runtime.Stream()
        gate = threading.Event()
        x = runtime.to_device(np.ones(10, np.int32))
        runtime.launch(gate.wait, 10, stream=s)
        t0 = time.perf_counter()
        comm.all_reduce(x, stream=s)
        returned = time.perf_counter() - t0
        before = x.to_host(stream=runtime.Stream())   # another stream: does not wait for s
        pending = not s.query()
        gate.set()
        return returned, before, pending, x.to_host(stream=s)
    outs = run_ranks(2, body)
    for returned, before, pending, after in outs:
        assert returned < 5 and pending       # the gate holds the stream for 10 s: not waited
        np.testing.assert_array_equal(before, np.ones(10, np.int32))
        np.testing.assert_array_equal(after, np.full(10, 2, np.int32))


def test_two_communicators_on_two_streams_at_once():
    def body(comm):
        other = comm.create_sub_comm(list(range(comm.size)))       # a second comm, same ranks
        s1, s2 = runtime.Stream(), runtime.Stream()
        outs = []
        for i in range(20):
            a = runtime.to_device(np.full(3000, comm.rank + i, np.int64))
            b = runtime.to_device(np.full(3000, 10 * comm.rank + i, np.int64))
            comm.all_reduce(a, stream=s1)
            other.all_reduce(b, op=ReduceOp.MAX, stream=s2)
            outs.append((a, b))
        res = [(a.to_host(stream=s1)[0], b.to_host(stream=s2)[0]) for a, b in outs]
        other.destroy()
        return res
    size = 3
    outs = run_ranks(size, body)
    for res in outs:
        for i, (a, b) in enumerate(res):
            assert a == sum(range(size)) + size * i
            assert b == 10 * (size - 1) + i


def test_sub_communicator():
    def body(comm):
        if comm.rank % 2 == 0:
            sub = comm.create_sub_comm([r for r in range(comm.size) if r % 2 == 0])
            x = runtime.to_device(np.full(5, comm.rank, np.int32))
            sub.all_reduce(x)
            out = (sub.rank, sub.size, sub.name, x.to_host())
            sub.destroy()
            return out
        return None
    outs = run_ranks(5, body)
    for r in (0, 2, 4):
        sub_rank, sub_size, name, x = outs[r]
        assert sub_rank == r // 2 and sub_size == 3 and "sub[0, 2, 4]" in name
        np.testing.assert_array_equal(x, np.full(5, 6, np.int32))


def test_bad_arguments_raise_at_the_call_and_comm_still_works():
    def body(comm):
        small = runtime.empty(10, np.float32)
        big = runtime.empty(100, np.float32)
        half = runtime.empty(10, np.float16)
        msgs = {}
        cases = {
            "count": lambda: hccl.all_reduce(small, big, 11, DataType.FP32, ReduceOp.SUM, comm),
            "dtype": lambda: hccl.all_reduce(half, half, 10, DataType.FP32, ReduceOp.SUM, comm),
            "gather": lambda: hccl.all_gather(small, small, 10, DataType.FP32, comm),
            "root": lambda: hccl.broadcast(small, 10, DataType.FP32, comm.size, comm),
            "peer": lambda: hccl.send(small, 10, DataType.FP32, -1, comm),
            "self": lambda: hccl.recv(small, 10, DataType.FP32, comm.rank, comm),
            "op": lambda: hccl.all_reduce(small, small, 10, DataType.FP32, "AVG", comm),
            "count_neg": lambda: hccl.all_reduce(small, small, -1, DataType.FP32, ReduceOp.SUM, comm),
            "buffer": lambda: hccl.all_reduce(np.zeros(10), small, 10, DataType.FP32, ReduceOp.SUM, comm),
        }
        for name, call in cases.items():
            with pytest.raises(hccl.HcclError) as ei:
                call()
            assert ei.value.result == Result.E_PARA
            msgs[name] = str(ei.value)
        x = runtime.to_device(np.ones(10, np.float32))
        comm.all_reduce(x)                                   # still works, seq not consumed
        dead = comm.create_sub_comm(list(range(comm.size)))
        dead.destroy()
        with pytest.raises(hccl.HcclError, match="destroyed") as ei:
            dead.all_reduce(x)
        assert ei.value.result == Result.E_PARA
        return msgs, x.to_host()
    outs = run_ranks(2, body)
    msgs, x = outs[0]
    np.testing.assert_array_equal(x, np.full(10, 2, np.float32))
    assert "40 bytes" in msgs["count"] and "44 bytes" in msgs["count"]
    assert "float16" in msgs["dtype"] and "FP32" in msgs["dtype"]    # the array says otherwise
    assert "80 bytes" in msgs["gather"] and "recv" in msgs["gather"]
    assert "root=2" in msgs["root"] and "0..1" in msgs["root"]
    assert "dest=-1" in msgs["peer"]
    assert "this rank" in msgs["self"]


def test_mismatched_collectives_fail_every_rank_fast():
    def body(comm):
        x = runtime.to_device(np.ones(1024, np.float32))
        g = runtime.empty(1024 * comm.size, np.float32)
        comm.set_exec_timeout(30)
        t0 = time.perf_counter()
        if comm.rank == 1:
            hccl.all_gather(x, g, 512, DataType.FP32, comm)
        else:
            comm.all_reduce(x)
        with pytest.raises(hccl.CollectiveMismatchError) as ei:
            runtime.synchronize()
        return str(ei.value), time.perf_counter() - t0, isinstance(ei.value, rt_errors.TaskError)
    outs = run_ranks(3, body)
    for rank, (msg, elapsed, is_task_error) in enumerate(outs):
        assert elapsed < 20 and is_task_error   # the mismatch, not the 30 s timeout (load slack)
        assert "seq 1" in msg or "seq=1" in msg, msg
    assert any("ALLREDUCE(count=1024, FP32, SUM)" in m and "ALLGATHER(count=512, FP32)" in m
               for m, _, _ in outs)


def test_same_collective_other_count_is_a_mismatch():
    def body(comm):
        n = 100 if comm.rank == 0 else 200
        x = runtime.to_device(np.ones(n, np.float32))
        comm.all_reduce(x)
        with pytest.raises(hccl.CollectiveMismatchError) as ei:
            runtime.synchronize()
        return str(ei.value)
    outs = run_ranks(2, body)
    assert all("count=100" in m and "count=200" in m for m in outs), outs


def test_stalled_peer_times_out_with_the_watchdog_line():
    release = threading.Event()

    def body(comm):
        comm.set_exec_timeout(0.5)
        x = runtime.to_device(np.ones(1 << 18, np.float32))
        if comm.rank == 1:
            release.wait(10)            # never enters the collective in time
            comm.all_reduce(x)
            with pytest.raises(hccl.HcclError) as ei:
                runtime.synchronize()
            return ei.value
        t0 = time.perf_counter()
        comm.all_reduce(x)
        with pytest.raises(hccl.HcclTimeoutError) as ei:
            runtime.synchronize()
        elapsed = time.perf_counter() - t0
        release.set()
        return ei.value, elapsed
    outs = run_ranks(2, body)
    err, elapsed = outs[0]
    first = str(err).splitlines()[0]
    assert first.startswith("[rank 0] ALLREDUCE(comm=world, seq=1, count=262144, FP32, SUM) timed out "
                            "after 0.5 s (the timeout set by comm.set_exec_timeout(0.5)); "
                            "last enqueued seq 1, "
                            "last completed seq 0"), first
    assert 0.45 < elapsed < 9            # the 0.5 s timeout, not rank 1's 10 s (load slack)
    assert err.result == Result.E_TIMEOUT and err.peer == 1
    late = outs[1]                       # the late rank finds the communicator aborted by rank 0
    assert isinstance(late, hccl.RemoteRankError) and late.rank == 0


def test_a_victim_of_a_timeout_says_whom_it_was_waiting_for():
    """Rank 0 times out waiting for rank 1, which itself waits for rank 2 (stuck): rank 1's
    error names rank 2, so the chain leads to the culprit even when a victim timed out first."""
    release = threading.Event()

    def body(comm):
        x = runtime.to_device(np.ones(16, np.float32))
        y = runtime.empty(16, np.float32)
        if comm.rank == 2:
            release.wait(30)              # stuck: sends nothing until the others have failed
            return None
        comm.set_exec_timeout(1 if comm.rank == 0 else 60)
        hccl.recv(y, 16, DataType.FP32, comm.rank + 1, comm)
        with pytest.raises(hccl.HcclError) as ei:
            runtime.synchronize()
        return ei.value
    results = {}

    def wrapped(comm):
        try:
            results[comm.rank] = body(comm)
        finally:
            if comm.rank != 2 and len(results) == 2:
                release.set()
        return results.get(comm.rank)
    outs = run_ranks(3, wrapped)
    assert isinstance(outs[0], hccl.HcclTimeoutError) and outs[0].peer == 1, outs[0]
    victim = str(outs[1])
    assert isinstance(outs[1], hccl.RemoteRankError), victim
    assert "rank 0 timed out" in victim and "rank 1 was itself waiting for rank 2" in victim, victim
