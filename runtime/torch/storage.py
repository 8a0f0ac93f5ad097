"""The storage of an ``npu`` tensor: an allocation of npusim device memory, owned by torch.

Design note. A torch tensor on ``npu:N`` must own its data in the way every torch tensor does,
through its storage: views, ``nn.Parameter``, ``.data``, ``torch.save`` all share or copy the
storage, never a Python attribute of one tensor object. Pure Python cannot register a C++
allocator for the PrivateUse1 key, but DLPack hands torch memory *with an owner*: a tensor made by
``torch.from_dlpack`` keeps the exporter's object alive until its storage dies, then calls the
exporter's deleter. So an allocation is

    malloc from the pool              -> a block (the pool counts it; OOM raises there)
    _Owner: a numpy view of its bytes holding the block, and the allocation itself: a
        DeviceBuffer (``owner.dev`` is the owner; ``owner.ptr`` its DevicePtr, made when asked)
        that gives the memory back when it dies
    numpy's DLPack capsule of the _Owner, its device field set to kDLExtDev (12), which torch
        maps to PrivateUse1, i.e. ``npu:N``
    torch.from_dlpack(capsule)        -> a uint8 ``npu:N`` tensor whose storage owns the _Owner

(a contiguous tensor of a dtype numpy has is exported with its dtype and shape in one step; any
other is viewed onto the uint8 storage). When the storage's last user goes, torch calls the
deleter, the _Owner dies and its ``__del__`` gives the memory back to the pool in the order of
the stream it was allocated on (runtime.memory.alloc.free_block_from_gc). One object per
allocation does it all: an allocation is the largest piece of every npu operator (see "Costs").

``_live`` maps the storage's address to a weak reference of its _Owner (the entry goes in
``_Owner.__del__``, just before the memory goes back to the pool, so no other owner can have
taken the address meanwhile: no weakref callback, no lock): the CPU view of an npu
tensor (``cpu_view``) is a CPU tensor on the same bytes (the device memory *is* host memory in
npusim), with the tensor's dtype, sizes, strides and offset; torch's CPU kernels run on it.
The operators' fast path takes them from a small cache on the _Owner (``shared_cpu_view``),
which dies with the storage.

Reuse. A result's memory usually comes back at once: the pool parks a freed small block for the
next malloc of its stream and size (runtime/memory/front_cache.py), and a training step asks for
the same shapes again and again. So a dying _Owner of a typed result leaves its plain numpy view
and its CPU tensor (``owner.cpu``) with the parked block (``Block.reuse``, which the pool drops
when the memory merges: a flush, ``empty_cache``, a reset), and the next result of the same
dtype and shape at that address takes them again instead of making new ones (``_owner``): the
same bytes, the same view, 1.2 us less per allocation. Never left: the CPU tensor of an owner
whose shared view a kernel changed (``forget_cpu_view``), nor an inference tensor (made under
``torch.inference_mode``: a result outside the mode could not be written through it). Every
other state of that CPU tensor is what a shared view promises anyway: its metadata is not
changed by its users (``shared_cpu_view``), and it is on the bytes of its address only.

Costs, measured: an operator allocates its result, and a training step allocates some three
hundred and fifty times, so this path is kept short: ``empty_with_view`` and the free when the
tensor dies take 6.2 us against 9.2 before (the floor, ``np.empty`` + DLPack + ``from_numpy``,
2.6): the pool's one-step malloc and free of a parked block (pool.py, 2.8 us of it), one Python
object per allocation (the _Owner: no separate finaliser object, no DevicePtr unless asked),
its attributes set as one dict, a result's view and CPU tensor reused (above), and the
capsule's device written by a single foreign call. The allocation site the pool records (what
the stream sanitizer names in a race) is the user's line only while the sanitizer or the
profiler is on: finding it walks the Python stack, 20-40 us deep inside a model, more than all
the rest.
"""
from __future__ import annotations

import ctypes
import struct
import weakref

import numpy as np
import torch

import runtime
from runtime import hooks, profiler, sanitizer
from runtime.context import contexts_by_device
from runtime.memory import DeviceBuffer, DevicePtr, free_from_gc, host_view, malloc_at
from runtime.memory.alloc import free_block_from_gc, malloc_block
from runtime.memory.pointers import host_array
from runtime.memory.pool import MemMallocPolicy

from .site import user_site

from .device import bind_thread
from .device import on as _on

_KDL_EXT_DEV = 12                 # DLPack's kDLExtDev: torch's PrivateUse1
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_view_dtype = torch.ops.aten.view.dtype
_as_strided = torch.ops.aten.as_strided.default

_HUGE_FIRST = MemMallocPolicy.HUGE_FIRST
# PyCapsule_GetPointer as a pointer to the DLTensor's 8-byte words (``[1]`` is its DLDevice):
# a prototype of its own, so ``ctypes.pythonapi.PyCapsule_GetPointer``, which every module of
# the process shares, keeps its restype and argtypes
_capsule_words = ctypes.PYFUNCTYPE(ctypes.POINTER(ctypes.c_int64), ctypes.py_object,
                                   ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))

_live: dict = {}                  # storage address -> weakref to its _Owner


class _Owner(np.ndarray, DeviceBuffer):
    """The numpy view of one allocation that torch's storage keeps alive (see the note), and
    the allocation itself: ``dev`` is the owner, a DeviceBuffer (``dev.ptr``, ``dev.nbytes``)
    that every memory call takes; when it dies, its memory goes back to the pool. ``cpu`` is a
    CPU tensor on all of its bytes (uint8, or the dtype and shape of the tensor allocated; every
    CPU view is on ``cpu.untyped_storage()``), ``index`` the device index, ``addr`` the host
    address (its key in ``_live``). A numpy view of an owner (``owner[1:]``) is an _Owner
    without these attributes, and frees nothing."""

    @property
    def dev(self) -> "_Owner":
        return self

    @property
    def ptr(self) -> DevicePtr:
        """The allocation's DevicePtr, made when asked for (the owner keeps its context, block
        and generation: ``malloc_block``), or the one a graph capture's pool keeps."""
        d = self.__dict__
        p = d.get("kept")
        if p is None:
            b = d.get("block")
            if b is None:
                raise AttributeError("a numpy view of an npu storage's memory has no pointer")
            p = DevicePtr(d["ctx"], b.addr, b, d["gen"])
        return p

    def device_ptr(self, name: str):
        return self.ptr

    def __repr__(self):
        try:
            return f"npu storage memory ({self.nbytes} bytes on device {self.ptr.device_id})"
        except AttributeError:
            return "npu storage memory (a numpy view of one)"

    def __del__(self):
        try:
            d = self.__dict__
            # the owner is going: drop its entry, before the memory goes back to the pool (no
            # new owner can have this address until then)
            _live.pop(d["addr"], None)
            block = d["block"]
            key = d["reuse"]
            if key is not None:         # left with the memory for its next result (_owner)
                block.reuse = (key, self.base, d["cpu"])
            p = d["kept"]
            if p is None:
                free_block_from_gc(d["ctx"], block, d["gen"])
            else:
                free_from_gc(p)
        except Exception:       # a view without the attributes, a device reset, or the
            pass                # interpreter's shutdown: nothing to free


def _from_dlpack(arr: np.ndarray, device: int) -> torch.Tensor:
    """An ``npu:device`` tensor on the bytes of numpy array ``arr`` (its dtype, shape and
    strides), keeping ``arr`` alive."""
    cap = arr.__dlpack__()
    # DLTensor: void *data; DLDevice {int32 device_type; int32 device_id}; ...: the device is
    # its second 8-byte word, written in one foreign call and one store
    dl_device = _DL_DEVICE.get(device)
    if dl_device is None:
        dl_device = _DL_DEVICE[device] = struct.unpack(
            "=q", struct.pack("=ii", _KDL_EXT_DEV, device))[0]
    _capsule_words(cap, b"dltensor")[1] = dl_device
    return torch.from_dlpack(cap)


_DL_DEVICE: dict = {}             # device index -> the DLDevice's 8 bytes, as an int64


def new_storage_tensor(nbytes: int, device: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` (> 0) on ``npu:device`` owning a new allocation of it.

    The current runtime device must be ``device`` (the caller switches to it).
    Raises runtime.errors.OutOfMemoryError with the pool's numbers past the capacity.
    """
    return _from_dlpack(_owner(nbytes, device, None, None, None), device)


def _owner(nbytes: int, device: int, npdt, shape, key) -> _Owner:
    """A new allocation of ``nbytes`` as its _Owner (registered in ``_live``), not yet exported.
    ``npdt`` / ``shape``: the numpy dtype and shape of the tensor to be (None: uint8 bytes), which
    the owner and ``owner.cpu`` then have (it is exported as it is); ``key``, when given, the
    shared CPU view's cache key of ``owner.cpu``."""
    bind_thread()
    # the user's line for the pool's record only while the stream sanitizer (which names it in
    # a race) or the profiler records: finding it walks the Python stack, 20-40 us inside a
    # model's forward, more than the rest of the allocation
    site = _UNRECORDED if not (sanitizer.on or profiler.on) else user_site(2)
    if hooks.capture is None:
        ctx, block = malloc_block(nbytes, _HUGE_FIRST, site)   # no DevicePtr: one when asked
        kept = None
    else:                       # a capture may allocate from a graph's pool: it keeps the pointer
        kept = malloc_at(nbytes, _HUGE_FIRST, site)
        ctx, block = kept.context, kept.block
    try:                        # until the owner holds it, a failure frees the memory here
        left = block.reuse
        reuse = key
        if left is not None:
            block.reuse = None          # taken: a live block carries nothing
        if left is not None and key is not None and left[0] == key:
            # the memory of a result of this very dtype and shape, parked by the pool for this
            # stream: its numpy view and CPU tensor again (see "Reuse" in the note)
            view, cpu = left[1], left[2]
        else:
            # the numpy view of the new bytes: one numpy call for a typed one (no checks)
            p = DevicePtr(ctx, block.addr, block, block.gen) if kept is None else kept
            view = host_view(p, nbytes) if npdt is None else host_array(p, shape, npdt)
            # a CPU tensor on the bytes, made from ``view``, never from the owner (a cycle
            # through a torch storage would never be collected); the storage of every CPU view
            cpu = torch.from_numpy(view)
            if key is not None and torch.is_inference_mode_enabled():
                reuse = None        # an inference tensor: no result outside the mode may get it
        owner = view.view(_Owner)
        addr = cpu.data_ptr()                   # (numpy's ``.ctypes.data`` costs 10 us)
        # ``ctx`` / ``dev_id``: what shared_cpu_view checks, cheaply: the device's context is
        # still the one allocated from (a reset replaces it; nothing else can free memory the
        # owner holds); ``reuse``: the key the memory's view and CPU tensor are left under when
        # the owner dies (None: not left); one dict for all (a display costs half an update)
        owner.__dict__ = {"block": block, "gen": block.gen, "kept": kept, "index": device,
                          "cpu": cpu, "views": {} if key is None else {key: cpu},
                          "reuse": reuse, "ctx": ctx, "dev_id": ctx.device_id, "addr": addr}
    except BaseException:
        if kept is None:
            free_block_from_gc(ctx, block, block.gen)
        else:
            free_from_gc(kept)
        raise
    # the entry goes when the memory does (_Owner.__del__), not through a weakref callback
    _live[addr] = weakref.ref(owner)
    return owner


_UNRECORDED = "an npu tensor's storage (its line is recorded while NPUSIM_STREAM_CHECK is on)"


def cpu_bytes(owner: _Owner) -> torch.Tensor:
    """A uint8 CPU tensor on all the bytes of ``owner``'s allocation."""
    st = owner.cpu.untyped_storage()
    return torch.empty((0,), dtype=torch.uint8).set_(st, 0, (st.nbytes(),), (1,))


def owner_of(t: torch.Tensor) -> _Owner | None:
    """The _Owner of an npu tensor's storage (None for a storage without bytes)."""
    ref = _live.get(storage_addr(t))
    return ref() if ref is not None else None


def storage_addr(t: torch.Tensor) -> int:
    """The address of ``t``'s storage, without ``t.untyped_storage()``: the Python storage
    object that call makes is kept alive by the storage from then on (torch preserves it), so
    the storage's use count stays 2 and autograd no longer accumulates a gradient into it in
    place (``can_accumulate_inplace``: a 1 MB ``add_`` becomes an allocation and an ``add``).
    A tensor without elements has no data pointer (0): its storage is asked, as no gradient is
    accumulated into it."""
    if not t.numel():
        return t.untyped_storage().data_ptr()
    return t.data_ptr() - t.storage_offset() * t.element_size()


def empty_strided(size, stride, dtype: torch.dtype, device: int) -> torch.Tensor:
    """An uninitialised npu tensor with these sizes and strides (the current runtime device
    must be ``device``)."""
    size, stride = tuple(size), tuple(stride)
    npdt = NUMPY_DTYPES.get(dtype)
    if npdt is not None:
        c = contiguous_layout(size)
        if stride == c[0] and c[1]:
            return empty_contiguous(size, dtype, device, npdt, c[1])
    check_sizes(size, stride)
    item = ITEMSIZE.get(dtype) or torch.empty((), dtype=dtype).element_size()
    numel_span = element_span(size, stride)
    if numel_span == 0:         # no bytes: a storage of 0 bytes, which resize_ then replaces
        bind_thread()
        # exported with the element size of ``dtype`` (a view to another size needs stride 1)
        base = _from_dlpack(np.empty(0, _SAME_SIZE[item]), device)
        t = _view_dtype.redispatch(_CPU, base, dtype) if base.dtype != dtype else base
        return _as_strided.redispatch(_CPU, t, size, stride, 0)
    base = new_storage_tensor(numel_span * item, device)
    t = _view_dtype.redispatch(_CPU, base, dtype) if dtype != torch.uint8 else base
    return _as_strided.redispatch(_CPU, t, size, stride, 0)


def empty_with_view(size: tuple, stride: tuple, dtype: torch.dtype, device: int) -> tuple:
    """``(empty_strided(...), its shared CPU view)``: an operator's result and what its CPU
    kernel writes through."""
    npdt = NUMPY_DTYPES.get(dtype)
    if npdt is not None:
        c = _CONTIGUOUS.get(size) or contiguous_layout(size)
        if stride == c[0] and c[1]:
            owner = _owner(c[1] * ITEMSIZE[dtype], device, npdt, size, (dtype, 0, size, stride))
            return _from_dlpack(owner, device), owner.cpu
    t = empty_strided(size, stride, dtype, device)
    return t, shared_cpu_view(t)


def empty_contiguous(size: tuple, dtype: torch.dtype, device: int, npdt=None,
                     numel: int = 0) -> torch.Tensor:
    """``empty_strided`` of contiguous strides, a dtype numpy has (``npdt``) and ``numel`` > 0
    elements, in one step: the allocation exported with its dtype and shape (the _Owner is that
    numpy view), without two redispatches. ``owner.cpu`` is its shared CPU view, made here at
    no cost (an operator's result is written through it next)."""
    if npdt is None:
        npdt = NUMPY_DTYPES[dtype]
        numel = contiguous_layout(size)[1]
    owner = _owner(numel * ITEMSIZE[dtype], device, npdt, size,
                   (dtype, 0, size, _CONTIGUOUS[size][0]))
    return _from_dlpack(owner, device)


_CONTIGUOUS: dict = {}            # sizes -> (contiguous strides, number of elements)


def check_sizes(size, stride=()) -> None:
    """The CPU's errors, in its words, for sizes or strides no tensor can have."""
    for x in size:
        if x < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {x}: "
                               f"{list(size)}")
    if any(x < 0 for x in stride):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)} and "
                           f"strides={list(stride)}")


def contiguous_layout(size: tuple) -> tuple:
    """(contiguous strides, number of elements) of ``size`` (a tuple), remembered: a training
    step allocates the same few shapes again and again."""
    c = _CONTIGUOUS.get(size)
    if c is None:
        check_sizes(size)
        if len(_CONTIGUOUS) >= 4096:
            _CONTIGUOUS.clear()
        n = 1
        for x in size:
            n *= x
        c = _CONTIGUOUS[size] = (contiguous_strides(size), n)
    return c


# the element size of each dtype an npu storage holds (factories.py: the dtypes it allocates)
ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


_SAME_SIZE = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64, 16: np.complex128}

NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
          torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
          torch.uint8: np.uint8, torch.bool: np.bool_}


def element_span(size, stride) -> int:
    """Elements from the first to one past the last that ``size`` / ``stride`` reach (0: none)."""
    if 0 in size:
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(size, stride))


def contiguous_strides(size) -> tuple:
    strides, acc = [], 1
    for n in reversed(tuple(size)):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def cpu_view(t: torch.Tensor, owner: _Owner | None = None) -> torch.Tensor:
    """A CPU tensor on the bytes of npu tensor ``t``: same dtype, sizes, strides and offset.

    Raises runtime.errors.MemoryAccessError when the memory is gone (its device was reset).
    """
    if owner is None:
        owner = owner_of(t)
    if owner is None:               # no bytes: a CPU tensor of the same (empty) shape
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype)
    runtime.buffer_nbytes(owner.dev)          # validates: live, and its device not reset
    out = torch.empty((0,), dtype=t.dtype)
    out = out.set_(owner.cpu.untyped_storage(), t.storage_offset(), t.size(), t.stride())
    return _bits(t, out) if t.is_conj() or t.is_neg() else out


def _bits(t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """CPU view ``v`` with npu tensor ``t``'s conjugate and negative bits (a lazy ``conj()``,
    ``_neg_view``). The bits' fallbacks let some operators through with them (``mm``, ``add``:
    their CPU kernels take the bits into account); a view without them made ``a.conj() @ b``
    compute ``a @ b`` on npu."""
    if t.is_conj():
        v = v.conj()
    if t.is_neg():
        v = torch._neg_view(v)
    return v


_VIEWS_PER_STORAGE = 8


def shared_cpu_view(t: torch.Tensor) -> torch.Tensor:
    """``cpu_view(t)``, cached on the storage's _Owner by (dtype, offset, sizes, strides): the
    operators of a training step read the same few tensors again and again, and a new view
    costs more than a small CPU kernel. The view is shared: a caller must not change its
    metadata, or must ``forget_cpu_view(t)`` when a kernel did (a resized ``out=``). The cache
    dies with the storage (it lives on the _Owner), so a view never outlives its bytes; every
    view of a storage is on the one CPU storage ``owner.cpu``'s, so torch's overlap checks see
    two views of the same bytes as such. Validates the memory on every call (MemoryAccessError
    after a reset of its device): a cheap comparison of the device's context with the one it was
    allocated from, and the full check (which names the error) when it changed.
    """
    ref = _live.get(t.data_ptr() - t.storage_offset() * t.element_size())   # storage_addr
    owner = ref() if ref is not None else None
    if owner is None:
        return cpu_view(t, None)
    if contexts_by_device.get(owner.dev_id) is not owner.ctx:
        runtime.buffer_nbytes(owner.dev)        # raises MemoryAccessError naming the reset
    key = (t.dtype, t.storage_offset(), t.size(), t.stride())
    views = owner.views
    v = views.get(key)
    if v is None:
        if len(views) >= _VIEWS_PER_STORAGE:
            views.clear()
        v = views[key] = torch.empty((0,), dtype=t.dtype).set_(
            owner.cpu.untyped_storage(), key[1], key[2], key[3])
    if t.is_conj() or t.is_neg():
        return _bits(t, v)
    return v


def forget_cpu_view(t: torch.Tensor) -> None:
    """Drop ``shared_cpu_view(t)`` from the cache (its metadata was changed by a kernel)."""
    owner = owner_of(t)
    if owner is not None:
        owner.views.pop((t.dtype, t.storage_offset(), t.size(), t.stride()), None)
        owner.__dict__["reuse"] = None          # ``owner.cpu`` may be the one changed: not
        #                                         left with the memory for another result


def resize_bytes(st, nbytes) -> None:
    """``UntypedStorage.resize_(nbytes)`` for an npu storage, in place: every tensor on the
    storage sees the new bytes (FSDP2 frees a gathered parameter with ``resize_(0)`` and
    allocates it again with ``resize_(n)``). The first ``min(old, new)`` bytes are kept, as torch
    keeps them; the old allocation goes back to the pool in its stream's order.

    torch's own ``resize_`` asks the PrivateUse1 hooks (``resizePrivateUse1Bytes``), which a
    Python backend cannot implement (torch/csrc/acc/Module.cpp forwards three hooks only); the
    storage's allocation is swapped instead with torch's ``_swap_data_ptr_``, which takes two
    storages of one device when one of them has 0 bytes. ``install_storage_resize`` routes
    ``torch.UntypedStorage.resize_`` of npu storages here.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        try:
            nbytes = int(nbytes)            # a SymInt / numpy integer
        except (TypeError, ValueError):
            raise TypeError(f"UntypedStorage.resize_(size={nbytes!r}): expected an int") from None
    if nbytes < 0:
        raise ValueError(f"UntypedStorage.resize_(size={nbytes}): size must be >= 0")
    have = st.nbytes()
    if nbytes == have:
        return
    d = st.device.index
    with _on(d):
        new = new_storage_tensor(nbytes, d).untyped_storage() if nbytes else None
        keep = min(have, nbytes)
        if keep:
            s = runtime.current_stream()
            if not s.idle():
                s.synchronize()             # the old bytes as the stream's work leaves them
            ref = _live.get(st.data_ptr())
            old = ref() if ref is not None else None
            if old is not None:
                cpu_bytes(_live[new.data_ptr()]())[:keep].copy_(cpu_bytes(old)[:keep])
        if have:                            # st gets 0 bytes; the old allocation dies with tmp
            tmp = _from_dlpack(np.empty(0, np.uint8), d).untyped_storage()
            st._swap_data_ptr_(tmp)
            del tmp
        if new is not None:
            st._swap_data_ptr_(new)


_base_storage_resize = None


def install_storage_resize() -> None:
    """Route ``torch.UntypedStorage.resize_`` of npu storages to ``resize_bytes`` (once); other
    storages keep torch's method. The one route a Python backend has (see resize_bytes)."""
    global _base_storage_resize
    if _base_storage_resize is not None:
        return
    _base_storage_resize = torch.UntypedStorage.resize_

    def resize_(self, size):
        if self.device.type == "npu":
            resize_bytes(self, size)
            return self
        return _base_storage_resize(self, size)
    resize_.__doc__ = _base_storage_resize.__doc__
    torch.UntypedStorage.resize_ = resize_


_base_storage_new = None


def install_storage_new() -> None:
    """Route ``torch.UntypedStorage(n, device="npu")`` (what ``UntypedStorage.clone`` and so
    ``copy.deepcopy`` of an npu tensor call) to an npu tensor's storage (once). torch would ask
    the C++ allocator of the PrivateUse1 key, which a Python backend cannot register: the
    process crashed there. Other storages keep torch's constructor."""
    global _base_storage_new
    if _base_storage_new is not None:
        return
    _base_storage_new = torch._C.StorageBase.__new__

    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        if device is None or torch.device(device).type != "npu" or \
                cls is not torch.UntypedStorage:
            return _base_storage_new(cls, *args, **kwargs)
        data = args[0] if args else 0
        if isinstance(data, int) and not isinstance(data, bool):
            if data < 0:
                raise RuntimeError(f"UntypedStorage: size={data} must be non-negative")
            return torch.empty(data, dtype=torch.uint8, device=device).untyped_storage()
        host = torch.tensor(list(data), dtype=torch.uint8)      # a sequence of bytes
        return host.to(device).untyped_storage()
    torch.UntypedStorage.__new__ = __new__


def span(t: torch.Tensor, owner: _Owner):
    """``(DevicePtr, nbytes)`` of the bytes ``t`` can reach, for the stream sanitizer."""
    item = t.element_size()
    n = 1
    for s, st in zip(t.size(), t.stride()):
        if s == 0:
            return None
        n += (s - 1) * st
    return (owner.dev.ptr + t.storage_offset() * item, n * item)
