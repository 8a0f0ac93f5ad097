"""pyACL's names and calling convention over the npusim runtime: ``from runtime import acl``.

A pyACL script runs unchanged but for its import line: ``acl.init()``, ``acl.rt.*`` and
``acl.util.*`` as pyACL spells them. Values come back as ``(value, ret)`` tuples, calls that
return nothing else return ``ret``; a failure is an integer ACL return code (0 = ACL_SUCCESS),
never an exception, and the error's text goes to the ``runtime.acl`` logger (stderr, level from
ASCEND_GLOBAL_LOG_LEVEL), as CANN writes it to its log; ``acl.get_recent_err_msg()`` returns it.

Pointers are integers. Device pointers are the simulated device's addresses (``DevicePtr.addr``);
host pointers are real process addresses of buffers this module knows: ``acl.rt.malloc_host``,
``acl.util.numpy_to_ptr`` and ``acl.util.bytes_to_ptr``. A pointer inside a known buffer
(``ptr + offset``) works too. Streams, events and contexts are integer handles; stream 0 is the
current device's default stream. ``acl.finalize()`` destroys what the script left behind: its
streams, events and memory, and resets the devices it used.

Built only on the public runtime API; see docs/acl.md for the table of calls and codes.

The room: this package is the ``acl`` namespace itself (``acl.init``, ``acl.rt``, ``acl.media``,
``acl.mdl``); beside it ``codes`` (constants, return codes, the error -> code mapping),
``pointers`` (integer pointers, ``acl.util``), ``handles`` (the integer handle table),
``data`` (data buffers) and ``capture`` (``acl.mdl``'s graph capture). They import one way:
codes <- pointers <- handles <- capture, and this module over all. The old paths
``runtime.acl_codes``, ``acl_data``, ``acl_mdl`` and ``acl_ptr`` are aliases of these modules
(runtime/__init__.py's ``_MOVED``).
"""
from __future__ import annotations

import os
import queue
import threading
import time

from . import capture as _mdl
from . import codes as _c
from . import data as _d
from . import pointers as _p
from .codes import *  # noqa: F401,F403  (pyACL scripts use acl.ACL_* names)
from .codes import (AclError, fail, get_recent_err_msg, int_arg, log, returns_ret,
                    returns_values)
from .data import (create_data_buffer, destroy_data_buffer, get_data_buffer_addr,  # noqa: F401
                   get_data_buffer_size, get_data_buffer_size_v2)
from .handles import lock as _lock  # one lock for handles and pointers
from .handles import lookup as _lookup
from .handles import new as _new_handle
from .handles import stream_of
from .handles import table as _handles  # int handle -> _Context / Stream / Event
from .pointers import check_count, register_host, resolve, strong, util
from ..callsite import callsite

import runtime as _rt

_stream = stream_of     # the runtime.Stream of a pyACL stream handle (0: the default stream)
_state = {"initialized": False}
_devices_used: set = set()
_default_contexts: dict = {}        # device id -> handle of the context set_device implies
_current = threading.local()        # .context: the calling thread's current context handle
SOC_NAME = "Ascend910B1"            # what acl.get_soc_name reports (the simulated chip)


# ---------------------------------------------------------------------- acl.*
def init(config_path=None) -> int:
    """Initialize pyACL (aclInit); ``config_path`` is accepted and not read."""
    with _lock:
        if _state["initialized"]:
            return fail("aclInit", AclError(_c.ACL_ERROR_REPEAT_INITIALIZE,
                                            "already initialized; call acl.finalize first"))
        _state["initialized"] = True
    return _c.ACL_SUCCESS


def finalize() -> int:
    """Release everything acl calls created (streams, events, memory) and reset their devices."""
    with _lock:
        if not _state["initialized"]:
            return fail("aclFinalize", AclError(_c.ACL_ERROR_REPEAT_FINALIZE,
                                                "not initialized, or finalized already"))
        _state["initialized"] = False
        streams = [o for o in _handles.values() if isinstance(o, _rt.Stream)]
        ptrs = [g() for g, _ in _p.dev.items.values()]
        _handles.clear()
        _default_contexts.clear()
        _d.clear()
        _p.dev.clear()
        _p.host.clear()
        devices = sorted(_devices_used)
        _devices_used.clear()
        _reports.clear()
        _mdl.clear()
    for s in streams:
        try:
            s.destroy()
        except Exception as exc:     # a failed task must not stop the release of the rest
            log.warning("acl.finalize: destroying %s: %s", s.name, exc)
    for p in ptrs:
        try:
            _rt.free(p)
        except Exception:            # its device was reset already: the memory is gone anyway
            pass
    for d in devices:
        try:
            _rt.reset_device(d)
        except Exception as exc:
            log.warning("acl.finalize: resetting device %d: %s", d, exc)
    return _c.ACL_SUCCESS


_APP_LEVELS = {_c.ACL_DEBUG: 10, _c.ACL_INFO: 20, _c.ACL_WARNING: 30, _c.ACL_ERROR: 40}


def app_log(log_level, message) -> None:
    """aclAppLog: write ``message`` to the application log (the ``runtime.acl`` logger, shown
    from ASCEND_GLOBAL_LOG_LEVEL up) with the caller's file:line, as CANN does."""
    level = _APP_LEVELS.get(log_level)
    if level is None:
        fail("aclAppLog", AclError(_c.ACL_ERROR_INVALID_PARAM,
                                   f"log_level={log_level!r} is not ACL_DEBUG 0, ACL_INFO 1, "
                                   "ACL_WARNING 2 or ACL_ERROR 3"))
        return
    log.log(level, "[%s] %s", callsite(2), message)


def get_soc_name() -> str:
    """aclrtGetSocName: the simulated chip's name (``SOC_NAME``)."""
    return SOC_NAME


# ---------------------------------------------------------------------- acl.rt: devices, contexts
class _Context:
    __slots__ = ("device_id",)

    def __init__(self, device_id: int):
        self.device_id = device_id


def _set_device(device_id) -> None:
    d = int_arg("device_id", device_id)
    if not 0 <= d < _rt.device_count():
        raise AclError(_c.ACL_ERROR_RT_INVALID_DEVICEID,
                       f"device_id={d} is out of range: valid ids are 0..{_rt.device_count() - 1}"
                       " (NPUSIM_DEVICE_COUNT)")
    _rt.set_device(d)
    with _lock:
        _devices_used.add(d)
        if d not in _default_contexts:          # aclrtSetDevice makes the default context
            _default_contexts[d] = _new_handle(_Context(d))
        _current.context = _default_contexts[d]


def _malloc(size, policy) -> int:
    """A device pointer of ``size`` bytes from the caching pool (raises AclError)."""
    n = int_arg("size", size)
    pol = int_arg("policy", policy)
    if pol not in (0, 1, 2):
        raise AclError(_c.ACL_ERROR_INVALID_PARAM,
                       f"policy={pol} is not an aclrtMemMallocPolicy (0 HUGE_FIRST, "
                       "1 HUGE_ONLY, 2 NORMAL_ONLY)")
    p = _rt.malloc(n, _rt.MemMallocPolicy(pol))
    with _lock:
        _p.dev.add(p.addr, strong(p), n)
        _devices_used.add(p.device_id)
    return p.addr


def _free(dev_ptr) -> None:
    """Free a pointer acl.rt.malloc / acl.media.dvpp_malloc returned (raises AclError)."""
    addr = int_arg("dev_ptr", dev_ptr)
    with _lock:
        found = _p.dev.find(addr)
        if found is None:
            raise AclError(_c.ACL_ERROR_RT_PARAM_INVALID,
                           f"dev_ptr=0x{addr:x}: double free or invalid pointer: no live "
                           "acl.rt.malloc allocation holds it")
        start, p, _ = found
        if start != addr:
            raise AclError(_c.ACL_ERROR_RT_PARAM_INVALID,
                           f"dev_ptr=0x{addr:x} is {addr - start} bytes into its allocation; "
                           "free the pointer acl.rt.malloc returned")
        _rt.free(p)
        _p.dev.pop(start)


class _Rt:
    """``acl.rt``: devices, contexts, streams, events, memory and callbacks."""

    MemcpyKind = type("MemcpyKind", (), {  # the spelling of a seed article's sample
        "MEMCPY_HOST_TO_HOST": 0, "MEMCPY_HOST_TO_DEVICE": 1, "MEMCPY_DEVICE_TO_HOST": 2,
        "MEMCPY_DEVICE_TO_DEVICE": 3, "MEMCPY_DEFAULT": 4})
    MemType = type("MemType", (), {"MEM_TYPE_HUGE_FIRST": 0, "MEM_TYPE_HUGE_ONLY": 1,
                                   "MEM_TYPE_NORMAL": 2})

    @returns_ret("aclrtSetDevice")
    def set_device(device_id):
        """Bind the calling thread to device ``device_id`` (creating its context on first use)."""
        _set_device(device_id)

    @returns_ret("aclrtResetDevice")
    def reset_device(device_id):
        """Wait for the device's work, destroy its streams and events, release its memory."""
        d = int_arg("device_id", device_id)
        with _lock:
            for h, o in list(_handles.items()):
                if isinstance(o, _rt.Stream) and o.device_id == d:
                    del _handles[h]
            for start, (g, _) in list(_p.dev.items.items()):
                if g().device_id == d:
                    _p.dev.pop(start)
            for s in [s for s in _reports if s.device_id == d]:
                del _reports[s]
            _devices_used.discard(d)
        _rt.reset_device(d)

    @returns_values("aclrtGetDeviceCount", 0)
    def get_device_count():
        """(number of simulated NPUs, ret)."""
        return _rt.device_count()

    @returns_values("aclrtGetDevice", -1)
    def get_device():
        """(the calling thread's device id, ret)."""
        return _rt.get_device()

    @returns_values("aclrtGetRunMode", -1)
    def get_run_mode():
        """(ACL_HOST, ret): the script runs on the host, as with a real NPU card."""
        return _c.ACL_HOST

    @returns_values("aclrtCreateContext", 0)
    def create_context(device_id):
        """(context, ret): a context on ``device_id``, made current for the calling thread."""
        _set_device(device_id)
        with _lock:
            h = _current.context = _new_handle(_Context(int(device_id)))
            return h

    @returns_ret("aclrtDestroyContext")
    def destroy_context(context):
        """Destroy a context handle (the device's memory stays until reset_device / finalize)."""
        with _lock:
            _lookup(context, _Context, "context")
            del _handles[context]
            if getattr(_current, "context", None) == context:
                _current.context = None

    @returns_ret("aclrtSetCurrentContext")
    def set_context(context):
        """Make ``context`` (its device) current for the calling thread."""
        with _lock:
            ctx = _lookup(context, _Context, "context")
        _rt.set_device(ctx.device_id)
        _current.context = context

    @returns_values("aclrtGetCurrentContext", 0)
    def get_context():
        """(the calling thread's current context, ret): contexts are per thread, as in CANN;
        set_device, create_context and set_context make one current."""
        h = getattr(_current, "context", None)
        with _lock:
            if h is not None and h in _handles:
                return h
        raise AclError(_c.ACL_ERROR_RT_CONTEXT_NULL,
                       f"thread {threading.current_thread().name!r} has no current context: call "
                       "acl.rt.set_device, acl.rt.create_context or acl.rt.set_context in it first")

    @returns_ret("aclrtSynchronizeDevice")
    def synchronize_device():
        """Wait for every stream of the current device."""
        _rt.synchronize()

    synchronize = synchronize_device   # a seed article's spelling

    @returns_values("aclrtGetMemInfo", 0, 0)
    def get_mem_info(attr=_c.ACL_HBM_MEM):
        """(free bytes, total bytes, ret) of the current device's card. aclrtFree gives memory
        back to the device at once, so memory this process's pool only caches counts as free
        here (unlike runtime.get_mem_info, which reports the pool's reservation as torch_npu
        does); what the other processes on the card reserve counts as used (runtime/card.py)."""
        a = int_arg("attr", attr)
        if not 0 <= a <= _c.ACL_HBM_MEM_NORMAL:
            raise AclError(_c.ACL_ERROR_INVALID_PARAM, f"attr={a} is not an aclrtMemAttr (0..5)")
        _, total = _rt.get_mem_info()
        others = sum(h.reserved for h in _rt.memory.card_holders())
        return max(total - _rt.memory_allocated() - others, 0), total

    # ------------------------------------------------------------------ streams
    @returns_values("aclrtCreateStream", 0)
    def create_stream():
        """(stream, ret): a new stream on the current device."""
        s = _rt.Stream()
        with _lock:
            return _new_handle(s)

    @returns_ret("aclrtDestroyStream")
    def destroy_stream(stream):
        """Finish the stream's work and destroy it; the handle is invalid afterwards."""
        with _lock:
            s = _lookup(stream, _rt.Stream, "stream")
            del _handles[stream]
        s.destroy()

    @returns_ret("aclrtSynchronizeStream")
    def synchronize_stream(stream):
        """Wait for the work enqueued on ``stream`` (a failed task returns its error code)."""
        _stream(stream).synchronize()

    @returns_ret("aclrtSynchronizeStreamWithTimeout")
    def synchronize_stream_with_timeout(stream, timeout):
        """Like synchronize_stream, giving up after ``timeout`` ms (-1: wait forever): 507046."""
        t = int_arg("timeout", timeout)
        _stream(stream).synchronize(None if t < 0 else t / 1000.0)

    # ------------------------------------------------------------------ memory
    @returns_values("aclrtMalloc", 0)
    def malloc(size, policy=_c.ACL_MEM_MALLOC_HUGE_FIRST):
        """(device pointer, ret): ``size`` bytes from the device's caching pool."""
        return _malloc(size, policy)

    @returns_ret("aclrtFree")
    def free(dev_ptr):
        """Return ``dev_ptr`` (a pointer acl.rt.malloc returned) to the pool."""
        _free(dev_ptr)

    @returns_values("aclrtMallocHost", 0)
    def malloc_host(size):
        """(host pointer, ret): a pinned host buffer usable for async copies."""
        buf = _rt.malloc_host(int_arg("size", size))
        return register_host(buf, pinned=True)

    @returns_ret("aclrtFreeHost")
    def free_host(host_ptr):
        """Release a buffer acl.rt.malloc_host returned."""
        addr = int_arg("host_ptr", host_ptr)
        with _lock:
            item = _p.host.items.get(addr)
            buf = item[0]() if item else None
            if not isinstance(buf, _rt.HostBuffer):
                raise AclError(_c.ACL_ERROR_RT_PARAM_INVALID,
                               f"host_ptr=0x{addr:x}: double free or not a pointer "
                               "acl.rt.malloc_host returned")
            _p.host.pop(addr)
        _rt.free_host(buf)

    @returns_ret("aclrtMemcpy")
    def memcpy(*args):
        """memcpy(dst, dest_max, src, count, kind): copy after the current stream's work.

        The 4-argument form ``memcpy(dst, src, count, kind)`` of a seed article is accepted too.
        """
        dst, dest_max, src, count, kind = _copy_args("memcpy", args, 5)
        n = check_count(count, dest_max, "dest_max")
        _rt.memcpy(resolve(dst, "dst"), resolve(src, "src"), n, _kind(kind))

    @returns_ret("aclrtMemcpyAsync")
    def memcpy_async(*args):
        """memcpy_async(dst, dest_max, src, count, kind, stream): enqueue a copy; returns at once."""
        dst, dest_max, src, count, kind, stream = _copy_args("memcpy_async", args, 6)
        n = check_count(count, dest_max, "dest_max")
        _rt.memcpy_async(resolve(dst, "dst"), resolve(src, "src"), n, _kind(kind),
                         stream=_stream(stream))

    @returns_ret("aclrtMemset")
    def memset(dev_ptr, max_count, value, count):
        """Set ``count`` bytes at ``dev_ptr`` to ``value`` after the current stream's work."""
        n = check_count(count, max_count, "max_count")
        _rt.memset(resolve(dev_ptr, "dev_ptr"), int_arg("value", value), n)

    @returns_ret("aclrtMemsetAsync")
    def memset_async(dev_ptr, max_count, value, count, stream):
        """Enqueue a memset on ``stream``; returns at once."""
        n = check_count(count, max_count, "max_count")
        _rt.memset_async(resolve(dev_ptr, "dev_ptr"), int_arg("value", value), n,
                         stream=_stream(stream))

    # ------------------------------------------------------------------ events
    @returns_values("aclrtCreateEvent", 0)
    def create_event():
        """(event, ret): an event that records timestamps (for event_elapsed_time)."""
        with _lock:
            return _new_handle(_rt.Event(enable_timing=True))

    @returns_values("aclrtCreateEventWithFlag", 0)
    def create_event_with_flag(flag):
        """(event, ret): timestamps only with ACL_EVENT_TIME_LINE in ``flag``."""
        f = int_arg("flag", flag)
        with _lock:
            return _new_handle(_rt.Event(enable_timing=bool(f & _c.ACL_EVENT_TIME_LINE)))

    @returns_ret("aclrtDestroyEvent")
    def destroy_event(event):
        """Destroy an event handle."""
        with _lock:
            _lookup(event, _rt.Event, "event")
            del _handles[event]

    @returns_ret("aclrtRecordEvent")
    def record_event(event, stream):
        """Capture the work enqueued on ``stream`` so far in ``event``."""
        _lookup(event, _rt.Event, "event").record(_stream(stream))

    @returns_ret("aclrtResetEvent")
    def reset_event(event, stream):
        """Return ``event`` to the never-recorded (complete) state."""
        ev = _lookup(event, _rt.Event, "event")
        _stream(stream)
        with _lock:
            _handles[event] = _rt.Event(enable_timing=ev.enable_timing)

    @returns_ret("aclrtStreamWaitEvent")
    def stream_wait_event(stream, event):
        """Make later work on ``stream`` wait until ``event`` completes."""
        _stream(stream).wait_event(_lookup(event, _rt.Event, "event"))

    @returns_ret("aclrtSynchronizeEvent")
    def synchronize_event(event):
        """Wait until the work captured by ``event`` has finished."""
        _lookup(event, _rt.Event, "event").synchronize()

    @returns_values("aclrtQueryEvent", _c.ACL_EVENT_STATUS_NOT_READY)
    def query_event(event):
        """(ACL_EVENT_STATUS_COMPLETE 0 / ACL_EVENT_STATUS_NOT_READY 1, ret)."""
        done = _lookup(event, _rt.Event, "event").query()
        return _c.ACL_EVENT_STATUS_COMPLETE if done else _c.ACL_EVENT_STATUS_NOT_READY

    @returns_values("aclrtQueryEventStatus", _c.ACL_EVENT_RECORDED_STATUS_NOT_READY)
    def query_event_status(event):
        """(ACL_EVENT_RECORDED_STATUS_COMPLETE 1 / ..._NOT_READY 0, ret)."""
        done = _lookup(event, _rt.Event, "event").query()
        return (_c.ACL_EVENT_RECORDED_STATUS_COMPLETE if done
                else _c.ACL_EVENT_RECORDED_STATUS_NOT_READY)

    @returns_values("aclrtEventElapsedTime", 0.0)
    def event_elapsed_time(start, end):
        """(milliseconds between two completed events, ret)."""
        s, e = _lookup(start, _rt.Event, "event"), _lookup(end, _rt.Event, "event")
        for name, ev in (("start", s), ("end", e)):
            if not ev.query():
                raise AclError(_c.ACL_ERROR_RT_EVENT_NOT_COMPLETE,
                               f"event_elapsed_time: the {name} event has not completed yet; "
                               "synchronize it (or its stream) first")
        return float(s.elapsed_time(e))

    # ------------------------------------------------------------------ callbacks
    @returns_ret("aclrtSubscribeReport")
    def subscribe_report(thread_id, stream):
        """Route ``stream``'s callbacks to thread ``thread_id``, which calls process_report."""
        tid = int_arg("thread_id", thread_id)
        s = _stream(stream)
        with _lock:
            if s in _reports:
                raise AclError(_c.ACL_ERROR_RT_STREAM_SUBSCRIBE,
                               f"{s.name} is already subscribed to thread {_reports[s]}")
            _reports[s] = tid
            _report_queues.setdefault(tid, queue.Queue())

    @returns_ret("aclrtUnSubscribeReport")
    def unsubscribe_report(thread_id, stream):
        """Stop routing ``stream``'s callbacks to ``thread_id``."""
        tid = int_arg("thread_id", thread_id)
        s = _stream(stream)
        with _lock:
            if _reports.get(s) != tid:
                raise AclError(_c.ACL_ERROR_RT_STREAM_SUBSCRIBE,
                               f"{s.name} is not subscribed to thread {tid}")
            del _reports[s]

    @returns_ret("aclrtLaunchCallback")
    def launch_callback(fn, user_data, block_type, stream):
        """Enqueue ``fn(user_data)`` on ``stream``; the subscribed thread runs it in process_report.

        With ACL_CALLBACK_BLOCK the stream waits until the callback has run.
        """
        if not callable(fn):
            raise AclError(_c.ACL_ERROR_INVALID_PARAM, f"fn={fn!r} is not callable")
        block = int_arg("block_type", block_type)
        s = _stream(stream)
        with _lock:
            tid = _reports.get(s)
            if tid is None:
                raise AclError(_c.ACL_ERROR_RT_STREAM_NO_CB_REG,
                               f"{s.name} has no report thread: call acl.rt.subscribe_report"
                               "(thread_id, stream) first")
            q = _report_queues[tid]

        def deliver():
            done = threading.Event()
            q.put((fn, user_data, done))
            while block == _c.ACL_CALLBACK_BLOCK and not done.wait(0.5):
                alive = any(t.ident == tid for t in threading.enumerate())
                if _reports.get(s) != tid or not alive:     # nobody will ever run it
                    raise AclError(_c.ACL_ERROR_RT_STREAM_NO_CB_REG,
                                   f"callback {fn!r} on {s.name}: its report thread "
                                   f"{tid} unsubscribed or exited before running it")
        _rt.launch_callback(deliver, stream=s)

    @returns_ret("aclrtProcessReport")
    def process_report(timeout):
        """Run one callback routed to the calling thread, waiting up to ``timeout`` ms (-1: forever).

        Returns ACL_ERROR_RT_REPORT_TIMEOUT (507012) when none arrived in time.
        """
        t = int_arg("timeout", timeout)
        with _lock:
            q = _report_queues.setdefault(threading.get_ident(), queue.Queue())
        deadline = None if t < 0 else time.monotonic() + t / 1000.0
        while True:     # 1 s slices: a -1 (forever) wait stays interruptible
            left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            try:
                fn, user_data, done = q.get(timeout=max(left, 0))
                break
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise AclError(_c.ACL_ERROR_RT_REPORT_TIMEOUT,
                                   f"process_report: no callback within {t} ms") from None
        try:
            fn(user_data)
        finally:
            done.set()


_reports: dict = {}                 # Stream -> subscribed thread id
_report_queues: dict = {}           # thread id -> queue of (fn, user_data, done)


def _copy_args(api: str, args: tuple, full: int) -> tuple:
    if len(args) == full:
        return args
    if len(args) == full - 1:       # no dest_max: the seed article's short form
        return (args[0], args[2], args[1], *args[2:])
    raise AclError(_c.ACL_ERROR_INVALID_PARAM,
                   f"acl.rt.{api} takes {full} arguments (dst, dest_max, src, count, kind"
                   f"{', stream' if full == 6 else ''}), got {len(args)}")


def _kind(kind) -> "_rt.MemcpyKind":
    k = int_arg("kind", kind)
    if not 0 <= k <= 4:
        raise AclError(_c.ACL_ERROR_INVALID_PARAM,
                       f"kind={k} is not an aclrtMemcpyKind (0 HOST_TO_HOST, 1 HOST_TO_DEVICE, "
                       "2 DEVICE_TO_HOST, 3 DEVICE_TO_DEVICE, 4 DEFAULT)")
    return _rt.MemcpyKind(k)


class _Media:
    """``acl.media``: DVPP memory. The simulator has no separate media pool: it is device
    memory from the same caching pool as acl.rt.malloc."""

    @returns_values("acldvppMalloc", 0)
    def dvpp_malloc(size):
        """(device pointer, ret): ``size`` bytes of device memory."""
        return _malloc(size, _c.ACL_MEM_MALLOC_HUGE_FIRST)

    @returns_ret("acldvppFree")
    def dvpp_free(dev_ptr):
        """Free memory dvpp_malloc returned."""
        _free(dev_ptr)


rt = _Rt        # namespaces: their functions are called through the class, unbound
media = _Media
mdl = _mdl.mdl

