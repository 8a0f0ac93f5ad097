"""DeviceArray: a typed, shaped view of one device allocation (like a torch_npu tensor's storage)."""
from __future__ import annotations

import math

import numpy as np

from . import dtypes, hooks
from .callsite import callsite
from .context import current_context, resolve_stream
from .errors import InvalidParamError, MemoryAccessError
from .memory import (DeviceBuffer, DevicePtr, HostBuffer, malloc_at, run_sync, free, free_from_gc,
                     host_view)
from .memory.pool import MemMallocPolicy

def as_dtype(dtype) -> np.dtype:
    """numpy dtype for ``dtype``: numpy dtypes and names, and ml_dtypes' ``'bfloat16'`` and
    ``'float8_*'`` (imported on first use: runtime/dtypes.py)."""
    if isinstance(dtype, str) and dtype in dtypes.NAMES:
        try:
            return dtypes.get(dtype)
        except ImportError as e:
            raise InvalidParamError(f"dtype={dtype!r}: {e}") from None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidParamError(f"dtype={dtype!r} is not a numpy dtype nor one of "
                                f"{', '.join(sorted(dtypes.NAMES))}") from None
    if dt.hasobject or dt.kind in "USVMm" and not dtypes.is_extra(dt):
        raise InvalidParamError(f"dtype={dt} is not a numeric dtype")
    return dt


def _shape(shape) -> tuple:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        shape = tuple(int(d) for d in shape)
    except TypeError:
        raise InvalidParamError(f"shape={shape!r} must be an int or a tuple of ints") from None
    if any(d < 0 for d in shape):
        raise InvalidParamError(f"shape={shape} has a negative dimension")
    return shape


class DeviceArray(DeviceBuffer):
    """An array in simulated device memory: ``shape``, ``dtype``, ``nbytes``, ``ptr``, and
    ``freed``, True once ``free()`` was called (or the array was collected).

    Zero-size arrays are legal and take no device memory (``ptr`` is None). The memory goes back
    to the pool on ``free()`` or when the array is garbage-collected.
    """

    __slots__ = ("shape", "dtype", "nbytes", "ptr", "freed", "_site", "_owner", "_base", "__weakref__")

    def __init__(self, ptr: DevicePtr | None, shape, dtype, *, _owner: bool = False, _site: str = ""):
        self.shape = _shape(shape)
        self.dtype = as_dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        self.ptr = ptr
        self._owner = _owner
        self._base = None
        self.freed = False
        self._site = _site
        if ptr is not None and self.nbytes:
            host_view(ptr, self.nbytes, name="ptr")  # validates liveness and size

    def device_ptr(self, name: str) -> DevicePtr | None:
        """The pointer to the first byte (None when empty); MemoryAccessError once freed."""
        if self.nbytes == 0:
            return None
        if self.freed:
            raise MemoryAccessError(f"{name}: use after free: {self!r} was freed (allocated at "
                                    f"{self._site})")
        return self.ptr

    @property
    def size(self) -> int:
        return self.nbytes // self.dtype.itemsize if self.dtype.itemsize else 0

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _np(self) -> np.ndarray:
        """The numpy view of the device memory (what kernels receive)."""
        if self.nbytes == 0:
            return np.empty(self.shape, self.dtype)
        return host_view(self.ptr, self.nbytes).view(self.dtype).reshape(self.shape)

    def reshape(self, *shape) -> "DeviceArray":
        """A view of the same memory with another shape (same number of elements)."""
        shape = _shape(shape[0] if len(shape) == 1 else shape)
        if math.prod(shape) != self.size:
            raise InvalidParamError(f"reshape: cannot view {self.size} elements as shape {shape}")
        return self._view(self.ptr, shape, self.dtype)

    def view(self, dtype) -> "DeviceArray":
        """The same bytes as another dtype (the last dimension is rescaled, like numpy)."""
        dt = as_dtype(dtype)
        if self.nbytes % dt.itemsize or (self.shape and (self.shape[-1] * self.dtype.itemsize) % dt.itemsize):
            raise InvalidParamError(f"view: {self.nbytes} bytes of shape {self.shape} cannot be "
                                    f"viewed as {dt} ({dt.itemsize} bytes)")
        shape = self.shape[:-1] + (self.shape[-1] * self.dtype.itemsize // dt.itemsize,) if self.shape else (1,)
        return self._view(self.ptr, shape, dt)

    def __getitem__(self, key) -> "DeviceArray":
        """``a[i:j]`` along the first axis: a view of those rows (contiguous, step 1)."""
        if not isinstance(key, slice) or key.step not in (None, 1) or not self.shape:
            raise InvalidParamError("DeviceArray supports a[i:j] views along the first axis only; "
                                    "copy to the host for other indexing")
        start, stop, _ = key.indices(self.shape[0])
        stop = max(stop, start)
        row = self.nbytes // self.shape[0] if self.shape[0] else 0
        ptr = self.ptr + start * row if self.ptr is not None and stop > start else None
        return self._view(ptr, (stop - start,) + self.shape[1:], self.dtype)

    def _view(self, ptr, shape, dtype) -> "DeviceArray":
        if self.freed:
            raise MemoryAccessError(f"use after free: {self!r} was freed (allocated at {self._site})")
        v = DeviceArray(ptr if math.prod(shape) else None, shape, dtype, _site=self._site)
        v._base = self          # keeps the owner (and its memory) alive while the view lives
        return v

    def to_host(self, stream=None) -> np.ndarray:
        """A numpy copy of the contents, after the work enqueued on ``stream``."""
        s = resolve_stream(stream)
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            src = self._np()
            site = callsite(2)
            chk = hooks.stream_check
            if chk is not None:
                chk.host_access(s, "to_host", site, reads=[self])
            run_sync(s, "to_host", "copy", site, self.nbytes, np.copyto, out, src)
        return out

    def copy_from_host(self, x, stream=None) -> None:
        """Copy host data ``x`` (same shape; cast to this dtype) in; async when ``stream`` is given."""
        x = np.asarray(x)
        if x.shape != self.shape:
            raise InvalidParamError(f"copy_from_host: x.shape={x.shape} does not match the array's "
                                    f"shape {self.shape}")
        if x.dtype != self.dtype or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=self.dtype)
        if self.nbytes == 0:
            return
        dst = self._np()
        site = callsite(2)
        if stream is None:
            s = resolve_stream(None)
            chk = hooks.stream_check
            if chk is not None:
                chk.host_access(s, "copy_from_host", site, writes=[self])
            run_sync(s, "copy_from_host", "copy", site, self.nbytes, np.copyto, dst, x)
        else:
            s = resolve_stream(stream)
            chk = hooks.stream_check
            if chk is not None:
                chk.access(s, "copy_from_host", site, writes=[self])
            src = x if isinstance(x, HostBuffer) else x.copy()
            s.enqueue(lambda: np.copyto(dst, src), "copy_from_host", "copy", {"bytes": self.nbytes}, site)

    def free(self) -> None:
        """Return the memory to the pool now. Freeing twice raises MemoryAccessError."""
        if self.freed:
            raise MemoryAccessError(f"double free of {self!r} (allocated at {self._site})")
        if self.ptr is not None and self._owner:
            free(self.ptr)      # first: a free the stream check refuses leaves the array usable
        self.freed = True

    def __del__(self):
        if self._owner and not self.freed and self.ptr is not None:
            self.freed = True
            try:
                free_from_gc(self.ptr)
            except Exception:  # device reset or interpreter shutdown: nothing left to free
                pass

    def __repr__(self):
        where = "freed" if self.freed else (f"0x{self.ptr.addr:x}" if self.ptr is not None else "empty")
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self._device()}, {where})"

    def _device(self):
        return self.ptr.device_id if self.ptr is not None else None


def empty(shape, dtype=np.float32, *, policy=MemMallocPolicy.HUGE_FIRST,
          site: str | None = None) -> DeviceArray:
    """An uninitialised DeviceArray on the current device. ``site`` (``file:line``) is where the
    pool says it was allocated; by default the caller's line (a walk of the Python stack, which
    costs microseconds a frame: a library that allocates per call may pass its own)."""
    return _empty(shape, dtype, policy, callsite(2) if site is None else site)


def _empty(shape, dtype, policy, site) -> DeviceArray:
    shape, dt = _shape(shape), as_dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    current_context()  # a clear error before anything else when no device is set
    ptr = malloc_at(nbytes, policy, site) if nbytes else None
    return DeviceArray(ptr, shape, dt, _owner=True, _site=site)


def zeros(shape, dtype=np.float32, stream=None) -> DeviceArray:
    """A zero-filled DeviceArray; synchronous unless ``stream`` is given."""
    a = _empty(shape, dtype, MemMallocPolicy.HUGE_FIRST, callsite(2))
    if a.nbytes:
        v = a._np().reshape(-1).view(np.uint8)
        s = resolve_stream(stream)
        chk = hooks.stream_check
        if chk is not None:
            (chk.host_access if stream is None else chk.access)(s, "zeros", a._site, writes=[a])
        if stream is None:
            run_sync(s, "zeros", "copy", a._site, a.nbytes, v.fill, 0)
        else:
            s.enqueue(lambda: v.fill(0), "zeros", "copy", {"bytes": a.nbytes}, a._site)
    return a


def to_device(x, stream=None) -> DeviceArray:
    """A DeviceArray holding a copy of host array ``x``; synchronous unless ``stream`` is given."""
    x = np.asarray(x)
    a = _empty(x.shape, x.dtype, MemMallocPolicy.HUGE_FIRST, callsite(2))
    a.copy_from_host(x, stream=stream)
    return a
