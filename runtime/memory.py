"""Device memory API: pointers, malloc/free, copies and memsets (aclrtMalloc / aclrtMemcpy ...).

Every call validates before it changes anything: a bad size, a freed pointer or a copy that would
overrun either buffer raises at the call, and the pool and the streams stay as they were.

Frees are stream-ordered (torch's caching allocator): the free's marker names each stream that
uses the memory (its malloc's, and those given to ``record_stream``) and the value it had issued;
the pool hands the memory to no other stream before they pass it, and a freed pointer still
resolves in a task of one of them that runs before it passes (``queued_before_free``): stream
order proves that task was enqueued before the free. Everywhere else a freed pointer is a use
after free. The check costs nothing on live memory: it runs once a generation says "freed".
"""
from __future__ import annotations

import enum
import threading
import weakref
from functools import partial

import numpy as np

from . import graph, profiler, sanitizer
from .callsite import callsite
from .context import (contexts_by_device, current_context, current_context_and_stream, current_stream,
                      resolve_stream)
from .errors import InvalidParamError, MemoryAccessError, describe
from .pool import MemMallocPolicy


class MemcpyKind(enum.IntEnum):
    """aclrtMemcpyKind."""
    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3
    DEFAULT = 4


class DevicePtr:
    """An address in a simulated NPU's memory; ``ptr + n`` is ``n`` bytes further.

    A pointer carries the pool's handle of the allocation it came from: its block and the
    block's generation at malloc (unique per malloc, 0 once freed), so use after free and double
    free are caught even after the pool hands the same memory to a new allocation, without any
    lookup table.
    """

    __slots__ = ("device_id", "addr", "_block", "_gen", "_ctx")

    def __init__(self, ctx, addr: int, block, gen: int):
        self._ctx, self._block, self._gen = ctx, block, gen
        self.device_id, self.addr = ctx.device_id, addr

    @property
    def base(self) -> int:
        """The address malloc returned for the allocation this pointer is in."""
        return self._block.addr

    def allocation(self) -> tuple:
        """(base address, requested bytes, allocation site) of the live allocation holding this
        pointer. Raises MemoryAccessError once it was freed."""
        _device_region(self, "ptr")
        b = self._block
        return b.addr, b.requested, b.site

    def __add__(self, n: int) -> "DevicePtr":
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            return NotImplemented
        return DevicePtr(self._ctx, self.addr + int(n), self._block, self._gen)

    def __sub__(self, n):
        if isinstance(n, DevicePtr):
            return self.addr - n.addr
        return self.__add__(-n)

    def __int__(self):
        return self.addr

    __index__ = __int__

    def __eq__(self, other):
        return isinstance(other, DevicePtr) and self.addr == other.addr and \
            self._block is other._block and self._gen == other._gen

    def __hash__(self):
        return hash((self.device_id, self.addr, self._gen))

    def __repr__(self):
        return f"DevicePtr(device={self.device_id}, 0x{self.addr:x})"


class HostBuffer(np.ndarray):
    """A page-locked ("pinned") host buffer from ``malloc_host``; async copies use it directly."""

    def __repr__(self):
        return f"HostBuffer(nbytes={self.nbytes}, 0x{self.__array_interface__['data'][0]:x})"


class DeviceBuffer:
    """Base of the device-memory objects other than DevicePtr (``DeviceArray``).

    The memory calls accept any DeviceBuffer where they accept a DevicePtr; a subclass says
    where its memory starts through ``device_ptr``.
    """

    __slots__ = ()
    freed = False       # a subclass whose memory can be freed says when it was

    def device_ptr(self, name: str) -> DevicePtr | None:
        """The pointer to the object's first byte, None when it has no bytes.

        Raises MemoryAccessError (naming the argument ``name``) when the object was freed.
        """
        raise NotImplementedError


_DEVICE_TYPES = (DevicePtr, DeviceBuffer)
_KINDS = tuple(MemcpyKind)
_COPY_NAMES = {k: "memcpy " + k.name for k in MemcpyKind}


def _device_region(obj, name: str):
    """(ctx, addr, available bytes) of a DevicePtr / DeviceBuffer, after validating it is live
    (or, in a task queued before its free, still the task's: see ``queued_before_free``)."""
    if type(obj) is not DevicePtr:
        if not isinstance(obj, _DEVICE_TYPES):
            raise InvalidParamError(f"{name}={describe(obj)}: expected a DevicePtr or DeviceArray")
        p = getattr(obj, "ptr", None)
        if obj.freed and type(p) is DevicePtr and queued_before_free(p):
            obj = p
        else:
            obj = obj.device_ptr(name)
            if obj is None:
                return None, 0, 0
    ctx, block = obj._ctx, obj._block
    if (block.gen != obj._gen or contexts_by_device.get(obj.device_id) is not ctx) and \
            not queued_before_free(obj):
        raise MemoryAccessError(
            f"{name}={obj!r}: use after free or invalid pointer: no live allocation holds it"
            f" ({_gone(obj)}). Allocate with runtime.malloc and do not use a pointer after "
            "runtime.free.")
    off = obj.addr - block.addr
    avail = block.requested - off
    if off < 0 or avail <= 0:
        raise MemoryAccessError(f"{name}={obj!r} points {off} bytes from the start of its "
                                f"{block.requested}-byte allocation: outside it")
    return ctx, obj.addr, avail


def queued_before_free(ptr: DevicePtr) -> bool:
    """True when ``ptr``'s allocation was freed but the calling thread runs a task that may still
    use it: a task of the stream the free was ordered on (the stream of its malloc), which has
    not yet passed the free. Stream order proves the task was enqueued before the free, and the
    pool hands that memory to no other stream until the stream passes the free (torch's caching
    allocator keeps such memory alike). Anything else is a use after free: a task of another
    stream (the pool may have given the memory away), or one enqueued after the free."""
    block = ptr._block
    until = block.until
    if until is None or block.gen or contexts_by_device.get(ptr.device_id) is not ptr._ctx:
        return False
    for s, value in until.points:
        if not s.reached(value) and s.runs_here():
            return True
    return False


class _FreePoint:
    """The pool's marker of a free: the value each stream that uses the memory (its malloc's,
    and those given to ``record_stream``) had issued at the free, and has not reached yet."""

    __slots__ = ("points",)

    def __init__(self, points: tuple):
        self.points = points

    def query(self) -> bool:
        for s, value in self.points:
            if not s.reached(value):
                return False
        return True

    def __repr__(self):
        return "free pending on " + ", ".join(f"{s.name} up to {v}" for s, v in self.points)


def record_stream(buf, stream) -> None:
    """Mark ``buf``'s memory as used by the work enqueued on ``stream`` (torch's
    ``Tensor.record_stream``): its free then keeps the memory for that work too, as for the
    work of the stream it was allocated on, and no stream reuses it before both have passed
    the free (docs/memory.md, "Stream-ordered frees").

    Raises InvalidParamError for a stream that is not a runtime.Stream of the buffer's device,
    MemoryAccessError for a freed buffer.
    """
    from .stream import Stream
    if not isinstance(stream, Stream):
        raise InvalidParamError(f"record_stream(stream={stream!r}): expected a runtime.Stream")
    ctx, _, _ = _device_region(buf, "buf")
    if ctx is None:
        return                                   # an empty array has no memory to keep
    ptr = buf if type(buf) is DevicePtr else buf.device_ptr("buf")
    if stream.device_id != ptr.device_id:
        raise InvalidParamError(
            f"record_stream: {stream.name} is on device {stream.device_id} but the buffer is "
            f"on device {ptr.device_id}")
    block = ptr._block
    if stream is block.stream:
        return
    with ctx.lock:
        if block.uses is None:
            block.uses = {stream}
        else:
            block.uses.add(stream)


def _gone(ptr) -> str:
    """Why a pointer's allocation is gone, for error messages."""
    if contexts_by_device.get(ptr.device_id) is not ptr._ctx:
        return f"device {ptr.device_id} was reset since it was allocated"
    return f"it was allocated at {ptr._block.site} and freed"


def host_view(buf, nbytes: int | None = None, *, name: str = "buf") -> np.ndarray:
    """A writable uint8 numpy view of ``nbytes`` of device memory at ``buf`` (DevicePtr/DeviceArray)."""
    ctx, addr, avail = _device_region(buf, name)
    n = avail if nbytes is None else nbytes
    if n > avail:
        raise MemoryAccessError(f"{name}: {n} bytes requested but only {avail} bytes are allocated "
                                f"from {buf!r} to the end of its allocation")
    if n == 0:
        return np.empty(0, np.uint8)
    return ctx.memory.view(addr, n)


def buffer_nbytes(buf) -> int:
    """Bytes available from ``buf`` (DevicePtr/DeviceArray) to the end of its allocation."""
    return _device_region(buf, "buf")[2]


def allocation_marks(bufs) -> tuple:
    """What ``same_allocations`` compares later, one mark per buffer of ``bufs`` (None, or a
    DevicePtr / DeviceBuffer validated live by the caller): the object itself, held by a weak
    reference that never keeps it alive (a DevicePtr by value: none), and the allocation it lies
    in now (none for None or an empty array). A free, a new allocation at the same address or a
    reset of the device changes it, so a caller that validated buffers once can skip the checks
    while none did."""
    marks = []
    for b in bufs:
        ref = None if b is None or type(b) is DevicePtr else weakref.ref(b)
        p = b if ref is None else b.device_ptr("buf")
        marks.append((ref, None, 0, None) if p is None else (ref, p._block, p._gen, p._ctx))
    return tuple(marks)


def same_allocations(marks: tuple, bufs) -> bool:
    """True while each of ``bufs`` is the very object ``allocation_marks`` saw (a DevicePtr:
    one equal to it), lies in the allocation it saw, that allocation is live, and no
    DeviceBuffer among them was freed."""
    prev = None
    for (ref, block, gen, ctx), b in zip(marks, bufs):
        if b is prev:           # an in-place call passes (x, x): x once
            continue
        prev = b
        if ref is not None and ref() is not b:
            return False
        if block is not None and (block.gen != gen or
                                  contexts_by_device.get(ctx.device_id) is not ctx or
                                  (ref is not None and b.freed)):
            return False
    return True


def _host_region(obj, name: str, writable: bool) -> np.ndarray:
    if type(obj) is np.ndarray or isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            arr = np.frombuffer(memoryview(obj), np.uint8)
        except TypeError:
            raise InvalidParamError(f"{name}={type(obj).__name__}: expected a DevicePtr, DeviceArray, "
                                    "numpy array or buffer-protocol object") from None
    flags = arr.flags
    if not flags.c_contiguous:
        raise InvalidParamError(f"{name}: host buffer must be C-contiguous")
    if writable and not flags.writeable:
        raise InvalidParamError(f"{name}: destination host buffer is read-only")
    if arr.dtype == np.uint8 and arr.ndim == 1:
        return arr
    return arr.reshape(-1).view(np.uint8)


def _check_nbytes(nbytes, name="nbytes") -> int:
    if type(nbytes) is int and nbytes >= 0:
        return nbytes
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
        raise InvalidParamError(f"{name}={nbytes!r} must be a non-negative int")
    if nbytes < 0:
        raise InvalidParamError(f"{name}={nbytes} is negative")
    return int(nbytes)


# ---------------------------------------------------------------------- malloc / free
def malloc(nbytes: int, policy: MemMallocPolicy = MemMallocPolicy.HUGE_FIRST) -> DevicePtr:
    """Allocate ``nbytes`` on the current device from the caching pool (aclrtMalloc).

    Raises:
        InvalidParamError: nbytes <= 0 or an unknown policy.
        OutOfMemoryError: the pool cannot satisfy the request (message gives the numbers).
    """
    return malloc_at(nbytes, policy, callsite(2))


def malloc_at(nbytes, policy, site: str) -> DevicePtr:
    """``malloc`` with the caller's ``site`` (file:line) given: the one path of every allocation
    (runtime.malloc and the arrays'), on the current stream of the current device."""
    if graph.active and getattr(private_pool, "pool", None) is None:
        graph.refuse("malloc (an array's allocation included)")
    ctx, stream = current_context_and_stream()
    lock = ctx.lock
    lock.acquire()              # not ``with``: half the cost here (0.17 us against 0.4)
    try:
        if ctx.deferred:
            _drain(ctx)
        block = ctx.pool.malloc(nbytes, stream, policy, site)
    finally:
        lock.release()
    if graph.active and getattr(private_pool, "pool", None) is not None:
        return private_pool.pool.keep(DevicePtr(ctx, block.addr, block, block.gen))
    return DevicePtr(ctx, block.addr, block, block.gen)


def free(ptr: DevicePtr) -> None:
    """Return an allocation to the caching pool (aclrtFree); stream-aware, see docs/memory.md.

    Raises:
        MemoryAccessError: double free, or a pointer that is not the start of a live allocation.
    """
    if graph.active:
        graph.refuse("free")
    if not isinstance(ptr, DevicePtr):
        raise InvalidParamError(f"free(ptr={ptr!r}): expected a DevicePtr from runtime.malloc")
    ctx = ptr._ctx
    if contexts_by_device.get(ptr.device_id) is not ctx:
        raise MemoryAccessError(f"free({ptr!r}): device {ptr.device_id} was reset since this "
                                "pointer was allocated; its memory is already gone")
    lock = ctx.lock
    lock.acquire()              # as in malloc_at
    try:
        if ctx.deferred:
            _drain(ctx)
        _free_locked(ctx, ptr, explicit=True)
    finally:
        lock.release()


def _free_locked(ctx, ptr: DevicePtr, explicit: bool = False) -> None:
    """Free ``ptr`` into ``ctx``'s pool (the caller holds the device lock): the checks, then a
    marker for the work still pending on the stream that last used the memory."""
    block = ptr._block
    if block.gen != ptr._gen:
        raise MemoryAccessError(
            f"free({ptr!r}): double free or invalid pointer: no live allocation starts here "
            f"({_gone(ptr)})")
    if ptr.addr != block.addr:
        raise MemoryAccessError(f"free({ptr!r}): pointer is {ptr.addr - block.addr} bytes into "
                                "its allocation; free the pointer malloc returned")
    s, uses = block.stream, block.uses
    if sanitizer.on:
        sanitizer.freeing(ptr.device_id, block.addr, s, callsite(3), not explicit, uses or ())
    if uses is None:                # the common case: one stream
        marker = None if s.query() else _FreePoint(((s, s.issued),))
        ctx.pool.free(block, marker, ptr._gen)
        return
    points = tuple((u, u.issued) for u in (s, *uses) if not u.query())
    ctx.pool.free(block, _FreePoint(points) if points else None, ptr._gen,
                  shared=any(u is not s for u, _ in points))


def _drain(ctx) -> None:
    """Free what garbage-collected arrays handed over while the lock was busy (caller holds it)."""
    while ctx.deferred:
        try:
            _free_locked(ctx, ctx.deferred.pop())
        except MemoryAccessError:   # reset meanwhile: nothing left to free
            pass


def free_from_gc(ptr: DevicePtr) -> None:
    """Free for ``DeviceArray.__del__``: never blocks and never re-enters the pool.

    The cyclic garbage collector may run a finalizer in the middle of a pool call on this very
    thread; the device lock is then held, so the pointer is queued and freed by the next memory
    call instead.
    """
    ctx = ptr._ctx
    if contexts_by_device.get(ptr.device_id) is not ctx:
        return
    if _private and _private.get(id(ptr)) is not None:
        _private[id(ptr)].held.append(ptr)      # a graph's: kept until the graph goes
        return
    if ctx.lock.acquire(blocking=False):
        try:
            _drain(ctx)
            _free_locked(ctx, ptr)
        finally:
            ctx.lock.release()
    else:
        ctx.deferred.append(ptr)


# ---------------------------------------------------------------------- graph-private memory
class PrivatePool:
    """The memory a torch graph capture allocates (torch.npu.NPUGraph's pool, as a CUDA graph's
    private mempool; runtime/torch/graphs.py). While it is ``private_pool.pool`` of the
    capturing thread, ``malloc_at`` allows allocations during the capture and keeps their
    pointers here; one of them freed by the garbage collector (its tensor died) is held, not
    given back to the caching pool, since a replay's nodes write at its address. ``release()``
    gives the held ones back and lets the live ones be freed as usual."""

    def __init__(self):
        self.live: dict = {}            # id(ptr) -> ptr: allocated while capturing
        self.held: list = []            # of those, the ones freed by the garbage collector

    def keep(self, ptr: DevicePtr) -> DevicePtr:
        self.live[id(ptr)] = ptr
        _private[id(ptr)] = self
        return ptr

    @property
    def nbytes(self) -> int:
        return sum(p._block.size for p in self.live.values())

    def release(self) -> None:
        for k in list(self.live):
            _private.pop(k, None)
        self.live.clear()
        held, self.held = self.held, []
        for p in held:
            free_from_gc(p)


private_pool = threading.local()    # .pool: the PrivatePool the thread's capture allocates from
_private: dict = {}                 # id(ptr) -> its PrivatePool, for free_from_gc


def malloc_host(nbytes: int) -> HostBuffer:
    """A pinned host buffer of ``nbytes`` (uint8 numpy array) usable for async copies."""
    n = _check_nbytes(nbytes)
    if n == 0:
        raise InvalidParamError("malloc_host(nbytes=0): size must be positive")
    return np.zeros(n, np.uint8).view(HostBuffer)


def free_host(buf) -> None:
    """Release a buffer from ``malloc_host`` (the memory goes when the last reference does)."""
    if not isinstance(buf, HostBuffer):
        raise InvalidParamError("free_host: expected a buffer returned by runtime.malloc_host")


# ---------------------------------------------------------------------- copies
def _resolve_copy(dst, src, nbytes, kind, name="memcpy"):
    """(dst view, src view, actual MemcpyKind) of a copy of ``nbytes``, every argument checked."""
    n = nbytes if type(nbytes) is int and nbytes >= 0 else _check_nbytes(nbytes)
    dd, sd = isinstance(dst, _DEVICE_TYPES), isinstance(src, _DEVICE_TYPES)
    actual = _KINDS[2 * sd + dd]
    if kind is not MemcpyKind.DEFAULT and kind is not actual:
        _check_kind(kind, actual, dd, sd, name)
    dst_view = host_view(dst, name="dst") if dd else _host_region(dst, "dst", writable=True)
    src_view = host_view(src, name="src") if sd else _host_region(src, "src", writable=False)
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
    if graph.active:
        graph.refuse(f"a host-synchronous {name}")
    if s.idle() and not profiler.active():     # the common case: nothing to wait for or report
        fn(*args)
        return
    if args:
        fn = partial(fn, *args)
    meta = {"bytes": nbytes}
    if s.query():
        s.synchronize()
        t0 = profiler.now_us()
        fn()
        if profiler.active():
            profiler.record(s.id, name, category, t0, profiler.now_us(), meta,
                            site or callsite(3))
        return
    s.enqueue(fn, name, category, meta, site or callsite(3))
    s.synchronize()


def memcpy(dst, src, nbytes: int, kind: MemcpyKind = MemcpyKind.DEFAULT) -> None:
    """Copy ``nbytes`` from ``src`` to ``dst`` after the current stream's work; return when done."""
    d, s_, k = _resolve_copy(dst, src, nbytes, kind)
    s = current_stream()
    if sanitizer.on:
        sanitizer.host_access(s, _COPY_NAMES[k], callsite(2), *_copy_access(dst, src, d.nbytes))
    run_sync(s, _COPY_NAMES[k], "copy", None, d.nbytes, np.copyto, d, s_)


def memcpy_async(dst, src, nbytes: int, kind: MemcpyKind = MemcpyKind.DEFAULT, stream=None) -> None:
    """Enqueue a copy of ``nbytes`` on ``stream``; returns at once.

    A pageable (non-``malloc_host``) host source is staged at the call, as a real driver does, so the
    caller may reuse it immediately; a host destination must stay alive until the stream completes.
    """
    s = resolve_stream(stream)
    d, s_, k = _resolve_copy(dst, src, nbytes, kind, "memcpy_async")
    if not isinstance(src, (*_DEVICE_TYPES, HostBuffer)):
        s_ = s_.copy()
    site = callsite(2)
    if sanitizer.on:
        sanitizer.access(s, "memcpy_async " + k.name, site, *_copy_access(dst, src, d.nbytes))
    s.enqueue(_still_live(partial(np.copyto, d, s_), dst, src), "memcpy_async " + k.name,
              "copy", {"bytes": int(d.nbytes)}, site)


def _still_live(fn, *bufs):
    """``fn`` as a task that first checks that its device buffers among ``bufs`` (validated at
    the call) are still its own: live, or freed behind it on its stream (stream-ordered frees).
    A free it was not ordered before raises use after free instead of touching memory the pool
    may have given away. Costs one generation test per buffer. The task keeps ``bufs`` alive, as
    a kernel's task keeps its arguments: a temporary array is not collected under it."""
    ptrs = tuple(p for p in (b if type(b) is DevicePtr else b.device_ptr("buf")
                             for b in bufs if isinstance(b, _DEVICE_TYPES)) if p is not None)
    if not ptrs:
        return fn

    def task():
        for p in ptrs:
            if p._block.gen != p._gen:
                _device_region(p, "buf")     # raises unless queued before the free
        fn()
    task.bufs = bufs    # the arrays live until the task ran: a collected one is no misuse
    return task


def _copy_access(dst, src, n: int) -> tuple:
    """(reads, writes) of a copy of ``n`` bytes, for the stream sanitizer: its device buffers."""
    reads = [(src, n)] if isinstance(src, _DEVICE_TYPES) and n else []
    writes = [(dst, n)] if isinstance(dst, _DEVICE_TYPES) and n else []
    return reads, writes


def _memset_region(ptr, value, nbytes, name):
    """(uint8 view, byte) of a memset: device memory, or host memory as CANN's aclrtMemset allows
    (a malloc_host buffer, a writable numpy array or buffer-protocol object)."""
    n = _check_nbytes(nbytes)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
        raise InvalidParamError(f"{name}: value={value!r} must be a byte value in [0, 255]")
    if isinstance(ptr, _DEVICE_TYPES):
        view = host_view(ptr, name="ptr")
    else:
        view = _host_region(ptr, "ptr", writable=True)
    if n > view.nbytes:
        raise MemoryAccessError(f"{name}: {n} bytes overrun the buffer: only {view.nbytes} "
                                "bytes are available from ptr")
    return view[:n], int(value)


def memset(ptr, value: int, nbytes: int) -> None:
    """Set ``nbytes`` bytes at ``ptr`` to ``value`` after the current stream's work."""
    v, val = _memset_region(ptr, value, nbytes, "memset")
    s = current_stream()
    if sanitizer.on and v.nbytes:
        sanitizer.host_access(s, "memset", callsite(2), writes=[(ptr, v.nbytes)])
    run_sync(s, "memset", "copy", None, v.nbytes, v.fill, val)


def memset_async(ptr, value: int, nbytes: int, stream=None) -> None:
    """Enqueue a memset on ``stream``; returns at once."""
    s = resolve_stream(stream)
    v, val = _memset_region(ptr, value, nbytes, "memset_async")
    site = callsite(2)
    if sanitizer.on and v.nbytes:
        sanitizer.access(s, "memset_async", site, writes=[(ptr, v.nbytes)])
    s.enqueue(_still_live(partial(v.fill, val), ptr), "memset_async", "copy",
              {"bytes": int(v.nbytes)}, site)


# ---------------------------------------------------------------------- statistics
def _ctx(device=None):
    if device is None:
        return current_context()
    ctx = contexts_by_device.get(device)
    if ctx is None:
        raise InvalidParamError(f"device={device!r} has no context in this process; call set_device")
    return ctx


def _pool(device=None):
    ctx = _ctx(device)
    if ctx.deferred:
        with ctx.lock:
            _drain(ctx)
    return ctx.pool


def _locked(device, method: str, *args):
    """Call a pool method under the device lock (reads may complete a deferred free)."""
    ctx = _ctx(device)
    with ctx.lock:
        if ctx.deferred:
            _drain(ctx)
        return getattr(ctx.pool, method)(*args)


def memory_allocated(device=None) -> int:
    """Bytes in blocks handed out by the pool (torch.npu.memory_allocated)."""
    return _pool(device).allocated


def max_memory_allocated(device=None) -> int:
    """Peak of ``memory_allocated`` since start or the last ``reset_peak_memory_stats``."""
    return _pool(device).max_allocated


def memory_reserved(device=None) -> int:
    """Bytes the pool holds in segments, allocated or cached (torch.npu.memory_reserved)."""
    return _pool(device).reserved


def max_memory_reserved(device=None) -> int:
    """Peak of ``memory_reserved``."""
    return _pool(device).max_reserved


def memory_stats(device=None) -> dict:
    """torch.npu.memory_stats(): flat dotted keys such as ``allocated_bytes.all.current``."""
    return _locked(device, "stats")


def memory_summary(device=None) -> str:
    """A table of the pool's statistics (torch.npu.memory_summary)."""
    return _locked(device, "summary")


def memory_snapshot(device=None) -> list:
    """Every segment and its blocks (address, size, state, allocation site)."""
    return _locked(device, "snapshot")


def reset_peak_memory_stats(device=None) -> None:
    """Reset the peaks of every statistic to their current values."""
    _locked(device, "reset_peak_stats")


def empty_cache() -> None:
    """Return every unused cached segment of the current device to the device."""
    ctx = current_context()
    with ctx.lock:
        _drain(ctx)
        ctx.pool.empty_cache()


def card_holders(device=None) -> list:
    """The other live processes on the device's card (runtime/card.py): ``card.Holder``
    records with ``pid``, ``job``, ``rank`` and ``reserved`` bytes ([] with NPUSIM_CARD_SHARE=0)."""
    return _ctx(device).memory.card.others()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap this process's reserved memory at ``fraction`` of the device capacity; an allocation
    past it raises OutOfMemoryError (also torch.OutOfMemoryError once torch is imported)."""
    _locked(device, "set_memory_fraction", fraction)
