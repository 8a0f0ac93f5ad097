"""A communicator method's repeat (``comm.all_reduce(x)`` again) takes its remembered Call by
the arrays themselves (hccl.collectives._repeat), and nothing a check caught slips through."""
import numpy as np
import pytest

import hccl
import runtime
from hccl import InvalidArgumentError, ReduceOp
from runtime.errors import InvalidParamError

from conftest import run_ranks

pytestmark = pytest.mark.timeout(60)


def test_each_method_repeat_is_one_call_with_exact_results():
    def body(comm):
        r, n = comm.rank, comm.size
        s = runtime.Stream()
        x = runtime.to_device(np.full(8, r + 1, np.float32))
        g = runtime.empty(8 * n, np.float32)
        b = runtime.to_device(np.full(8, 10 * r, np.float32))
        out = []
        for i in range(3):
            comm.all_reduce(x, op=ReduceOp.MAX, stream=s)
            comm.all_gather(x, g, stream=s)
            comm.broadcast(b, root=1, stream=s)
            with runtime.stream(s):
                comm.all_reduce(x, op=ReduceOp.MAX)     # the current stream: the same key
            out.append((x.to_host(s), g.to_host(s), b.to_host(s)))
        return out, len(comm._calls)

    for out, calls in run_ranks(3, body):
        assert calls == 3                   # one per method and arguments, however often called
        for xs, gs, bs in out:
            np.testing.assert_array_equal(xs, np.full(8, 3, np.float32))
            np.testing.assert_array_equal(gs, np.full(24, 3, np.float32))
            np.testing.assert_array_equal(bs, np.full(8, 10, np.float32))


def test_a_method_repeat_is_checked_again_when_anything_changed():
    def body(comm):
        s = runtime.Stream()
        x = runtime.to_device(np.ones(16, np.float32))
        comm.all_reduce(x, stream=s)
        s.synchronize()
        y = x.reshape(4, 4)                 # another array on the same memory: another key
        comm.all_reduce(y, stream=s)
        s.synchronize()
        with pytest.raises(InvalidArgumentError, match="op="):
            comm.all_reduce(x, op="nope", stream=s)
        x.free()
        with pytest.raises((InvalidArgumentError, InvalidParamError), match="free"):
            comm.all_reduce(x, stream=s)
        s.destroy()
        z = runtime.to_device(np.ones(16, np.float32))
        with pytest.raises(InvalidArgumentError, match="destroyed"):
            comm.all_reduce(z, stream=s)
        return len(comm._calls)

    assert run_ranks(2, body) == [2, 2]
