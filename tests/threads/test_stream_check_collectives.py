"""The stream sanitizer and hccl: collectives and point-to-point calls against kernels on another
stream (threaded ranks). A race raises at the collective's call, before it takes a sequence
number, so the communicator goes on working once the streams are ordered."""
import numpy as np
import pytest

import hccl
import runtime
from runtime.errors import StreamRaceError

from conftest import run_ranks


@pytest.fixture
def check():
    runtime.enable_stream_check("raise")
    yield
    runtime.enable_stream_check("off")


def _fill(x, v):
    x[:] = v


def _peek(x):
    return float(x.sum())


@pytest.mark.timeout(60)
def test_all_reduce_against_kernels_on_another_stream(check):
    def body(comm):
        compute, comm_s = runtime.Stream(name="compute"), runtime.Stream(name="comm")
        buf = runtime.zeros(256)
        runtime.launch(_fill, buf, comm.rank + 1.0, stream=compute, name="fill")
        errors = []
        try:                    # the collective would read the buffer the kernel writes
            comm.all_reduce(buf, stream=comm_s)
        except StreamRaceError as e:
            errors.append(e)
        comm_s.wait_event(compute.record_event())
        comm.all_reduce(buf, stream=comm_s)            # ordered: fine, and the comm still works
        try:                    # a kernel reading what the collective writes, unordered
            runtime.launch(_peek, runtime.read_only(buf), stream=compute, name="reader")
        except StreamRaceError as e:
            errors.append(e)
        compute.wait_stream(comm_s)
        out = buf.to_host(stream=compute)
        return errors, out

    results = run_ranks(2, body)
    for errors, out in results:
        assert (out == 3.0).all()
        e1, e2 = errors
        assert (e1.first_task, e1.first_stream, e1.first_access) == ("fill", "compute", "write")
        assert (e1.second_task, e1.second_stream, e1.second_access) == \
            ("HcclAllReduce", "comm", "write")
        assert e1.second_site.endswith("in body") and "test_stream_check_collectives.py" in e1.second_site
        assert (e2.first_task, e2.second_task, e2.second_access) == ("HcclAllReduce", "reader", "read")


@pytest.mark.timeout(60)
def test_send_reads_and_recv_writes(check):
    def body(comm):
        compute, comm_s = runtime.Stream(name="compute"), runtime.Stream(name="comm")
        buf = runtime.zeros(64)
        if comm.rank == 0:
            runtime.launch(_peek, runtime.read_only(buf), stream=compute, name="peek")
            hccl.send(buf, 64, hccl.DataType.FP32, 1, comm, stream=comm_s)   # reads: no race
            runtime.synchronize()
            return None
        runtime.launch(_peek, runtime.read_only(buf), stream=compute, name="peek")
        try:
            hccl.recv(buf, 64, hccl.DataType.FP32, 0, comm, stream=comm_s)   # writes: a race
        except StreamRaceError as e:
            err = e
        comm_s.wait_stream(compute)
        hccl.recv(buf, 64, hccl.DataType.FP32, 0, comm, stream=comm_s)
        comm_s.synchronize()
        return err

    _, err = run_ranks(2, body)
    assert (err.first_task, err.first_access, err.second_task, err.second_access) == \
        ("peek", "read", "HcclRecv", "write")


@pytest.mark.timeout(60)
def test_collectives_on_disjoint_views_on_two_streams(check):
    """Collectives on disjoint views of one allocation on two streams do not race."""
    def body(comm):
        s1, s2 = runtime.Stream(), runtime.Stream()
        flat = runtime.to_device(np.arange(8 * comm.size, dtype=np.float32))
        lo, hi = flat[0:4 * comm.size], flat[4 * comm.size:8 * comm.size]
        comm.all_reduce(lo, stream=s1)
        comm.all_reduce(hi, stream=s2)
        runtime.synchronize()
        return flat.to_host()

    for out in run_ranks(2, body):
        assert np.array_equal(out, 2 * np.arange(16, dtype=np.float32))
