"""Collectives and point-to-point inside task graphs: planned once, a new seq at every replay."""
import numpy as np
import pytest

import hccl
import runtime
from hccl.flight import recorder
from runtime.errors import GraphCaptureError

pytestmark = pytest.mark.timeout(120)


def scale(a, k):
    a *= k


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_replayed_step_of_kernels_and_collectives_is_exact(ranks, size):
    def body(comm):
        s = runtime.Stream()
        x = runtime.to_device(np.full(1000, comm.rank + 1, np.int64))
        gathered = runtime.empty((1000 * comm.size,), np.int64)
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            comm.all_reduce(x, stream=s)                    # x = sum over ranks
            runtime.launch(scale, x, 2, stream=s)           # x *= 2
            comm.all_gather(x, gathered, stream=s)
            comm.broadcast(x, root=comm.size - 1, stream=s)
        assert len(g) == 4
        captured = recorder.last(comm.comm_id, comm.rank)   # nothing issued at capture
        for _ in range(5):
            g.replay(s)
        s.synchronize()
        return x.to_host(), gathered.to_host(), captured, recorder.last(comm.comm_id, comm.rank)

    x = np.arange(1, size + 1, dtype=np.int64)
    for _ in range(5):
        x = np.full(size, 2 * x.sum())
    for xr, gr, captured, after in ranks(size, body):
        assert np.array_equal(xr, np.full(1000, x[0]))
        assert np.array_equal(gr, np.full(1000 * size, x[0]))
        assert captured == (0, 0) and after == (15, 15)     # 3 collectives x 5 replays


def test_point_to_point_in_a_graph(ranks):
    def body(comm):
        s = runtime.Stream()
        buf = runtime.to_device(np.arange(64, dtype=np.float32) + 100 * comm.rank)
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            if comm.rank == 0:
                comm.send(buf, dest=1, stream=s)
                comm.recv(buf, src=1, stream=s)
            else:
                comm.recv(buf, src=0, stream=s)
                runtime.launch(scale, buf, 3.0, stream=s)
                comm.send(buf, dest=0, stream=s)
        for _ in range(3):
            g.replay(s)
        s.synchronize()
        return buf.to_host()

    r0, r1 = ranks(2, body)
    want = np.arange(64, dtype=np.float32)
    for _ in range(3):
        want = want * 3.0
    assert np.array_equal(r0, want) and np.array_equal(r1, want)


def test_graph_and_eager_collectives_interleave_by_seq(ranks):
    def body(comm):
        s = runtime.Stream()
        x = runtime.to_device(np.ones(8, np.int32))
        y = runtime.to_device(np.ones(8, np.int32))
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            comm.all_reduce(x, stream=s)
        for _ in range(3):
            g.replay(s)
            comm.all_reduce(y, stream=s)                    # eager, between replays
        s.synchronize()
        return x.to_host()[0], y.to_host()[0]

    for x, y in ranks(3, body):
        assert (x, y) == (27, 27)


def test_ranks_replaying_different_graphs_are_a_mismatch(ranks):
    def body(comm):
        s = runtime.Stream()
        x = runtime.to_device(np.ones(16, np.float32))
        out = runtime.empty((16 * comm.size,), np.float32)
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            if comm.rank == 0:
                comm.all_reduce(x, stream=s)
            else:
                comm.all_gather(x, out, stream=s)
        g.replay(s)
        with pytest.raises(hccl.CollectiveMismatchError) as e:
            s.synchronize()
        return str(e.value)

    for msg in ranks(2, body):
        assert "ALLREDUCE" in msg and "ALLGATHER" in msg and "seq 1" in msg


def test_collective_on_a_stream_outside_the_capture_is_refused(ranks):
    def body(comm):
        s, other = runtime.Stream(), runtime.Stream()
        x = runtime.to_device(np.ones(4, np.float32))
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            with pytest.raises(GraphCaptureError, match="not part of the capture"):
                comm.all_reduce(x, stream=other)
            comm.all_reduce(x, stream=s)
        g.replay(s)
        other.wait_stream(s)
        comm.all_reduce(x, stream=other)        # after the capture: eager, fine
        other.synchronize()
        return x.to_host()

    for x in ranks(2, body):
        assert np.array_equal(x, np.full(4, 4.0))
