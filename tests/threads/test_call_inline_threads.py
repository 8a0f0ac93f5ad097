"""An eager call on an idle stream runs in the caller while its messages are there
(``hccl.call.Call.begin``): done at the call, the stream's worker never started; a failure met
there surfaces as the same sticky error a failure in the task does."""
import threading

import numpy as np
import pytest

import runtime
from hccl import HcclError, RemoteRankError, ReduceOp
from hccl.transport import inproc
from hccl.transport.base import TransportClosed
from runtime.errors import TaskError

from conftest import run_ranks

pytestmark = pytest.mark.timeout(60)


def test_a_call_whose_messages_are_there_is_done_at_the_call():
    first = threading.Event()

    def body(comm):
        s = runtime.Stream()
        x = runtime.to_device(np.full(256, comm.rank + 1, np.float32))   # 1 KiB
        if comm.rank == 1:
            comm.all_reduce(x, op=ReduceOp.SUM, stream=s)   # rank 0's message is not there yet
            first.set()
            s.synchronize()
            return x.to_host(s), None
        first.wait(10)                  # rank 1's message is there: rank 0 runs it all here
        comm.all_reduce(x, op=ReduceOp.SUM, stream=s)
        done = (s.completed, s.issued, s._thread)
        s.synchronize()
        return x.to_host(s), done

    (x0, done), (x1, _) = run_ranks(2, body)
    np.testing.assert_array_equal(x0, np.full(256, 3, np.float32))
    np.testing.assert_array_equal(x1, np.full(256, 3, np.float32))
    assert done == (1, 1, None)         # complete when the call returned, no worker started


def test_many_calls_in_a_row_stay_exact_at_odd_worlds():
    def body(comm):
        s = runtime.Stream()
        x = runtime.to_device(np.zeros(100, np.float32))
        for i in range(40):
            x.copy_from_host(np.full(100, comm.rank + i, np.float32), stream=s)
            comm.all_reduce(x, op=ReduceOp.SUM, stream=s)
            s.synchronize()
            assert x.to_host(s)[0] == sum(r + i for r in range(comm.size))
        return True

    for size in (3, 5):
        assert run_ranks(size, body) == [True] * size


@pytest.mark.parametrize("where", ["inline", "task"])
def test_a_failure_met_at_the_call_is_the_tasks_sticky_error(monkeypatch, where):
    """The same transport failure, met by the caller's look for the message (``try_recv`` with
    a spin budget, from ``Program.begin``) or by the task (``Program.run``), gives rank 0 the
    same error, raised once by the synchronize."""
    real_try, real_recv = inproc.InprocPair.try_recv, inproc.InprocPair.recv_into

    def try_recv(self, comm_id, seq, step, fp, consume, spin=None):
        if self.t.rank == 0 and spin is not None and where == "task":
            return False                # not there at the call: the task goes on
        if self.t.rank == 0 and (spin is not None) == (where == "inline"):
            raise TransportClosed("injected")
        return real_try(self, comm_id, seq, step, fp, consume, spin or 0.0)

    monkeypatch.setattr(inproc.InprocPair, "try_recv", try_recv)

    def body(comm):
        s = runtime.Stream()
        x = runtime.to_device(np.ones(256, np.float32))
        comm.all_reduce(x, stream=s)
        if comm.rank == 1:          # done before rank 0 failed, or told of its failure
            try:
                s.synchronize()
            except RemoteRankError as e:
                assert "rank 0 failed" in str(e) and e.seq == 1
            return None
        assert s._error is not None or s.completed < s.issued      # not done at the call
        with pytest.raises(HcclError) as ei:
            s.synchronize()
        e = ei.value
        s.synchronize()                 # raised once: the stream goes on
        return type(e), isinstance(e, TaskError), e.code, e.seq, e.task, \
            str(e).splitlines()[0]

    kind, task, code, seq, name, msg = run_ranks(2, body)[0]
    assert issubclass(kind, HcclError) and task and name == "HcclAllReduce" and seq == 1
    assert code == TaskError.code
    assert msg == ("[rank 0] ALLREDUCE(comm=world, seq=1, count=256, FP32, SUM) failed: seq 1: "
                   "the transport was closed during the collective (injected); the "
                   "communicator was destroyed or the process is shutting down")
