"""malloc and free (aclrtMalloc / aclrtFree), the graph-private pool, and the pool's statistics.

Every call validates before it changes anything: a bad size, a freed pointer or a double free
raises at the call, and the pool and the streams stay as they were. Frees are stream-ordered
(``pointers.FreePoint``, docs/memory.md "Stream-ordered frees").
"""
from __future__ import annotations

import threading

from .. import hooks
from ..callsite import callsite
from ..current import contexts_by_device, current_context, current_context_and_stream
from ..errors import InvalidParamError, MemoryAccessError
from .pointers import DevicePtr, FreePoint, why_gone
from .pool import MemMallocPolicy


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
    cap = hooks.capture
    keeper = None if cap is None else getattr(private_pool, "pool", None)
    if cap is not None and keeper is None:
        cap.refuse("malloc (an array's allocation included)")
    ctx, block = malloc_block(nbytes, policy, site)
    p = DevicePtr(ctx, block.addr, block, block.gen)
    return p if keeper is None else keeper.keep(p)


def malloc_block(nbytes, policy, site: str) -> tuple:
    """``malloc_at`` for a caller that keeps the allocation as ``(context, block)`` (the
    block's ``gen`` read at once is its generation) and frees it with ``free_block_from_gc``:
    no DevicePtr is made (the torch device's storage, one per operator result, makes its
    pointer when asked for one). Not while a graph capture may allocate: malloc_at keeps those
    pointers in the graph's private pool."""
    ctx, stream = current_context_and_stream()
    lock = ctx.lock
    lock.acquire()              # not ``with``: half the cost here (0.17 us against 0.4)
    try:
        if ctx.deferred:
            _drain(ctx)
        block = ctx.pool.malloc(nbytes, stream, policy, site)
    finally:
        lock.release()
    return ctx, block


def free(ptr: DevicePtr) -> None:
    """Return an allocation to the caching pool (aclrtFree); stream-aware, see docs/memory.md.

    Raises:
        MemoryAccessError: double free, or a pointer that is not the start of a live allocation.
    """
    cap = hooks.capture
    if cap is not None:
        cap.refuse("free")
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
            f"({why_gone(ptr)})")
    if ptr.addr != block.addr:
        raise MemoryAccessError(f"free({ptr!r}): pointer is {ptr.addr - block.addr} bytes into "
                                "its allocation; free the pointer malloc returned")
    s, uses = block.stream, block.uses
    chk = hooks.stream_check
    if chk is not None:
        chk.freeing(ptr.device_id, block.addr, s, callsite(3), not explicit, uses or ())
    if uses is None:                # the common case: one stream
        marker = None if s.query() else FreePoint(((s, s.issued),))
        ctx.pool.free(block, marker, ptr._gen)
        return
    points = tuple((u, u.issued) for u in (s, *uses) if not u.query())
    ctx.pool.free(block, FreePoint(points) if points else None, ptr._gen,
                  shared=any(u is not s for u, _ in points))


def _drain(ctx) -> None:
    """Free what garbage-collected arrays handed over while the lock was busy (caller holds it)."""
    while ctx.deferred:
        try:
            _free_locked(ctx, ctx.deferred.pop())
        except MemoryAccessError:   # reset meanwhile: nothing left to free
            pass


def free_block_from_gc(ctx, block, gen: int, ptr: DevicePtr | None = None) -> None:
    """Free for a finalizer (an npu storage's owner, ``DeviceArray.__del__``): never blocks and
    never re-enters the pool. The cyclic garbage collector may run a finalizer in the middle of
    a pool call on this very thread; the device lock is then held, so the allocation is queued
    and freed by the next memory call instead. ``block`` / ``gen``: the allocation as
    ``malloc_block`` returned it (its generation then); ``ptr``: the DevicePtr being freed, when
    the caller has one (``free_from_gc``), else one is made only if the free must wait or be
    checked."""
    if contexts_by_device.get(ctx.device_id) is not ctx:
        return                  # the device was reset: its memory is already gone
    lock = ctx.lock
    if lock.acquire(False):
        try:
            if ctx.deferred:
                _drain(ctx)
            if block.uses is None and hooks.stream_check is None and block.gen == gen and \
                    (ptr is None or ptr.addr == block.addr):
                # _free_locked's common case, inline: one stream, no sanitizer, a live pointer
                s = block.stream
                ctx.pool.free(block, None if s.query() else FreePoint(((s, s.issued),)), gen)
            else:
                _free_locked(ctx, ptr if ptr is not None else DevicePtr(ctx, block.addr, block,
                                                                        gen))
        finally:
            lock.release()
    else:
        ctx.deferred.append(ptr if ptr is not None else DevicePtr(ctx, block.addr, block, gen))


def free_from_gc(ptr: DevicePtr) -> None:
    """``free_block_from_gc`` of a DevicePtr; one a graph capture allocated is held by its
    graph's private pool instead, until the graph goes."""
    if _private and _private.get(id(ptr)) is not None:
        if contexts_by_device.get(ptr.device_id) is ptr._ctx:
            _private[id(ptr)].held.append(ptr)
        return
    free_block_from_gc(ptr._ctx, ptr._block, ptr._gen, ptr)


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
    """The other live processes on the device's card (runtime/memory/card.py): ``card.Holder``
    records with ``pid``, ``job``, ``rank`` and ``reserved`` bytes ([] with NPUSIM_CARD_SHARE=0)."""
    return _ctx(device).memory.card.others()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap this process's reserved memory at ``fraction`` of the device capacity; an allocation
    past it raises OutOfMemoryError (also torch.OutOfMemoryError once torch is imported)."""
    _locked(device, "set_memory_fraction", fraction)


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction of the device capacity this process's pool may reserve
    (``set_per_process_memory_fraction``; 1.0 unless it was set)."""
    return _pool(device).fraction
