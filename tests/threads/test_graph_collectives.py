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


# ------------------------------------------------------------------ fusion of adjacent AllReduces
def _grads(comm, shapes, dtype=np.float32):
    rng = np.random.default_rng(1234 + comm.rank)
    return [rng.standard_normal(n).astype(dtype) for n in shapes]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("op", [hccl.ReduceOp.SUM, hccl.ReduceOp.MAX, hccl.ReduceOp.PROD])
def test_fused_allreduces_are_bitwise_the_separate_calls(ranks, size, op):
    shapes = [256, 1, 1000, 37, 256, 4096, 3, 256]

    def body(comm):
        s = runtime.Stream()
        hosts = _grads(comm, shapes)
        eager = [runtime.to_device(h) for h in hosts]
        for b in eager:
            comm.all_reduce(b, op=op, stream=s)
        s.synchronize()
        fused = [runtime.to_device(h) for h in hosts]
        outs = [runtime.empty(b.shape, np.float32) for b in fused]
        g = runtime.Graph()
        with runtime.graph(g, stream=s):                # out of place, then in place
            for b, o in zip(fused, outs):
                comm.all_reduce(b, o, op=op, stream=s)
            for b in fused:
                comm.all_reduce(b, op=op, stream=s)
        names = [n.name for n in g._nodes]
        before = recorder.last(comm.comm_id, comm.rank)
        g.replay(s)
        s.synchronize()
        return ([b.to_host() for b in eager], [o.to_host() for o in outs],
                [b.to_host() for b in fused], names, before,
                recorder.last(comm.comm_id, comm.rank))

    for eager, outs, fused, names, before, after in ranks(size, body):
        assert names == [f"HcclAllReduce x{len(shapes)} (fused)"] * 2
        assert after[0] - before[0] == 2 * len(shapes)      # a seq and a record per call
        for e, o, f in zip(eager, outs, fused):
            assert e.tobytes() == o.tobytes() == f.tobytes()


def test_a_fused_replay_matches_the_eager_step_many_times(ranks):
    def body(comm):
        s = runtime.Stream()
        xs = [runtime.to_device(np.full(64, comm.rank + 1, np.int64)) for _ in range(4)]
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            for x in xs:
                comm.all_reduce(x, stream=s)
            runtime.launch(scale, xs[0], 2, stream=s)
        for _ in range(4):
            g.replay(s)
        comm.all_reduce(xs[1], stream=s)                    # eager after the replays
        s.synchronize()
        return len(g), [x.to_host()[0] for x in xs]

    n = 3
    want = [1 + 2 + 3] * 4                  # after the first replay's AllReduces
    want[0] *= 2
    for _ in range(3):
        want = [v * n for v in want]
        want[0] *= 2
    want[1] *= n
    for length, vals in ranks(n, body):
        assert length == 2                  # the fused AllReduces, the kernel
        assert vals == want == [2592, 486, 162, 162]


def test_what_does_not_fuse(ranks):
    """A member that reads what the previous one writes, another dtype, a node between, a
    size past the rank-order algorithm: separate nodes, with the eager results."""
    def body(comm):
        s = runtime.Stream()
        a = runtime.to_device(np.full(8, 1.0, np.float32))
        b = runtime.to_device(np.full(8, 1, np.int32))
        big = runtime.to_device(np.full(40 << 10, 1.0, np.float32))     # 160 KiB: ring at 2
        g = runtime.Graph()
        with runtime.graph(g, stream=s):
            comm.all_reduce(a, stream=s)
            comm.all_reduce(a, stream=s)        # reads a's result: must not fuse
            comm.all_reduce(b, stream=s)        # another dtype
            runtime.launch(scale, b, 1, stream=s)
            comm.all_reduce(b, stream=s)
            comm.all_reduce(big, stream=s)      # another algorithm
        g.replay(s)
        s.synchronize()
        return [n.name for n in g._nodes], a.to_host()[0], b.to_host()[0], big.to_host()[-1]

    for names, a, b, big in ranks(2, body):
        assert all("fused" not in n for n in names) and len(names) == 6
        assert (a, b, big) == (4.0, 4, 2.0)


def test_fusion_can_be_turned_off_and_a_fused_mismatch_names_both(ranks):
    def body(comm):
        s = runtime.Stream()
        xs = [runtime.to_device(np.ones(16, np.float32)) for _ in range(3)]
        g = runtime.Graph(fuse=comm.rank == 0)
        with runtime.graph(g, stream=s):
            for x in xs:
                comm.all_reduce(x, stream=s)
        g.replay(s)
        with pytest.raises(hccl.CollectiveMismatchError) as e:
            s.synchronize()
        return len(g), str(e.value)

    (n0, m0), (n1, m1) = ranks(2, body)
    assert (n0, n1) == (1, 3)
    for msg in (m0, m1):
        assert "count=48" in msg and "fused=3" in msg and "count=16" in msg
