"""The stream sanitizer (runtime/sanitizer.py): every access-kind pair, ordered five ways, gives no
report; unordered, a StreamRaceError naming both tasks, both streams and both enqueue lines.
Views by byte range, frees, host-synchronous calls, warn mode, the knob and bounded memory."""
from __future__ import annotations

import gc
import inspect
import itertools
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import runtime
from runtime import config, sanitizer
from runtime.errors import StreamRaceError

HERE = os.path.abspath(__file__)


@pytest.fixture
def check(device):
    runtime.enable_stream_check("raise")
    yield
    runtime.enable_stream_check("off")


def _noop(*_):
    pass


def _line() -> str:
    """``file:line`` of the caller: the site a report must name."""
    f = inspect.currentframe().f_back
    return f"{HERE}:{f.f_lineno}"


# Every way a task touches a buffer: (name, writes?, enqueue(stream, buf) -> the line it enqueued)
def _kernel_write(s, buf):
    runtime.launch(_noop, buf, stream=s); return _line()


def _kernel_read(s, buf):
    runtime.launch(_noop, runtime.read_only(buf), stream=s); return _line()


def _kernel_kw_read(s, buf):
    runtime.launch(_noop, stream=s, reads=[buf]); return _line()


def _copy_read(s, buf):
    runtime.memcpy_async(np.empty(buf.nbytes, np.uint8), buf, buf.nbytes, stream=s); return _line()


def _copy_write(s, buf):
    runtime.memcpy_async(buf, np.zeros(buf.nbytes, np.uint8), buf.nbytes, stream=s); return _line()


def _d2d_write(s, buf):
    runtime.memcpy_async(buf, _scratch(), buf.nbytes, stream=s); return _line()


def _memset_write(s, buf):
    runtime.memset_async(buf, 0, buf.nbytes, stream=s); return _line()


def _callback_read(s, buf):
    runtime.launch_callback(_noop, stream=s, reads=[buf]); return _line()


def _callback_write(s, buf):
    runtime.launch_callback(_noop, stream=s, writes=[buf]); return _line()


def _async_h2d_write(s, buf):
    buf.copy_from_host(np.ones(buf.shape, buf.dtype), stream=s); return _line()


_SCRATCH: list = []


def _scratch():
    return _SCRATCH[-1]


KINDS = {"kernel_write": (True, _kernel_write), "kernel_read": (False, _kernel_read),
         "kernel_reads_kw": (False, _kernel_kw_read), "copy_src": (False, _copy_read),
         "copy_dst": (True, _copy_write), "d2d_dst": (True, _d2d_write),
         "memset": (True, _memset_write), "callback_read": (False, _callback_read),
         "callback_write": (True, _callback_write), "copy_from_host": (True, _async_h2d_write)}
CONFLICTS = [(a, b) for a, b in itertools.product(KINDS, KINDS) if KINDS[a][0] or KINDS[b][0]]
READ_PAIRS = [(a, b) for a, b in itertools.product(KINDS, KINDS) if not (KINDS[a][0] or KINDS[b][0])]


def _order_event(s1, s2, other):
    s2.wait_event(s1.record_event())


def _order_wait_stream(s1, s2, other):
    s2.wait_stream(s1)


def _order_stream_sync(s1, s2, other):
    s1.synchronize()


def _order_event_sync(s1, s2, other):
    s1.record_event().synchronize()


def _order_device_sync(s1, s2, other):
    runtime.synchronize()


def _order_event_query(s1, s2, other):
    ev, deadline = s1.record_event(), time.monotonic() + 30
    while not ev.query():           # a True query orders the host after the event, as a sync
        assert time.monotonic() < deadline, "the first task did not finish in 30 s"
        time.sleep(0.0005)


def _order_host_call(s1, s2, other):
    other.to_host(stream=s1)          # a host-synchronous call on s1 waits for s1's work


def _order_transitive(s1, s2, other):
    s3 = runtime.Stream(name="third")
    s3.wait_event(s1.record_event())
    s2.wait_stream(s3)


ORDERS = {"event": _order_event, "wait_stream": _order_wait_stream, "synchronize": _order_stream_sync,
          "event_synchronize": _order_event_sync, "device_synchronize": _order_device_sync, "event_query": _order_event_query,
          "host_call": _order_host_call, "third_stream": _order_transitive}


def _setup():
    buf = runtime.zeros(64)
    _SCRATCH.append(runtime.zeros(64))
    other = runtime.zeros(4)
    return buf, other, runtime.Stream(name="first"), runtime.Stream(name="second")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("first,second", CONFLICTS)
def test_ordered_pairs_give_no_report(check, first, second, order):
    buf, other, s1, s2 = _setup()
    KINDS[first][1](s1, buf)
    ORDERS[order](s1, s2, other)
    KINDS[second][1](s2, buf)
    runtime.synchronize()


@pytest.mark.parametrize("first,second", CONFLICTS)
def test_unordered_pairs_report_both_tasks(check, first, second):
    buf, _, s1, s2 = _setup()
    site1 = KINDS[first][1](s1, buf)
    issued = s2.issued
    with pytest.raises(StreamRaceError) as ei:
        KINDS[second][1](s2, buf)
    site2 = _line_of(KINDS[second][1])
    e = ei.value
    assert e.code == 507900
    assert (e.first_stream, e.second_stream) == ("first", "second")
    assert e.first_access == ("write" if KINDS[first][0] else "read")
    assert e.second_access == ("write" if KINDS[second][0] else "read")
    assert e.first_site.startswith(site1) and e.second_site.startswith(site2)
    assert (e.alloc_base, e.alloc_size, e.address, e.nbytes) == (buf.ptr.addr, 256, buf.ptr.addr, 256)
    assert e.alloc_site.startswith(f"{HERE}:")
    msg = str(e)
    for part in (f"'{e.first_task}' on first", f"'{e.second_task}' on second", site1, site2,
                 f"0x{buf.ptr.addr:x}", "256-byte allocation"):
        assert part in msg, (part, msg)
    assert s2.issued == issued        # raised before anything was queued
    runtime.synchronize()


def _line_of(fn) -> str:
    """The enqueue line of a KINDS function (its one statement's line)."""
    src, start = inspect.getsourcelines(fn)
    return f"{HERE}:{start + 1}"


@pytest.mark.parametrize("first,second", READ_PAIRS)
def test_reads_on_two_streams_do_not_race(check, first, second):
    buf, _, s1, s2 = _setup()
    KINDS[first][1](s1, buf)
    KINDS[second][1](s2, buf)
    runtime.synchronize()


def test_same_stream_is_ordered(check):
    buf, _, s1, _ = _setup()
    for kind in KINDS.values():
        kind[1](s1, buf)
    runtime.synchronize()


def test_partial_overlap_of_views_names_the_overlap(check):
    a = runtime.zeros(100, np.float32)
    s1, s2 = runtime.Stream(name="a"), runtime.Stream(name="b")
    runtime.launch(_noop, a[0:60], stream=s1, name="low")
    runtime.launch(_noop, a[80:100], stream=s2, name="disjoint")          # no overlap: fine
    with pytest.raises(StreamRaceError) as ei:
        runtime.launch(_noop, runtime.read_only(a[50:100]), stream=s2, name="high")
    e = ei.value
    assert (e.address, e.nbytes) == (a.ptr.addr + 200, 40)
    assert (e.first_task, e.second_task) == ("low", "high")
    assert "40 bytes at offset 200 of the 400-byte allocation" in str(e)
    # a DevicePtr with a byte count: exactly those bytes
    runtime.memset_async(a.ptr + 240, 0, 80, stream=s2)                   # bytes 240..320: b's
    with pytest.raises(StreamRaceError) as ei:
        runtime.memset_async(a.ptr + 236, 0, 8, stream=s1)                # 236..244 meets 240
    assert (ei.value.address, ei.value.nbytes) == (a.ptr.addr + 240, 4)
    runtime.synchronize()


def test_a_raised_race_records_nothing_and_the_work_can_be_fixed(check):
    a = runtime.zeros(16)
    s1, s2 = runtime.Stream(), runtime.Stream()
    runtime.launch(lambda x: x.fill(1.0), a, stream=s1)
    with pytest.raises(StreamRaceError):
        runtime.launch(_noop, runtime.read_only(a), stream=s2)
    s2.wait_event(s1.record_event())
    out = runtime.zeros(16)
    runtime.launch(np.copyto, out, runtime.read_only(a), stream=s2)
    assert (out.to_host(stream=s2) == 1.0).all()
    runtime.synchronize()


def test_read_only_argument_arrives_read_only(check):
    a = runtime.zeros(4)
    s = runtime.Stream()
    runtime.launch(lambda x: x.fill(2.0), runtime.read_only(a), stream=s)
    with pytest.raises(runtime.errors.TaskError, match="read-only"):
        s.synchronize()


def test_host_synchronous_calls_are_host_accesses(check):
    a = runtime.zeros(8)
    s1 = runtime.Stream(name="side")
    runtime.launch(lambda x: x.fill(3.0), a, stream=s1, name="fill")
    with pytest.raises(StreamRaceError) as ei:
        a.to_host()                     # on the default stream: nothing waits for "side"
    assert (ei.value.second_stream, ei.value.second_task) == ("the host", "to_host")
    with pytest.raises(StreamRaceError):
        runtime.memcpy(a, np.zeros(8, np.float32), 32)
    with pytest.raises(StreamRaceError):
        runtime.memset(a, 0, 32)
    assert (a.to_host(stream=s1) == 3.0).all()     # on "side": after the fill
    b = runtime.to_device(np.ones(8, np.float32))  # host write, then a kernel: ordered
    runtime.launch(_noop, b, stream=s1)
    runtime.synchronize()


def test_free_while_another_stream_uses_the_memory(check):
    a = runtime.zeros(1024)                       # allocated on the default stream
    side = runtime.Stream(name="side")
    runtime.launch(_noop, runtime.read_only(a), stream=side, name="reader")
    with pytest.raises(StreamRaceError) as ei:
        a.free()
    e = ei.value
    assert e.second_access == "free" and e.first_task == "reader" and e.first_stream == "side"
    assert "default stream.wait_stream(side)" in str(e)
    runtime.default_stream().wait_stream(side)  # the pool's reuse now follows the reader
    # npusim checks a task's buffers when it runs: the reader must run before the memory goes
    side.synchronize()
    a.free()                                        # the refused free left the array usable
    b = runtime.zeros(16)
    runtime.launch(_noop, b, stream=side)
    side.synchronize()
    b.free()                                        # after a synchronize: fine
    runtime.synchronize()


def test_free_by_the_garbage_collector_warns(check):
    side = runtime.Stream(name="side")
    a = runtime.zeros(256)
    def writer():
        pass
    runtime.launch_callback(writer, stream=side, writes=[a])   # holds no reference to ``a``
    with pytest.warns(RuntimeWarning, match="free by the garbage collector .* 'writer' on side"):
        del a
        gc.collect()
    assert sanitizer.stats(0)["allocations"] == 0
    runtime.synchronize()


def test_use_after_free_is_caught_at_the_enqueue(check):
    a = runtime.zeros(16)
    p = a.ptr
    a.free()
    with pytest.raises(runtime.errors.MemoryAccessError, match="use after free"):
        runtime.launch(_noop, p)


def test_warn_mode_reports_and_goes_on(device):
    runtime.enable_stream_check("warn")
    try:
        a = runtime.zeros(4)
        s1, s2 = runtime.Stream(name="x"), runtime.Stream(name="y")
        runtime.launch(_noop, a, stream=s1)
        with pytest.warns(RuntimeWarning, match="stream race: '_noop' on y writes 16 bytes"):
            runtime.launch(_noop, a, stream=s2)
        assert s2.issued == 1
        runtime.synchronize()
    finally:
        runtime.enable_stream_check("off")


def test_off_by_default_and_silent(device):
    assert not runtime.stream_check_enabled() and not sanitizer.on
    a = runtime.zeros(4)
    s1, s2 = runtime.Stream(), runtime.Stream()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime.launch(_noop, a, stream=s1)
        runtime.launch(_noop, a, stream=s2)
    runtime.synchronize()
    assert sanitizer.stats(0)["accesses"] == 0


def test_memory_is_bounded_by_live_allocations(check):
    a = runtime.zeros(1000)
    s1, s2 = runtime.Stream(), runtime.Stream()
    for i in range(200):
        runtime.launch(_noop, a, stream=s1)
        runtime.launch(_noop, runtime.read_only(a[i:i + 10]), stream=s1)
        runtime.launch(_noop, runtime.read_only(a), stream=s1)
    assert sanitizer.stats(0)["accesses"] == 2     # the last write and the last full read
    s2.wait_stream(s1)
    runtime.launch(_noop, a[0:500], stream=s2)
    assert sanitizer.stats(0)["accesses"] == 3     # both trimmed to the half not rewritten
    runtime.launch(_noop, a[500:1000], stream=s2)
    assert sanitizer.stats(0)["accesses"] == 2     # the two halves cover what they follow
    runtime.synchronize()                           # everything ordered: nothing to keep
    st = sanitizer.stats(0)
    assert (st["allocations"], st["accesses"]) == (0, 0)
    runtime.launch(_noop, a, stream=s1)
    s1.synchronize()
    a.free()
    assert sanitizer.stats(0)["allocations"] == 0


def test_enable_rejects_a_bad_mode():
    with pytest.raises(runtime.errors.InvalidParamError, match="mode='loud'"):
        runtime.enable_stream_check("loud")


def test_launch_rejects_bad_access_lists(device):
    with pytest.raises(runtime.errors.InvalidParamError, match=r"reads\[1\]=3"):
        runtime.launch(_noop, reads=[runtime.zeros(1), 3])
    with pytest.raises(runtime.errors.InvalidParamError, match="writes="):
        runtime.launch_callback(_noop, writes=runtime.zeros(1))
    with pytest.raises(runtime.errors.InvalidParamError, match="read_only"):
        runtime.read_only(np.zeros(3))


def test_the_knob(monkeypatch):
    for raw, mode in (("", "off"), ("0", "off"), ("1", "raise"), ("warn", "warn"), ("on", "raise")):
        monkeypatch.setenv("NPUSIM_STREAM_CHECK", raw)
        assert config.stream_check() == mode
    monkeypatch.setenv("NPUSIM_STREAM_CHECK", "2")
    with pytest.raises(ValueError, match="NPUSIM_STREAM_CHECK='2'"):
        config.stream_check()
    env = dict(os.environ, NPUSIM_STREAM_CHECK="1")
    out = subprocess.run([sys.executable, "-c", "import runtime; print(runtime.stream_check_enabled())"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr


def test_the_error_pickles():
    import pickle
    e = StreamRaceError("m", address=1, nbytes=2, first_task="a", second_task="b")
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.code, e2.address, e2.first_task, str(e2)) == (507900, 1, "a", "m")
