"""Stream-ordered frees (torch's caching allocator semantics, docs/memory.md): memory freed while
a task already enqueued on its stream still uses it stays valid until the stream passes the
free; misuse (a task of another stream, a task enqueued after the free) is still caught."""
import threading

import numpy as np
import pytest

import runtime
from runtime import errors

pytestmark = pytest.mark.timeout(60)
N = 16


def _copy(dst, src):
    np.copyto(dst, src)


def _fill(dst, v):
    dst[:] = v


def test_a_free_behind_queued_work_waits_for_it_on_its_stream(device):
    """The queued copy reads what ``x`` held, although ``x`` was freed and its memory handed to a
    new allocation of the same stream (written after the copy, in stream order)."""
    s = runtime.Stream()
    with runtime.stream(s):
        x = runtime.to_device(np.arange(N, dtype=np.float32))
        out = runtime.zeros(N, np.float32)
    gate = threading.Event()
    runtime.launch(gate.wait, 10, stream=s)
    runtime.launch(_copy, out, runtime.read_only(x), stream=s)
    addr = x.ptr.addr
    before = runtime.memory_allocated()
    x.free()
    assert runtime.memory_allocated() == before - 512 * 1     # drops at the free, as torch's
    with runtime.stream(s):
        y = runtime.empty(N, np.float32)        # same stream: the memory is reused at once
    assert y.ptr.addr == addr
    runtime.launch(_fill, y, 99.0, stream=s)
    gate.set()
    s.synchronize()
    np.testing.assert_array_equal(out.to_host(s), np.arange(N, dtype=np.float32))
    np.testing.assert_array_equal(y.to_host(s), np.full(N, 99, np.float32))
    with pytest.raises(errors.MemoryAccessError, match="double free"):
        x.free()


def test_another_stream_gets_the_memory_only_after_the_stream_passes_the_free(device):
    s, t = runtime.Stream(), runtime.Stream()
    with runtime.stream(s):
        p = runtime.malloc(4096)
    gate = threading.Event()
    runtime.launch(gate.wait, 10, stream=s)
    runtime.launch(lambda: runtime.host_view(p, 4096).fill(3), stream=s)   # its own view, inside
    runtime.free(p)
    with runtime.stream(t):
        q = runtime.malloc(4096)
    assert q.addr != p.addr                     # still s's: t may not have it yet
    gate.set()
    s.synchronize()
    runtime.free(q)


@pytest.mark.parametrize("path", ["worker", "caller runs"])
def test_queued_kernels_of_the_freeing_stream_run_on_either_path(device, path):
    """Repeated on fresh streams: the worker runs the queue, or the synchronizing thread does."""
    for i in range(100):
        s = runtime.Stream()
        with runtime.stream(s):
            x = runtime.to_device(np.full(N, i, np.int32))
            out = runtime.zeros(N, np.int32)
        if path == "worker":
            gate = threading.Event()
            runtime.launch(gate.wait, 10, stream=s)
        runtime.launch(_copy, out, x, stream=s)
        x.free()
        if path == "worker":
            gate.set()
        s.synchronize()
        assert out.to_host(s)[0] == i
        out.free()
        s.destroy()


def test_a_graph_replayed_before_the_free_runs_and_one_after_fails(device):
    s = runtime.Stream()
    with runtime.stream(s):
        x = runtime.to_device(np.arange(N, dtype=np.float32))
        out = runtime.zeros(N, np.float32)
    g = runtime.Graph()
    with runtime.graph(g, stream=s):
        runtime.launch(_copy, out, runtime.read_only(x), stream=s)
    gate = threading.Event()
    runtime.launch(gate.wait, 10, stream=s)
    g.replay(s)
    x.free()
    gate.set()
    s.synchronize()
    np.testing.assert_array_equal(out.to_host(s), np.arange(N, dtype=np.float32))
    g.replay(s)                                 # enqueued after the free: a real use after free
    with pytest.raises(errors.TaskError, match="use after free") as e:
        s.synchronize()
    assert isinstance(e.value.__cause__, errors.MemoryAccessError)


def test_a_task_of_another_stream_is_still_a_use_after_free(device):
    """The pool orders the reuse by the allocation's stream only: work of another stream queued
    before the free may find the memory given away, so it fails instead of using it."""
    s, t = runtime.Stream(), runtime.Stream()
    with runtime.stream(s):
        x = runtime.to_device(np.ones(N, np.float32))
    out = runtime.zeros(N, np.float32)
    gate = threading.Event()
    runtime.launch(gate.wait, 10, stream=t)
    runtime.launch(_copy, out, x, stream=t)
    x.free()
    gate.set()
    with pytest.raises(errors.TaskError, match="use after free") as e:
        t.synchronize()
    assert isinstance(e.value.__cause__, errors.MemoryAccessError)


def test_a_task_enqueued_after_the_free_is_refused_at_the_call(device):
    s = runtime.Stream()
    with runtime.stream(s):
        x = runtime.to_device(np.ones(N, np.float32))
    view = x[2:4]
    gate = threading.Event()
    runtime.launch(gate.wait, 10, stream=s)     # the free is still pending on s
    p = x.ptr
    x.free()
    with pytest.raises(errors.InvalidParamError, match="freed DeviceArray"):
        runtime.launch(_fill, x, 1.0, stream=s)
    with pytest.raises(errors.MemoryAccessError, match="use after free"):
        runtime.launch(_fill, view, 1.0, stream=s)
    with pytest.raises(errors.MemoryAccessError, match="use after free"):
        runtime.launch(lambda ptr: None, p, stream=s)
    with pytest.raises(errors.MemoryAccessError, match="use after free"):
        runtime.memcpy_async(p, np.ones(4, np.uint8), 4, stream=s)
    with pytest.raises(errors.MemoryAccessError, match="use after free"):
        runtime.host_view(p, 4)                 # the host is not the stream's work
    gate.set()
    s.synchronize()


def test_record_stream_keeps_the_memory_for_another_streams_queued_work(device):
    """torch's Tensor.record_stream: the free waits for the recorded stream too, and until it
    passes the free no stream, not even the allocating one, gets the memory."""
    s, t = runtime.Stream(), runtime.Stream()
    with runtime.stream(s):
        x = runtime.to_device(np.arange(N, dtype=np.float32))
    out = runtime.zeros(N, np.float32)
    gate = threading.Event()
    runtime.launch(gate.wait, 10, stream=t)
    runtime.launch(_copy, out, runtime.read_only(x), stream=t)
    runtime.record_stream(x, t)
    runtime.record_stream(x, s)                 # its own stream: nothing more to keep
    addr = x.ptr.addr
    x.free()
    with runtime.stream(s):
        y = runtime.empty(N, np.float32)
    assert y.ptr.addr != addr                   # t may still read it: s may not have it either
    gate.set()
    t.synchronize()
    np.testing.assert_array_equal(out.to_host(t), np.arange(N, dtype=np.float32))


def test_record_stream_checks_its_arguments(device):
    x = runtime.zeros(N)
    with pytest.raises(errors.InvalidParamError, match="expected a runtime.Stream"):
        runtime.record_stream(x, "stream")
    runtime.record_stream(runtime.empty(0), runtime.Stream())    # no memory: nothing to keep
    x.free()
    with pytest.raises(errors.MemoryAccessError, match="use after free"):
        runtime.record_stream(x, runtime.Stream())


def test_a_recorded_stream_makes_the_free_no_race_for_the_stream_check(device):
    runtime.enable_stream_check("raise")
    try:
        s, t = runtime.Stream(), runtime.Stream()
        with runtime.stream(s):
            x = runtime.zeros(N)
            y = runtime.zeros(N)
        runtime.synchronize()
        runtime.launch(_fill, x, 1.0, stream=t)
        runtime.launch(_fill, y, 1.0, stream=t)
        runtime.record_stream(x, t)
        x.free()                                # the pool waits for t: no race
        with pytest.raises(errors.StreamRaceError, match="free"):
            y.free()                            # nothing waits for t: a race
        t.synchronize()
        y.free()
    finally:
        runtime.enable_stream_check("off")


@pytest.mark.parametrize("call", ["memcpy_async", "memset_async"])
def test_async_copies_follow_the_same_rule(device, call):
    """Queued on the buffer's stream before its free: done; on another stream: use after free
    when it runs (the memory may belong to someone else by then)."""
    s, t = runtime.Stream(), runtime.Stream()
    results = []
    for q in (s, t):
        with runtime.stream(s):
            p = runtime.malloc(4096)
        gate = threading.Event()
        runtime.launch(gate.wait, 10, stream=q)
        host = runtime.malloc_host(4096)
        if call == "memcpy_async":
            runtime.memcpy_async(host, p, 4096, stream=q)
        else:
            runtime.memset_async(p, 1, 4096, stream=q)
        runtime.free(p)
        gate.set()
        try:
            q.synchronize()
            results.append("ran")
        except errors.TaskError as e:
            assert isinstance(e.__cause__, errors.MemoryAccessError)
            results.append("use after free" if "use after free" in str(e) else str(e))
    assert results == ["ran", "use after free"]
