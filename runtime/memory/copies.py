"""Copies and memsets (aclrtMemcpy / aclrtMemcpyAsync / aclrtMemset ...), host-synchronous or
enqueued on a stream.

Every call validates before it changes anything: a copy that would overrun either buffer raises
at the call. An enqueued copy checks again, when it runs, that its device buffers are still its
own (``_still_live``: live, or freed behind it on its stream).
"""
from __future__ import annotations

from functools import partial

import numpy as np

from .. import hooks
from ..callsite import callsite
from ..current import current_stream, resolve_stream
from ..errors import InvalidParamError, MemoryAccessError
from .pointers import (DEVICE_TYPES, DevicePtr, HostBuffer, MemcpyKind, check_size, device_region,
                       host_region, host_view)

_KINDS = tuple(MemcpyKind)
_COPY_NAMES = {k: "memcpy " + k.name for k in MemcpyKind}


def _resolve_copy(dst, src, nbytes, kind, name="memcpy"):
    """(dst view, src view, actual MemcpyKind) of a copy of ``nbytes``, every argument checked."""
    n = nbytes if type(nbytes) is int and nbytes >= 0 else check_size(nbytes)
    dd, sd = isinstance(dst, DEVICE_TYPES), isinstance(src, DEVICE_TYPES)
    actual = _KINDS[2 * sd + dd]
    if kind is not MemcpyKind.DEFAULT and kind is not actual:
        _check_kind(kind, actual, dd, sd, name)
    dst_view = host_view(dst, name="dst") if dd else host_region(dst, "dst", writable=True)
    src_view = host_view(src, name="src") if sd else host_region(src, "src", writable=False)
    if n > dst_view.nbytes:
        raise MemoryAccessError(f"{name}: copy of {n} bytes overruns dst: only {dst_view.nbytes} "
                                "bytes are available there")
    if n > src_view.nbytes:
        raise MemoryAccessError(f"{name}: copy of {n} bytes overruns src: only {src_view.nbytes} "
                                "bytes are available there")
    if n != dst_view.nbytes:
        dst_view = dst_view[:n]
    if n != src_view.nbytes:
        src_view = src_view[:n]
    return dst_view, src_view, actual


def _check_kind(kind, actual: MemcpyKind, dd: bool, sd: bool, name: str) -> None:
    """Raise InvalidParamError unless ``kind`` is DEFAULT or names the ``actual`` direction."""
    if isinstance(kind, bool) or kind not in _KINDS:
        raise InvalidParamError(f"{name}: kind={kind!r} is not a MemcpyKind "
                                f"({', '.join(k.name for k in MemcpyKind)})")
    if kind != 4 and kind != actual:
        raise InvalidParamError(f"{name}: kind={MemcpyKind(kind).name} but dst is {'device' if dd else 'host'} "
                                f"and src is {'device' if sd else 'host'} memory ({actual.name})")


def run_sync(s, name: str, category: str, site: str | None, nbytes: int, fn, *args) -> None:
    """Run ``fn(*args)`` after the work enqueued on ``s``; return when it is done.

    On an idle stream ``fn`` runs inline (after raising the stream's pending task error, as
    synchronize would; timed when the profiler is on); otherwise it is enqueued and waited for.
    """
    cap = hooks.capture
    if cap is not None:
        cap.refuse(f"a host-synchronous {name}")
    prof = hooks.profiler
    if s.idle() and prof is None:       # the common case: nothing to wait for or report
        fn(*args)
        return
    if args:
        fn = partial(fn, *args)
    meta = {"bytes": nbytes}
    if s.query():
        s.synchronize()
        t0 = prof.now_us() if prof is not None else 0.0
        fn()
        if prof is not None:
            prof.record(s.id, name, category, t0, prof.now_us(), meta, site or callsite(3))
        return
    s.enqueue(fn, name, category, meta, site or callsite(3))
    s.synchronize()


def memcpy(dst, src, nbytes: int, kind: MemcpyKind = MemcpyKind.DEFAULT) -> None:
    """Copy ``nbytes`` from ``src`` to ``dst`` after the current stream's work; return when done."""
    d, s_, k = _resolve_copy(dst, src, nbytes, kind)
    s = current_stream()
    chk = hooks.stream_check
    if chk is not None:
        chk.host_access(s, _COPY_NAMES[k], callsite(2), *_copy_access(dst, src, d.nbytes))
    run_sync(s, _COPY_NAMES[k], "copy", None, d.nbytes, np.copyto, d, s_)


def memcpy_async(dst, src, nbytes: int, kind: MemcpyKind = MemcpyKind.DEFAULT, stream=None) -> None:
    """Enqueue a copy of ``nbytes`` on ``stream``; returns at once.

    A pageable (non-``malloc_host``) host source is staged at the call, as a real driver does, so the
    caller may reuse it immediately; a host destination must stay alive until the stream completes.
    """
    s = resolve_stream(stream)
    d, s_, k = _resolve_copy(dst, src, nbytes, kind, "memcpy_async")
    if not isinstance(src, (*DEVICE_TYPES, HostBuffer)):
        s_ = s_.copy()
    site = callsite(2)
    chk = hooks.stream_check
    if chk is not None:
        chk.access(s, "memcpy_async " + k.name, site, *_copy_access(dst, src, d.nbytes))
    s.enqueue(_still_live(partial(np.copyto, d, s_), dst, src), "memcpy_async " + k.name,
              "copy", {"bytes": int(d.nbytes)}, site)


def _still_live(fn, *bufs):
    """``fn`` as a task that first checks that its device buffers among ``bufs`` (validated at
    the call) are still its own: live, or freed behind it on its stream (stream-ordered frees).
    A free it was not ordered before raises use after free instead of touching memory the pool
    may have given away. Costs one generation test per buffer. The task keeps ``bufs`` alive, as
    a kernel's task keeps its arguments: a temporary array is not collected under it."""
    ptrs = tuple(p for p in (b if type(b) is DevicePtr else b.device_ptr("buf")
                             for b in bufs if isinstance(b, DEVICE_TYPES)) if p is not None)
    if not ptrs:
        return fn

    def task():
        for p in ptrs:
            if p._block.gen != p._gen:
                device_region(p, "buf")     # raises unless queued before the free
        fn()
    task.bufs = bufs    # the arrays live until the task ran: a collected one is no misuse
    return task


def _copy_access(dst, src, n: int) -> tuple:
    """(reads, writes) of a copy of ``n`` bytes, for the stream sanitizer: its device buffers."""
    reads = [(src, n)] if isinstance(src, DEVICE_TYPES) and n else []
    writes = [(dst, n)] if isinstance(dst, DEVICE_TYPES) and n else []
    return reads, writes


def _memset_region(ptr, value, nbytes, name):
    """(uint8 view, byte) of a memset: device memory, or host memory as CANN's aclrtMemset allows
    (a malloc_host buffer, a writable numpy array or buffer-protocol object)."""
    n = check_size(nbytes)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise InvalidParamError(f"{name}: value={value!r} must be a byte value in [0, 255]")
    if isinstance(ptr, DEVICE_TYPES):
        view = host_view(ptr, name="ptr")
    else:
        view = host_region(ptr, "ptr", writable=True)
    if n > view.nbytes:
        raise MemoryAccessError(f"{name}: {n} bytes overrun the buffer: only {view.nbytes} "
                                "bytes are available from ptr")
    return view[:n], int(value)


def memset(ptr, value: int, nbytes: int) -> None:
    """Set ``nbytes`` bytes at ``ptr`` to ``value`` after the current stream's work."""
    v, val = _memset_region(ptr, value, nbytes, "memset")
    s = current_stream()
    chk = hooks.stream_check
    if chk is not None and v.nbytes:
        chk.host_access(s, "memset", callsite(2), writes=[(ptr, v.nbytes)])
    run_sync(s, "memset", "copy", None, v.nbytes, v.fill, val)


def memset_async(ptr, value: int, nbytes: int, stream=None) -> None:
    """Enqueue a memset on ``stream``; returns at once."""
    s = resolve_stream(stream)
    v, val = _memset_region(ptr, value, nbytes, "memset_async")
    site = callsite(2)
    chk = hooks.stream_check
    if chk is not None and v.nbytes:
        chk.access(s, "memset_async", site, writes=[(ptr, v.nbytes)])
    s.enqueue(_still_live(partial(v.fill, val), ptr), "memset_async", "copy",
              {"bytes": int(v.nbytes)}, site)

