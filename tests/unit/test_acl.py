"""runtime.acl driven the way a pyACL script drives it: tuples, integer codes, int pointers."""
import logging
import threading

import numpy as np
import pytest

import runtime
from runtime import acl

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture
def acl_dev(monkeypatch):
    """acl initialized with device 0 (1 GiB) set; finalized afterwards whatever the test did."""
    monkeypatch.setenv("NPUSIM_HBM_BYTES", str(1 << 30))
    assert acl.init() == acl.ACL_SUCCESS
    assert acl.rt.set_device(0) == 0
    yield 0
    acl.finalize()
    try:
        runtime.reset_device(0)
    except Exception:
        pass


def test_constants_are_pyacl_values():
    assert (acl.ACL_MEMCPY_HOST_TO_HOST, acl.ACL_MEMCPY_HOST_TO_DEVICE,
            acl.ACL_MEMCPY_DEVICE_TO_HOST, acl.ACL_MEMCPY_DEVICE_TO_DEVICE) == (0, 1, 2, 3)
    assert (acl.ACL_MEM_MALLOC_HUGE_FIRST, acl.ACL_MEM_MALLOC_HUGE_ONLY,
            acl.ACL_MEM_MALLOC_NORMAL_ONLY) == (0, 1, 2)
    assert acl.ACL_SUCCESS == 0 and acl.ACL_ERROR_INVALID_PARAM == 100000
    assert acl.ACL_ERROR_RT_PARAM_INVALID == 107000 and acl.ACL_ERROR_RT_MEMORY_ALLOCATION == 207001


def test_init_twice_and_finalize_twice_return_codes(acl_dev):
    assert acl.init() == acl.ACL_ERROR_REPEAT_INITIALIZE == 100002
    assert acl.finalize() == 0
    assert acl.finalize() == acl.ACL_ERROR_REPEAT_FINALIZE == 100037
    assert acl.init() == 0


def test_tuple_returns(acl_dev):
    count, ret = acl.rt.get_device_count()
    assert (ret, count) == (0, runtime.device_count())
    assert acl.rt.get_device() == (0, 0)
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0 and isinstance(ctx, int) and ctx != 0
    assert acl.rt.get_context() == (ctx, 0)
    assert acl.rt.set_context(ctx) == 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0 and isinstance(stream, int) and stream != ctx
    free, total, ret = acl.rt.get_mem_info(acl.ACL_HBM_MEM)
    assert ret == 0 and total == 1 << 30 and 0 < free <= total
    assert acl.rt.get_run_mode() == (acl.ACL_HOST, 0)
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_context(ctx) == 0
    assert acl.rt.destroy_context(ctx) == acl.ACL_ERROR_RT_INVALID_HANDLE


def test_bad_device_id_is_a_code_not_an_exception(acl_dev):
    assert acl.rt.set_device(runtime.device_count()) == acl.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.set_device("0") == acl.ACL_ERROR_INVALID_PARAM
    ctx, ret = acl.rt.create_context(-1)
    assert (ctx, ret) == (0, acl.ACL_ERROR_RT_INVALID_DEVICEID)


@pytest.mark.parametrize("kind", [0, 1, 2, 3])
def test_memcpy_each_kind(acl_dev, kind):
    n = 4096
    src_np = np.random.default_rng(kind).integers(0, 255, n, dtype=np.uint8)
    dst_np = np.zeros(n, np.uint8)
    src_h, dst_h = acl.util.numpy_to_ptr(src_np), acl.util.numpy_to_ptr(dst_np)
    a, _ = acl.rt.malloc(n, 0)
    b, _ = acl.rt.malloc(n, 0)
    if kind == 0:
        assert acl.rt.memcpy(dst_h, n, src_h, n, 0) == 0
    elif kind == 1:
        assert acl.rt.memcpy(a, n, src_h, n, 1) == 0
        assert acl.rt.memcpy(dst_h, n, a, n, 2) == 0
    elif kind == 2:
        assert acl.rt.memcpy(a, n, src_h, n, 1) == 0
        assert acl.rt.memcpy(dst_h, n, a, n, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
    else:
        assert acl.rt.memcpy(a, n, src_h, n, 1) == 0
        assert acl.rt.memcpy(b, n, a, n, acl.ACL_MEMCPY_DEVICE_TO_DEVICE) == 0
        assert acl.rt.memcpy(dst_h, n, b, n, 2) == 0
    np.testing.assert_array_equal(dst_np, src_np)
    # the wrong kind for the pointers is refused, and nothing is written
    dst_np[:] = 0
    assert acl.rt.memcpy(dst_h, n, a, n, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 107000
    assert not dst_np.any()
    assert acl.rt.memcpy(dst_h, n, src_h, n, 9) == acl.ACL_ERROR_INVALID_PARAM


def test_interior_pointers_and_memset(acl_dev):
    p, _ = acl.rt.malloc(1024, acl.ACL_MEM_MALLOC_NORMAL_ONLY)
    assert acl.rt.memset(p, 1024, 0, 1024) == 0
    assert acl.rt.memset(p + 100, 924, 7, 24) == 0
    out = np.zeros(1024, np.uint8)
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(out) + 8, 1016, p + 96, 32, 2) == 0
    assert list(out[8:40]) == [0] * 4 + [7] * 24 + [0] * 4
    assert acl.rt.memset(p, 1024, 300, 1) == acl.ACL_ERROR_RT_PARAM_INVALID   # not a byte
    assert acl.rt.free(p + 8) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert "8 bytes into" in acl.get_recent_err_msg()
    assert acl.rt.free(p) == 0


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.texts = []

    def emit(self, record):
        self.texts.append(record.getMessage())


def test_bad_pointers_double_free_and_oversized_copies(acl_dev):
    p, ret = acl.rt.malloc(256, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    assert ret == 0
    host = np.zeros(1024, np.uint8)
    h = acl.util.numpy_to_ptr(host)
    rec = _Records()
    logging.getLogger("runtime.acl").addHandler(rec)
    try:
        # count beyond dest_max, and beyond the real buffer with a lying dest_max
        assert acl.rt.memcpy(p, 256, h, 512, 1) == acl.ACL_ERROR_INVALID_PARAM
        assert acl.rt.memcpy(p, 4096, h, 512, 1) == acl.ACL_ERROR_RT_PARAM_INVALID
        assert "overruns dst" in acl.get_recent_err_msg()
        # a pointer nobody allocated
        assert acl.rt.memcpy(p, 256, 0x1234, 16, 1) == acl.ACL_ERROR_RT_PARAM_INVALID
        assert "0x1234" in acl.get_recent_err_msg()
        assert acl.rt.free(0xdead0000) == acl.ACL_ERROR_RT_PARAM_INVALID
        assert acl.rt.free(p) == 0
        assert acl.rt.free(p) == acl.ACL_ERROR_RT_PARAM_INVALID
        assert "double free" in acl.get_recent_err_msg()
        assert acl.rt.memcpy(h, 256, p, 16, 2) == acl.ACL_ERROR_RT_PARAM_INVALID   # use after free
        # too big for the device: an allocation failure, the pool unchanged
        before = runtime.memory_allocated()
        q, ret = acl.rt.malloc(2 << 30, 0)
        assert (q, ret) == (0, acl.ACL_ERROR_RT_MEMORY_ALLOCATION)
        assert runtime.memory_allocated() == before
        assert acl.rt.malloc(1024, 7) == (0, acl.ACL_ERROR_INVALID_PARAM)
        assert acl.rt.malloc(0, 0)[1] == acl.ACL_ERROR_RT_PARAM_INVALID
    finally:
        logging.getLogger("runtime.acl").removeHandler(rec)
    texts = rec.texts
    assert any("aclrtFree failed, ret=107000" in t and "double free" in t for t in texts)
    assert any("aclrtMalloc failed, ret=207001" in t and "capacity" in t for t in texts)


def test_stream_used_after_destroy(acl_dev):
    s, _ = acl.rt.create_stream()
    p, _ = acl.rt.malloc(64, 0)
    host = np.ones(64, np.uint8)
    assert acl.rt.memcpy_async(p, 64, acl.util.numpy_to_ptr(host), 64, 1, s) == 0
    assert acl.rt.destroy_stream(s) == 0
    code = acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.memcpy_async(p, 64, acl.util.numpy_to_ptr(host), 64, 1, s) == code
    assert acl.rt.synchronize_stream(s) == code
    assert acl.rt.destroy_stream(s) == code
    ev, _ = acl.rt.create_event()
    assert acl.rt.record_event(ev, s) == code
    assert acl.rt.synchronize_stream(ev) == code      # an event is not a stream
    assert acl.rt.free(p) == 0


def test_async_copies_on_default_stream_zero_and_host_pointers(acl_dev):
    n = 1 * MiB
    src = np.random.default_rng(1).standard_normal(n // 4).astype(np.float32)
    pinned, ret = acl.rt.malloc_host(n)
    assert ret == 0
    pinned_view = acl.util.ptr_to_numpy(pinned, (n // 4,), np.float32)
    pinned_view[:] = src
    d, _ = acl.rt.malloc(n, 0)
    out = np.zeros_like(src)
    assert acl.rt.memcpy_async(d, n, pinned, n, 1, 0) == 0          # 0: default stream
    assert acl.rt.memcpy_async(acl.util.numpy_to_ptr(out), n, d, n, 2, 0) == 0
    assert acl.rt.synchronize_device() == 0
    np.testing.assert_array_equal(out, src)
    assert acl.util.ptr_to_bytes(pinned, 8) == src.tobytes()[:8]
    b = acl.util.bytes_to_ptr(b"\x05" * 16)
    assert acl.rt.memcpy(d, n, b, 16, 1) == 0
    back = np.zeros(16, np.uint8)
    assert acl.rt.memcpy(acl.util.numpy_to_ptr(back), 16, d, 16, 2) == 0
    assert list(back) == [5] * 16
    assert acl.rt.free_host(pinned) == 0
    assert acl.rt.free_host(pinned) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.memcpy(d, n, pinned, 16, 1) == acl.ACL_ERROR_RT_PARAM_INVALID
    with pytest.raises(ValueError, match="device memory"):
        acl.util.ptr_to_numpy(d, (4,), np.float32)


def test_events_order_streams_and_time_them(acl_dev):
    s1, _ = acl.rt.create_stream()
    s2, _ = acl.rt.create_stream()
    gate = threading.Event()
    order = []
    start, _ = acl.rt.create_event()
    ready, _ = acl.rt.create_event()
    stop, _ = acl.rt.create_event()
    assert acl.rt.record_event(start, s1) == 0
    # hold stream 1 until the test lets it go, via the runtime underneath
    runtime.launch_callback(lambda: (gate.wait(10), order.append("s1")),
                            stream=acl._lookup(s1, runtime.Stream, "stream"))
    assert acl.rt.record_event(ready, s1) == 0
    assert acl.rt.stream_wait_event(s2, ready) == 0
    runtime.launch_callback(lambda: order.append("s2"),
                            stream=acl._lookup(s2, runtime.Stream, "stream"))
    assert acl.rt.record_event(stop, s2) == 0
    assert acl.rt.query_event(stop) == (acl.ACL_EVENT_STATUS_NOT_READY, 0)
    assert acl.rt.query_event_status(stop) == (acl.ACL_EVENT_RECORDED_STATUS_NOT_READY, 0)
    ms, ret = acl.rt.event_elapsed_time(start, stop)
    assert (ms, ret) == (0.0, acl.ACL_ERROR_RT_EVENT_NOT_COMPLETE)
    assert acl.rt.synchronize_stream_with_timeout(s2, 50) == acl.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    gate.set()
    assert acl.rt.synchronize_event(stop) == 0
    assert order == ["s1", "s2"]
    assert acl.rt.query_event(stop) == (acl.ACL_EVENT_STATUS_COMPLETE, 0)
    assert acl.rt.query_event_status(stop) == (acl.ACL_EVENT_RECORDED_STATUS_COMPLETE, 0)
    ms, ret = acl.rt.event_elapsed_time(start, stop)
    assert ret == 0 and ms >= 0.0
    # an event without ACL_EVENT_TIME_LINE has no timestamps
    plain, _ = acl.rt.create_event_with_flag(acl.ACL_EVENT_SYNC)
    assert acl.rt.record_event(plain, s1) == 0 and acl.rt.synchronize_event(plain) == 0
    assert acl.rt.event_elapsed_time(plain, stop)[1] == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.destroy_event(plain) == 0
    assert acl.rt.query_event(plain) == (acl.ACL_EVENT_STATUS_NOT_READY,
                                         acl.ACL_ERROR_RT_INVALID_HANDLE)


def test_failed_task_is_the_synchronize_code(acl_dev):
    s, _ = acl.rt.create_stream()
    runtime.launch_callback(lambda: 1 / 0, stream=acl._lookup(s, runtime.Stream, "stream"))
    assert acl.rt.synchronize_stream(s) == acl.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "ZeroDivisionError" in acl.get_recent_err_msg() or "division" in acl.get_recent_err_msg()
    assert acl.rt.synchronize_stream(s) == 0      # raised once, then the stream runs again


def test_launch_callback_with_report_thread(acl_dev):
    s, _ = acl.rt.create_stream()
    assert acl.rt.launch_callback(print, None, 1, s) == acl.ACL_ERROR_RT_STREAM_NO_CB_REG
    seen = []
    state = {"run": True}

    def report_loop(args):
        acl.rt.set_device(0)
        while state["run"]:
            acl.rt.process_report(100)

    tid, ret = acl.util.start_thread(report_loop, [])
    assert ret == 0
    assert acl.rt.subscribe_report(tid, s) == 0
    assert acl.rt.subscribe_report(tid, s) == acl.ACL_ERROR_RT_STREAM_SUBSCRIBE
    for i in range(3):
        assert acl.rt.launch_callback(lambda d: seen.append((d, threading.get_ident())),
                                      i, acl.ACL_CALLBACK_BLOCK, s) == 0
    assert acl.rt.synchronize_stream(s) == 0
    assert seen == [(0, tid), (1, tid), (2, tid)]    # in order, on the subscribed thread
    assert acl.rt.unsubscribe_report(tid, s) == 0
    state["run"] = False
    assert acl.util.stop_thread(tid) == 0
    assert acl.rt.process_report(10) == acl.ACL_ERROR_RT_REPORT_TIMEOUT


def test_finalize_releases_everything(acl_dev):
    s, _ = acl.rt.create_stream()
    ev, _ = acl.rt.create_event()
    ptrs = [acl.rt.malloc(MiB, 0)[0] for _ in range(3)]
    h, _ = acl.rt.malloc_host(4096)
    assert acl.rt.memset_async(ptrs[0], MiB, 1, MiB, s) == 0
    assert acl.rt.record_event(ev, s) == 0
    assert runtime.memory_allocated(0) >= 3 * MiB
    assert acl.finalize() == 0
    # the device was reset: no context left, every handle and pointer is gone
    with pytest.raises(runtime.errors.ContextError):
        runtime.memory_allocated()
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    assert runtime.memory_allocated(0) == 0
    assert acl.rt.synchronize_stream(s) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.synchronize_event(ev) == acl.ACL_ERROR_RT_INVALID_HANDLE
    assert acl.rt.free(ptrs[0]) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.free_host(h) == acl.ACL_ERROR_RT_PARAM_INVALID


def test_seed_article_short_memcpy_form_and_namespaces(acl_dev):
    host = np.arange(256, dtype=np.float32)
    d, _ = acl.rt.malloc(1024, acl.rt.MemType.MEM_TYPE_NORMAL)
    assert acl.rt.memcpy(d, host.tobytes(), 1024, acl.rt.MemcpyKind.MEMCPY_HOST_TO_DEVICE) == 0
    assert acl.rt.synchronize() == 0
    out = np.zeros(256, np.float32)
    # the article copies into out.tobytes(): a read-only copy, refused with the reason
    assert acl.rt.memcpy(out.tobytes(), d, 1024, 2) == acl.ACL_ERROR_RT_PARAM_INVALID
    assert "numpy_to_ptr" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(out, d, 1024, 2) == 0
    np.testing.assert_array_equal(out, host)
