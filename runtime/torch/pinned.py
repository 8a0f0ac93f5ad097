"""Pinned host memory for the npu device: ``Tensor.pin_memory()``, ``Tensor.is_pinned()``.

A pinned tensor is a CPU tensor whose storage is a ``runtime.malloc_host`` buffer (npusim's
page-locked host memory: an asynchronous copy from it is not staged). ``_live`` maps each
buffer's address to a weak reference of it, so ``is_pinned`` answers True exactly for storages
made here, for as long as they live.

What torch 2.13's Python route to a PrivateUse1 backend allows (docs/torch.md, "Device
contract"): torch asks the backend's C++ hooks for a pinned-memory allocator
(``PrivateUse1HooksInterface::getPinnedMemoryAllocator``) and for ``isPinnedPtr``, and the Python
hooks forward neither (torch/csrc/acc/Module.cpp). So pinning reaches npusim only through
operators it can register: ``_pin_memory`` and ``is_pinned`` for CPU tensors (called only when
pinning is asked for: no cost elsewhere). Allocating pinned memory in a factory
(``torch.empty(..., pin_memory=True)``, and C++ callers such as DDP's
``find_unused_parameters`` path) goes from ``empty``'s CPU kernel straight to the hooks; the one
Python route to it, a kernel for ``empty`` on the BackendSelect key, would run for every CPU
allocation in the process (measured: a CPU training step 1.74 -> 2.79 ms), so npusim takes it
only when asked (``runtime.torch.enable_pinned_factories()``, ``enable_factories`` below);
otherwise those calls keep torch's NotImplementedError.
"""
from __future__ import annotations

import functools
import inspect
import threading
import weakref

import torch

import runtime

from .storage import storage_addr

_lock = threading.Lock()
_live: dict = {}                 # buffer address -> (weakref to the HostBuffer, nbytes)


def _forget(addr: int, ref) -> None:
    with _lock:
        if _live.get(addr, (None,))[0] is ref:
            del _live[addr]


def empty_pinned(size, stride, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor with these sizes and strides on a new pinned host buffer."""
    span = 0 if 0 in tuple(size) else 1 + sum((n - 1) * s for n, s in zip(size, stride))
    buf = runtime.malloc_host(max(span * dtype.itemsize, 1))
    base = torch.from_numpy(buf)                    # its storage keeps the buffer alive
    addr = base.data_ptr()                          # the buffer's address (the storage's)
    ref = weakref.ref(buf, lambda r, a=addr: _forget(a, r))
    with _lock:
        _live[addr] = (ref, buf.nbytes)
    return torch.empty((0,), dtype=dtype).set_(base.untyped_storage(), 0, tuple(size),
                                               tuple(stride))


def is_pinned(t: torch.Tensor) -> bool:
    """True for a tensor whose storage is a live pinned buffer made by ``empty_pinned``.

    Asked of every CPU source of a copy to npu (kernels.py): no pinned buffer alive (most
    processes), no lookup."""
    if not _live or not t.is_cpu:
        return False
    e = _live.get(storage_addr(t))     # not untyped_storage(): see storage.storage_addr
    return e is not None and e[0]() is not None


def pin(t: torch.Tensor) -> torch.Tensor:
    """``t.pin_memory()``: a copy of CPU tensor ``t`` in pinned memory, with its strides (as
    torch's own ``_pin_memory`` keeps them)."""
    if t.layout != torch.strided:
        raise RuntimeError(f"pin_memory: only dense CPU tensors can be pinned (layout={t.layout})")
    # dense, in t's layout: empty_like's strides (a contiguous tensor's are its own, which
    # empty_like keeps; a DataLoader pins contiguous batches every step: 1.3 us less)
    stride = t.stride() if t.is_contiguous() else torch.empty_like(t, device="meta").stride()
    out = empty_pinned(t.size(), stride, t.dtype)
    out.copy_(t)
    return out


# ---------------------------------------------------------------------- pinned factories, opt-in
_factories_lib = None
_CPU_KEY = torch._C.DispatchKey.CPU


def _backend_keyset(dtype, layout, device):
    """The dispatch key torch's BackendSelect kernel computes (c10::computeDispatchKey)."""
    dev = "cpu" if device is None else torch.device(device).type
    base = torch._C._dispatch_key_for_device(dev)
    if layout in (None, torch.strided):
        name = base
    elif layout == torch.sparse_coo:
        name = "Sparse" + base
    elif layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        name = "SparseCsr" + base
    elif layout == torch._mkldnn:
        name = "MkldnnCPU"
    else:
        raise RuntimeError(f"npusim's pinned-memory factories: unsupported layout {layout}")
    return torch._C.DispatchKeySet(torch._C._parse_dispatch_key(name))


def _wants_pinned(pin_memory, layout, device) -> bool:
    return bool(pin_memory) and layout in (None, torch.strided) and \
        (device is None or torch.device(device).type == "cpu")


def _empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    if _wants_pinned(pin_memory, layout, device):
        dtype = dtype or torch.get_default_dtype()
        stride = torch.empty(size, dtype=dtype, device="meta",
                             memory_format=memory_format or torch.contiguous_format).stride()
        return empty_pinned(size, stride, dtype)
    return torch.ops.aten.empty.memory_format.redispatch(
        _backend_keyset(dtype, layout, device), size, dtype=dtype, layout=layout, device=device,
        pin_memory=pin_memory, memory_format=memory_format)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    if _wants_pinned(pin_memory, layout, device):
        return empty_pinned(size, stride, dtype or torch.get_default_dtype())
    return torch.ops.aten.empty_strided.default.redispatch(
        _backend_keyset(dtype, layout, device), size, stride, dtype=dtype, layout=layout,
        device=device, pin_memory=pin_memory)


def enable_factories() -> None:
    """Opt in to pinned memory from factories (``torch.empty(..., pin_memory=True)`` and its C++
    callers: ``DDP(find_unused_parameters=True)``'s reducer, ``static_graph=True``), for the
    whole process, once. It replaces torch's BackendSelect kernels of ``empty`` and
    ``empty_strided`` with Python ones: every dispatched CPU allocation of the process then
    costs a Python call (benchmarks/npu_ops.py's training step: npu 41-44 -> 52 ms, CPU 23.5 ->
    29.9 ms), which is why it is not the default (module note)."""
    global _factories_lib
    if _factories_lib is not None:
        return
    import warnings
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # "Overriding a previously registered kernel"
        lib.impl("empty.memory_format", _empty_memory_format, "BackendSelect")
        lib.impl("empty_strided", _empty_strided, "BackendSelect")
    _factories_lib = lib


def watch_ddp() -> None:
    """Opt in for the users who need it: a ``DistributedDataParallel`` built over npu parameters
    with ``find_unused_parameters=True`` or ``static_graph=True`` (the transformers Trainer's
    default is the first) allocates pinned host memory in its C++ reducer, which without the
    opt-in raises NotImplementedError at the first backward. Building such a DDP therefore
    calls ``enable_factories()`` first; a process that never builds one keeps torch's own
    factories and their speed. Wraps ``DistributedDataParallel.__init__`` once (torch offers
    no hook at DDP construction)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    init = DDP.__init__
    if getattr(init, "_npusim_pinned", False):
        return
    sig = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if _factories_lib is None:
            try:
                a = sig.bind(self, *args, **kwargs).arguments
            except TypeError:           # DDP's own call raises it, naming the argument
                a = {}
            if (a.get("find_unused_parameters") or a.get("static_graph")) and \
                    _on_npu(a.get("module")):
                enable_factories()
        init(self, *args, **kwargs)
    __init__._npusim_pinned = True
    DDP.__init__ = __init__


def _on_npu(module) -> bool:
    params = getattr(module, "parameters", None)
    return params is not None and any(p.device.type == "npu" for p in params())
