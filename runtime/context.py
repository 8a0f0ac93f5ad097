"""Device contexts: one per simulated NPU per process; the current device and current stream.

``set_device`` binds the calling thread to a device (and, the first time, the whole process, so
threads that never call it use that device, like aclrtSetDevice in a single-device process).
The current stream is a per-thread, per-device stack driven by ``with stream(s):``; that state
lives in ``runtime.current`` (below ``stream``), whose public names this module re-exports.
The profiler and the stream check observe devices through ``runtime.hooks``.
"""
from __future__ import annotations

import contextlib
import logging
import threading

from . import config, current, hooks
from .current import (contexts_by_device, current_context, current_context_and_stream,
                      current_stream, current_stream_of, resolve_stream, set_current_stream,
                      stream_stack)
from .errors import InvalidParamError
from .memory.device_memory import DeviceMemory
from .stream import Stream

__all__ = ["Context", "contexts_by_device", "current_context", "current_context_and_stream",
           "current_stream", "current_stream_of", "default_stream", "device_count", "get_device",
           "get_mem_info", "reset_device", "resolve_stream", "set_current_stream", "set_device",
           "stream", "stream_stack", "synchronize", "synchronize_all"]

log = logging.getLogger("runtime")

_contexts_lock = threading.Lock()


class _Ready:
    """Pool marker: the work a stream had pending when a block was freed."""
    __slots__ = ("stream", "value")

    def __init__(self, stream, value):
        self.stream, self.value = stream, value

    def query(self) -> bool:
        return self.stream.reached(self.value)


class Context:
    """Everything one simulated NPU owns in this process: memory, pool, streams."""

    def __init__(self, device_id: int):
        from .memory.pool import FRONT_CACHE_BLOCKS, CachingAllocator
        self.device_id = device_id
        self.capacity = config.hbm_bytes()
        self.memory = DeviceMemory(device_id, self.capacity)
        self.pool = CachingAllocator(self.memory, self.capacity, device_id,
                                     front_cache=FRONT_CACHE_BLOCKS)
        # a plain lock: a finalizer run by the garbage collector inside a pool call must not
        # re-enter the pool (see memory.free_from_gc); ``deferred`` holds what it hands over
        self.lock = threading.Lock()
        self.deferred: list = []
        self.streams: list = []
        self.default_stream = Stream(_ctx=self, _name="default stream")

    def _add_stream(self, s) -> None:
        with self.lock:
            self.streams.append(s)

    def _remove_stream(self, s) -> None:
        with self.lock:
            if s in self.streams:
                self.streams.remove(s)

    def ready_marker(self, stream):
        """The pool's marker for memory last used on ``stream``: None when it is idle."""
        if stream.query():
            return None
        return _Ready(stream, stream.issued)

    def synchronize(self, timeout=None) -> None:
        first = None
        for s in list(self.streams):
            try:
                s.synchronize(timeout)
            except Exception as exc:  # keep draining every stream, raise the first failure
                if first is None:
                    first = exc
        if first is not None:
            raise first
        chk = hooks.stream_check
        if chk is not None:
            chk.device_synchronized(self.device_id)


def _check_id(device_id) -> int:
    n = config.device_count()
    if isinstance(device_id, bool) or not isinstance(device_id, int):
        raise InvalidParamError(f"device_id={device_id!r} must be an int in [0, {n})")
    if not 0 <= device_id < n:
        raise InvalidParamError(
            f"device_id={device_id} is out of range: this node has {n} simulated NPUs "
            f"(NPUSIM_DEVICE_COUNT={n}), valid ids are 0..{n - 1}")
    return device_id


def set_device(device_id: int | None = None) -> None:
    """Bind the calling thread (and by default the process) to simulated NPU ``device_id``.

    Without an argument: LOCAL_RANK when a launcher set it, else 0 (a script run with plain
    ``python`` is a world of one on device 0).
    """
    if device_id is None:
        device_id = config.local_rank()
    _check_id(device_id)
    with _contexts_lock:
        if device_id not in contexts_by_device:
            for fn in tuple(hooks.context_created):
                fn(device_id)
            contexts_by_device[device_id] = Context(device_id)
        if current.process_device is None:
            current.process_device = device_id
    current.thread.device = device_id


def get_device() -> int:
    """The calling thread's device id."""
    return current_context().device_id


def device_count() -> int:
    """Number of simulated NPUs on this node (NPUSIM_DEVICE_COUNT, default 8)."""
    return config.device_count()


def reset_device(device_id: int | None = None) -> list:
    """Wait for pending work, destroy streams and events, release memory, report leaks.

    Returns the leaked blocks (also logged as warnings with where each was allocated).
    """
    ctx = current_context() if device_id is None else contexts_by_device.get(_check_id(device_id))
    if ctx is None:
        return []
    try:
        ctx.synchronize()
    finally:
        with ctx.lock:
            ctx.deferred.clear()
            leaks = ctx.pool.release_all()
        for b in leaks:
            log.warning("device %d: leaked %d bytes at 0x%x allocated at %s",
                        ctx.device_id, b.requested, b.addr, b.site)
        for s in list(ctx.streams):
            s._shutdown()
        with _contexts_lock:
            contexts_by_device.pop(ctx.device_id, None)
            if current.process_device == ctx.device_id:
                current.process_device = None
        if current.thread.device == ctx.device_id:
            current.thread.device = None
        chk = hooks.stream_check
        if chk is not None:
            chk.forget(ctx.device_id)
        ctx.memory.close()
    return leaks


def synchronize(timeout: float | None = None) -> None:
    """Wait for every stream of the current device (raises the first pending task error)."""
    current_context().synchronize(timeout)


def synchronize_all() -> None:
    """Wait for every stream of every device of this process (profiling, shutdown)."""
    for ctx in list(contexts_by_device.values()):
        ctx.synchronize()


def get_mem_info() -> tuple[int, int]:
    """(free_bytes, total_bytes) of the current device's card; memory cached by the pool counts
    as used, and so does what the other processes on the card reserve (runtime/memory/card.py)."""
    ctx = current_context()
    others = ctx.memory.card.others_reserved()
    return max(ctx.capacity - ctx.pool.reserved - others, 0), ctx.capacity


# ---------------------------------------------------------------------- current stream
def default_stream():
    """The current device's default stream."""
    return current_context().default_stream


@contextlib.contextmanager
def stream(s):
    """Make ``s`` the current stream for the block (``None`` leaves the current one)."""
    if s is None:
        yield current_stream()
        return
    if not isinstance(s, Stream):
        raise InvalidParamError(f"stream({s!r}): expected a runtime.Stream")
    st = stream_stack(s.device_id)
    st.append(s)
    try:
        yield s
    finally:
        st.pop()
