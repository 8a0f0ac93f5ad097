"""What device memory is to a caller: ``DevicePtr`` (an address with its allocation's handle),
``DeviceBuffer`` (the base of ``DeviceArray``), pinned ``HostBuffer`` s, and the checks every memory
call makes before it touches anything (``device_region``, ``host_view``, ``record_stream``).

A pointer carries the pool's handle of its allocation (block and generation), so a use after free
is caught without any lookup table. Frees are stream-ordered (torch's caching allocator): the
free's marker (``FreePoint``) names each stream that uses the memory and the value it had issued;
a freed pointer still resolves in a task of one of them that runs before it passes
(``queued_before_free``): stream order proves that task was enqueued before the free. Everywhere
else a freed pointer is a use after free. The check costs nothing on live memory: it runs once a
generation says "freed".
"""
from __future__ import annotations

import enum
import weakref

import numpy as np

from ..current import StreamBase, contexts_by_device
from ..errors import InvalidParamError, MemoryAccessError, describe


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

    @property
    def context(self):
        """The device's context the allocation was made in (read-only)."""
        return self._ctx

    @property
    def block(self):
        """The pool's block of the allocation this pointer is in (read-only; its ``gen`` differs
        from the pointer's once the allocation was freed)."""
        return self._block

    def allocation(self) -> tuple:
        """(base address, requested bytes, allocation site) of the live allocation holding this
        pointer. Raises MemoryAccessError once it was freed."""
        device_region(self, "ptr")
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


DEVICE_TYPES = (DevicePtr, DeviceBuffer)


def device_region(obj, name: str):
    """(ctx, addr, available bytes) of a DevicePtr / DeviceBuffer, after validating it is live
    (or, in a task queued before its free, still the task's: see ``queued_before_free``)."""
    if type(obj) is not DevicePtr:
        if not isinstance(obj, DEVICE_TYPES):
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
            f" ({why_gone(obj)}). Allocate with runtime.malloc and do not use a pointer after "
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


class FreePoint:
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
    if not isinstance(stream, StreamBase):
        raise InvalidParamError(f"record_stream(stream={stream!r}): expected a runtime.Stream")
    ctx, _, _ = device_region(buf, "buf")
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


def why_gone(ptr) -> str:
    """Why a pointer's allocation is gone, for error messages."""
    if contexts_by_device.get(ptr.device_id) is not ptr._ctx:
        return f"device {ptr.device_id} was reset since it was allocated"
    return f"it was allocated at {ptr._block.site} and freed"


def host_view(buf, nbytes: int | None = None, *, name: str = "buf") -> np.ndarray:
    """A writable uint8 numpy view of ``nbytes`` of device memory at ``buf`` (DevicePtr/DeviceArray)."""
    ctx, addr, avail = device_region(buf, name)
    n = avail if nbytes is None else nbytes
    if n > avail:
        raise MemoryAccessError(f"{name}: {n} bytes requested but only {avail} bytes are allocated "
                                f"from {buf!r} to the end of its allocation")
    if n == 0:
        return np.empty(0, np.uint8)
    return ctx.memory.view(addr, n)


def host_array(ptr: DevicePtr, shape: tuple, dtype) -> np.ndarray:
    """A writable numpy array of ``dtype`` and ``shape`` (C order) on the device memory at
    ``ptr``, in one numpy call: what ``host_view(ptr).view(dtype).reshape(shape)`` gives, for
    a DevicePtr its caller has just allocated with at least that many bytes (no checks: the
    torch device's allocation of an operator's result, runtime/torch/storage.py)."""
    mem = ptr._ctx.memory
    return np.ndarray(shape, dtype, mem.array, ptr.addr - mem.base)


def buffer_nbytes(buf) -> int:
    """Bytes available from ``buf`` (DevicePtr/DeviceArray) to the end of its allocation."""
    return device_region(buf, "buf")[2]


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


def host_region(obj, name: str, writable: bool) -> np.ndarray:
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


def check_size(nbytes, name="nbytes") -> int:
    if type(nbytes) is int and nbytes >= 0:
        return nbytes
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
        raise InvalidParamError(f"{name}={nbytes!r} must be a non-negative int")
    if nbytes < 0:
        raise InvalidParamError(f"{name}={nbytes} is negative")
    return int(nbytes)


def malloc_host(nbytes: int) -> HostBuffer:
    """A pinned host buffer of ``nbytes`` (uint8 numpy array) usable for async copies."""
    n = check_size(nbytes)
    if n == 0:
        raise InvalidParamError("malloc_host(nbytes=0): size must be positive")
    return np.zeros(n, np.uint8).view(HostBuffer)


def free_host(buf) -> None:
    """Release a buffer from ``malloc_host`` (the memory goes when the last reference does)."""
    if not isinstance(buf, HostBuffer):
        raise InvalidParamError("free_host: expected a buffer returned by runtime.malloc_host")
