"""Integer pointers for ``runtime.acl``: the registry of known buffers, and ``acl.util``.

Device pointers are the simulated device's addresses of ``acl.rt.malloc`` allocations; host
pointers are real process addresses of buffers registered here (``acl.rt.malloc_host``,
``acl.util.numpy_to_ptr``, ``acl.util.bytes_to_ptr``). An address inside a known buffer
(``ptr + offset``) resolves to that buffer at that offset.
"""
from __future__ import annotations

import bisect
import ctypes
import threading
import weakref

import numpy as np

from . import codes as _c
from .codes import AclError, fail, int_arg

import runtime as _rt

lock = threading.RLock()


class _Ranges:
    """Known buffers by start address; finds the one that holds an address (``ptr + offset``)."""

    def __init__(self):
        self.items: dict = {}           # start -> (object getter, nbytes)
        self.starts: list = []

    def add(self, start: int, getter, nbytes: int) -> None:
        if start not in self.items:
            bisect.insort(self.starts, start)
        self.items[start] = (getter, nbytes)

    def pop(self, start: int):
        item = self.items.pop(start, None)
        if item is not None:
            del self.starts[bisect.bisect_left(self.starts, start)]
        return item

    def find(self, addr: int):
        """(start, object, nbytes) of the live buffer holding ``addr``, else None."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0:
            return None
        start = self.starts[i]
        getter, nbytes = self.items[start]
        obj = getter()
        if obj is None or addr >= start + max(nbytes, 1):
            return None
        return start, obj, nbytes

    def clear(self) -> None:
        self.items.clear()
        self.starts.clear()


dev = _Ranges()        # device address -> DevicePtr from acl.rt.malloc
host = _Ranges()       # host address -> malloc_host buffer / registered numpy array / bytes


def strong(obj):
    return lambda: obj


def register_host(obj, pinned: bool = False) -> int:
    arr = obj if isinstance(obj, np.ndarray) else np.frombuffer(obj, np.uint8)
    addr = int(arr.__array_interface__["data"][0])
    try:
        getter = strong(obj) if pinned else weakref.ref(obj)
    except TypeError:           # bytes cannot be weakly referenced: kept until acl.finalize
        getter = strong(obj)
    with lock:
        host.add(addr, getter, arr.nbytes)
    return addr


def _bytes_storage(data: bytes) -> np.ndarray:
    """A writable view of a bytes object's storage. CANN's memcpy writes into the buffer that
    ``acl.util.bytes_to_ptr`` pointed at, and Ascend's samples read device data back that way
    (``bytes_data = array.tobytes(); memcpy(bytes_to_ptr(bytes_data), ...)``), so npusim does
    too. CPython shares bytes objects of length 0 and 1, and caches a bytes object's hash: a
    script must not use such a buffer as a dict key or rely on its identity."""
    if len(data) <= 1:
        raise AclError(_c.ACL_ERROR_RT_PARAM_INVALID,
                       f"a bytes object of {len(data)} byte(s) is shared by the interpreter and "
                       "cannot be a destination; use a bytearray or acl.util.numpy_to_ptr")
    addr = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
    return np.ctypeslib.as_array((ctypes.c_ubyte * len(data)).from_address(addr))


def host_region(addr: int):
    """A flat uint8 numpy view of the host buffer from ``addr`` to its end, or None."""
    found = host.find(addr)
    if found is None:
        return None
    start, obj, nbytes = found
    if type(obj) is bytes:
        return _bytes_storage(obj)[addr - start:]
    arr = obj if isinstance(obj, np.ndarray) else np.frombuffer(obj, np.uint8)
    flat = arr.reshape(-1).view(np.uint8) if arr.flags.c_contiguous else None
    if flat is None:
        raise AclError(_c.ACL_ERROR_INVALID_PARAM, f"host buffer at 0x{start:x} is not C-contiguous")
    return flat[addr - start:]


def device_ptr(addr: int):
    """The DevicePtr for device address ``addr`` (the start or inside of an acl.rt.malloc)."""
    found = dev.find(addr)
    if found is None:
        return None
    start, ptr, _ = found
    return ptr if addr == start else ptr + (addr - start)


def resolve(ptr, name: str):
    """A DevicePtr or a host buffer for a pyACL pointer argument."""
    if name == "dst" and isinstance(ptr, bytes):
        raise AclError(_c.ACL_ERROR_RT_PARAM_INVALID,
                       "dst is a bytes object: read-only, and a copy (array.tobytes() is one), so "
                       "the data could never reach your array; pass acl.util.numpy_to_ptr(array)")
    if isinstance(ptr, (_rt.DevicePtr, np.ndarray, bytes, bytearray, memoryview)):
        return ptr          # npusim objects and host buffers passed directly are taken as is
    addr = int_arg(name, ptr)
    with lock:
        p = device_ptr(addr)
        if p is not None:
            return p
        h = host_region(addr)
    if h is not None:
        return h
    raise AclError(_c.ACL_ERROR_RT_PARAM_INVALID,
                   f"{name}=0x{addr:x} is not in any live buffer: device memory comes from "
                   "acl.rt.malloc, host memory from acl.rt.malloc_host, acl.util.numpy_to_ptr or "
                   "acl.util.bytes_to_ptr (a freed pointer is no longer valid)")


def check_count(count, limit, what: str) -> int:
    n = int_arg("count", count)
    m = int_arg(what, limit)
    if n < 0 or n > m:
        raise AclError(_c.ACL_ERROR_INVALID_PARAM,
                       f"count={n} must be in [0, {what}={m}]: {what} is the destination's size")
    return n


# ---------------------------------------------------------------------- acl.util
class _Util:
    """``acl.util``: pointers to and from numpy arrays and bytes, report threads."""

    def numpy_to_ptr(array) -> int:
        """The host address of ``array``'s data; valid while the array lives."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"numpy_to_ptr: expected a numpy array, got {type(array).__name__}")
        return register_host(array)

    def bytes_to_ptr(data) -> int:
        """The host address of a bytes / bytearray object (kept alive until acl.finalize).

        As with CANN, acl.rt.memcpy may write into it (even into an immutable bytes object)."""
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"bytes_to_ptr: expected bytes or bytearray, got {type(data).__name__}")
        return register_host(data)

    def numpy_contiguous_to_ptr(array) -> tuple:
        """(host address, the C-contiguous array it points into): ``array`` itself when it is
        contiguous, else a contiguous copy, which the caller must keep alive while using the
        address (pyACL's contract)."""
        if not isinstance(array, np.ndarray):
            raise TypeError("numpy_contiguous_to_ptr: expected a numpy array, got "
                            f"{type(array).__name__}")
        flat = np.ascontiguousarray(array)
        return register_host(flat), flat

    def ptr_to_numpy(ptr, shape, np_type):
        """A numpy array viewing the host buffer at ``ptr`` (``np_type``: dtype or NPY type number)."""
        dtype = _dtype(np_type)
        count = int(np.prod(shape, dtype=np.int64)) if len(tuple(shape)) else 1
        view = _host_view(ptr, count * dtype.itemsize, "ptr_to_numpy")
        return view[:count * dtype.itemsize].view(dtype).reshape(shape)

    def ptr_to_bytes(ptr, size) -> bytes:
        """A copy of ``size`` bytes of the host buffer at ``ptr``."""
        return bytes(_host_view(ptr, int(size), "ptr_to_bytes")[:int(size)])

    def start_thread(fn, args) -> tuple:
        """(thread id, ret): run ``fn(args)`` on a new daemon thread (for process_report loops)."""
        t = threading.Thread(target=fn, args=(args,), daemon=True, name="acl report thread")
        t.start()
        _threads[t.ident] = t
        return t.ident, _c.ACL_SUCCESS

    def stop_thread(thread_id) -> int:
        """Join a thread start_thread made (it must have left its loop): ret."""
        t = _threads.pop(thread_id, None)
        if t is None:
            return fail("acl.util.stop_thread", AclError(
                _c.ACL_ERROR_INVALID_PARAM, f"thread_id={thread_id!r} was not started by start_thread"))
        t.join(timeout=10)
        if t.is_alive():
            return fail("acl.util.stop_thread", AclError(
                _c.ACL_ERROR_RT_THREAD_SUBSCRIBE, f"thread {thread_id} is still running after 10 s"))
        return _c.ACL_SUCCESS


_threads: dict = {}


def _dtype(np_type) -> np.dtype:
    if isinstance(np_type, (int, np.integer)) and not isinstance(np_type, bool):
        for t in np.sctypeDict.values():
            if np.dtype(t).num == int(np_type):
                return np.dtype(t)
        raise ValueError(f"np_type={np_type} is not a numpy type number")
    return np.dtype(np_type)


def _host_view(ptr, nbytes: int, api: str):
    addr = int_arg("ptr", ptr)
    with lock:
        view = host_region(addr)
        is_dev = view is None and dev.find(addr) is not None
    if view is None:
        where = ("device memory: copy it to the host with acl.rt.memcpy first" if is_dev
                 else "not in any live host buffer known to acl")
        raise ValueError(f"{api}: ptr=0x{addr:x} is {where}")
    if nbytes > view.nbytes:
        raise ValueError(f"{api}: {nbytes} bytes requested but only {view.nbytes} are "
                         f"available from 0x{addr:x}")
    return view


util = _Util
