"""The floor of a Python PrivateUse1 device: the fewest Python calls an npu operator can make.

    python benchmarks/npu_floor.py [--rounds 5] [--calls 300] [--threads 1] [--steps 15]
                                                                     (prints JSON)

The barest device torch's Python route allows, in this process only (PrivateUse1 can be renamed
once per process: ``benchmarks/npu_ops.py --floor`` runs this file as a child): torch's
``_setup_privateuseone_for_python_backend`` with its dummy hooks and guard, the device named
``npu``, and the same algorithm as npusim's operators (runtime/torch/ops.py, structured.py)
with everything a device needs beyond the work itself taken out:

- memory: ``np.empty`` of the result's dtype and shape exported through DLPack with the device
  kDLExtDev (torch's PrivateUse1), its CPU tensor made at once (``torch.from_numpy``) as the
  view the kernel writes through; no pool, no statistics, no stream, no context, no device
  index, no check that the memory is live. A registry maps a storage's address to its owner (a
  weak reference with no callback: an address is simply registered again when reused);
- a CPU view of an npu tensor: cached on the owner per (dtype, offset, sizes, strides), as
  npusim caches them (``set_`` on the owner's CPU storage the first time);
- a functional structured operator (runtime/torch/kernels.py ``_STRUCTURED``: ``add.Tensor``,
  ``mm``, ``_softmax`` ...): one Python kernel, as npusim's: the result's sizes, strides and
  dtype from the meta kernel remembered per argument signature, the result allocated, the
  ``out=`` form's CPU kernel run on the views into it, through torch's function of its name
  where that dispatches the same overload (``torch.add(a, b, out=c)``: structured._binding); a
  call the meta kernel refuses takes the fallback;
- one boxed fallback for the rest: a view operator runs torch's CPU kernel on the tensor itself;
  any other runs torch's CPU kernel on the views and copies a new result into a new npu tensor
  (a written argument is returned as itself); no stream order, no profiler / sanitizer / graph
  checks, no wrapped-number overloads, no ``out=`` resize handling;
- the same dispatch table as npusim's device for the operators torch would decompose
  (kernels.py's lists: layer norm, ``_foreach_*``... take the CPU kernel through the fallback),
  so the floor runs the same CPU kernels as npusim's operator;
- ``empty.memory_format``, ``empty_strided``, ``_copy_from`` and ``clone`` (as npusim's: one
  call) as kernels of their own;
  ``scaled_dot_product_attention`` as npusim's (runtime/torch/attention.py: the CPU's fused
  kernel where the CPU picks it).

It is a measuring stick, not a device: what is left between npusim and it is the device's own
work (the pool and its statistics, stream order, the device index, the memory checks, the
recorders' switches). It prints, per operator of ``benchmarks/npu_ops.py``, the CPU eager and
floor microseconds (the best round's mean of process CPU time, interleaved as npu_ops.py does),
and with ``--steps`` npu_ops.py's training step on the floor device against CPU eager.
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import sys
import weakref

import numpy as np
import torch

_KDL_EXT_DEV = 12
_DL_DEVICE = (ctypes.c_int32 * 2)(_KDL_EXT_DEV, 0)
_CPU_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
# PyCapsule_GetPointer through a prototype of its own (as runtime/torch/storage.py): the shared
# ctypes.pythonapi function keeps its restype and argtypes
_capsule_ptr = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_Tensor = torch.Tensor
_live: dict = {}                  # storage address -> weakref to its _Owner
_binding = None                   # structured._binding, set by install()


class _Owner(np.ndarray):
    """The numpy array a floor storage keeps alive; ``cpu``: the CPU tensor on its bytes,
    ``views``: its CPU views by (dtype, offset, sizes, strides)."""


def _export(arr: np.ndarray) -> torch.Tensor:
    cap = arr.__dlpack__()
    ctypes.memmove(_capsule_ptr(cap, b"dltensor") + 8, _DL_DEVICE, 8)
    return torch.from_dlpack(cap)


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64,
          torch.int32: np.int32, torch.bool: np.bool_, torch.uint8: np.uint8,
          torch.float16: np.float16, torch.int8: np.int8, torch.int16: np.int16}


_ITEM = {d: torch.empty((), dtype=d).element_size() for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


def _contiguous(size) -> tuple:
    strides, acc = [], 1
    for n in reversed(size):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _owner(base: np.ndarray, key) -> _Owner:
    """``base`` as a registered owner; its CPU tensor ``cpu`` is the view of ``key``."""
    cpu = torch.from_numpy(base)              # holds ``base``, never the owner (no cycle)
    owner = base.view(_Owner)
    owner.cpu = cpu
    owner.views = {key: cpu} if key is not None else {}
    _live[cpu.data_ptr()] = weakref.ref(owner)
    return owner


def empty_with_view(size: tuple, stride: tuple, dtype) -> tuple:
    """(a new npu tensor, its CPU view)."""
    npdt = _NUMPY.get(dtype)
    if npdt is not None and 0 not in size and stride == _contiguous(size):
        owner = _owner(np.empty(size, npdt), (dtype, 0, size, stride))
        return _export(owner), owner.cpu
    t = empty_strided(size, stride, dtype)
    return t, cpu_view(t)


def empty_strided(size, stride, dtype=None, **_):
    dtype = dtype or torch.get_default_dtype()
    size, stride = tuple(size), tuple(stride)
    npdt = _NUMPY.get(dtype)
    if npdt is not None and 0 not in size and stride == _contiguous(size):
        return _export(_owner(np.empty(size, npdt), (dtype, 0, size, stride)))
    item = _ITEM.get(dtype) or torch.empty((), dtype=dtype).element_size()
    span = 0 if 0 in size else 1 + sum((n - 1) * s for n, s in zip(size, stride))
    t = _export(_owner(np.empty(max(span, 1) * item, np.uint8), None))
    if dtype != torch.uint8:
        t = torch.ops.aten.view.dtype.redispatch(_CPU_KS, t, dtype)
    return torch.ops.aten.as_strided.default.redispatch(_CPU_KS, t, size, stride, 0)


def empty_memory_format(size, dtype=None, memory_format=None, **_):
    size = tuple(size)
    return empty_strided(size, _contiguous(size), dtype)


def cpu_view(t: torch.Tensor) -> torch.Tensor:
    owner = _live[t.untyped_storage().data_ptr()]()
    key = (t.dtype, t.storage_offset(), t.size(), t.stride())
    v = owner.views.get(key)
    if v is None:
        v = owner.views[key] = torch.empty((0,), dtype=t.dtype).set_(
            owner.cpu.untyped_storage(), key[1], key[2], key[3])
    return v


def copy_from(src, dst, non_blocking=False):
    s = cpu_view(src) if src.device.type == "npu" else src
    d = cpu_view(dst) if dst.device.type == "npu" else dst
    d.copy_(s)
    return dst


@functools.lru_cache(maxsize=None)
def _schema(op):
    rets = op._schema.returns
    view = any(r.alias_info is not None and not r.alias_info.is_write for r in rets)
    factory = any(a.name == "device" for a in op._schema.arguments)
    return view, factory


def _swap(a):
    if isinstance(a, _Tensor):
        return cpu_view(a) if a.device.type == "npu" else a
    if isinstance(a, (list, tuple)) and any(isinstance(b, _Tensor) for b in a):
        return type(a)(_swap(b) for b in a)
    return a


def fallback(op, *args, **kwargs):
    view, factory = _schema(op)
    if view:
        return op.redispatch(_CPU_KS, *args, **kwargs)
    cargs = [_swap(a) for a in args]
    ckwargs = {k: _swap(v) for k, v in kwargs.items()}
    if factory:
        ckwargs["device"] = "cpu"
    back = {id(c): a for a, c in zip(args, cargs) if c is not a}
    back.update((id(ckwargs[k]), v) for k, v in kwargs.items() if ckwargs[k] is not v)
    out = op(*cargs, **ckwargs)

    def to_npu(r):
        a = back.get(id(r))
        if a is not None:
            return a
        t, c = empty_with_view(tuple(r.size()), r.stride() if r.is_contiguous() else
                               _contiguous(tuple(r.size())), r.dtype)
        c.copy_(r)
        return t
    if isinstance(out, _Tensor):
        return to_npu(out)
    if isinstance(out, (list, tuple)):
        return type(out)(to_npu(o) if isinstance(o, _Tensor) else o for o in out)
    return out


_META: dict = {}              # (op, argument signature) -> (sizes, strides, dtype) or None


def _key(op, args, kwargs):
    key = [op]
    for a in (*args, *kwargs.values()):
        if isinstance(a, _Tensor):
            key.append((a.dtype, a.size(), a.stride()))
        elif type(a) in (list, tuple):
            key.append(tuple((b.dtype, b.size(), b.stride()) if isinstance(b, _Tensor)
                             else b for b in a))
        else:
            key.append(a)
    key.append(tuple(kwargs))
    return tuple(key)


def _meta(a):
    if isinstance(a, _Tensor):
        return torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device="meta")
    if type(a) in (list, tuple):
        return type(a)(_meta(b) for b in a)
    return a


def structured(op, out_op):
    """The floor's kernel of a functional structured operator (see the note)."""
    out_name = out_op._schema.arguments[-1].name

    def kernel(*args, **kwargs):
        key = _key(op, args, kwargs)
        m = _META.get(key, False)
        if m is False:
            try:
                margs = [_meta(a) for a in args]
                mkwargs = {k: _meta(v) for k, v in kwargs.items()}
                r = op(*margs, **mkwargs)
                # the out= form through torch's function where it dispatches the same (npusim's
                # route: structured._binding)
                m = (tuple(r.size()), tuple(r.stride()), r.dtype,
                     _binding(out_op, margs, mkwargs, r))
            except Exception:
                m = None
            _META[key] = m
        if m is None:
            return fallback(op, *args, **kwargs)
        out, c = empty_with_view(*m[:3])
        ckwargs = {k: _swap(v) for k, v in kwargs.items()}
        ckwargs[out_name] = c
        m[3](*[_swap(a) for a in args], **ckwargs)
        return out
    return kernel


_clone = torch.ops.aten.clone.default


def clone(self, *, memory_format=None):
    """One Python call, as npusim's (kernels.clone): the CPU's strides, the CPU's copy."""
    if memory_format is None or memory_format == torch.preserve_format:
        stride = tuple(self.stride())
        if not self.is_contiguous() and not _dense(self.size(), stride):
            return fallback(_clone, self, memory_format=memory_format)
    elif memory_format == torch.contiguous_format:
        stride = _contiguous(tuple(self.size()))
    else:
        return fallback(_clone, self, memory_format=memory_format)
    out, c = empty_with_view(tuple(self.size()), stride, self.dtype)
    c.copy_(cpu_view(self))
    return out


def _dense(size, stride) -> bool:
    expect = 1
    for n, st in sorted(zip(size, stride), key=lambda d: d[1]):
        if n != 1:
            if st != expect:
                return False
            expect *= n
    return True


class _Module:
    """The floor device's torch.npu: what the benchmark calls."""

    @staticmethod
    def synchronize(device=None):
        pass

    @staticmethod
    def is_available():
        return True


_libs: list = []


def install() -> None:
    """Make ``npu`` the floor device in this process (once; PrivateUse1 is renamed for good)."""
    global _binding
    from torch.utils import backend_registration as br
    if torch._C._get_privateuse1_backend_name() != "privateuseone":
        raise RuntimeError("the floor needs a process whose PrivateUse1 backend is not "
                           "registered yet (run this file as its own process)")
    br._setup_privateuseone_for_python_backend("npu", backend_module=_Module())
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(fallback, "PrivateUse1")
    fb.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in (("empty.memory_format", empty_memory_format),
                     ("empty_strided", empty_strided), ("_copy_from", copy_from),
                     ("clone", clone)):
        lib.impl(name, fn, "PrivateUse1")
    # the same operators as npusim's device take their CPU kernel instead of a decomposition
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from runtime.torch.kernels import register_cpu_kernels
    from runtime.torch.structured import _binding
    register_cpu_kernels(lib, structured, fallback)
    # scaled_dot_product_attention as npusim's device takes it: the CPU's fused kernel, not
    # torch's decomposition (runtime/torch/attention.py; it imports nothing of the device)
    from runtime.torch import attention
    attention.register(lib)
    _libs.extend((fb, lib))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="also the training step (its steps)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    install()
    from benchmarks.npu_ops import per_op, training
    ops = per_op(args.rounds, args.calls, sync=_Module.synchronize)
    if args.steps:          # the training step on the floor device, CPU eager alternating
        step = training(args.steps)
        ops["training step (ms)"] = [step["cpu_ms"], step["npu_ms"], step["ratio"],
                                     step["same_loss"]]
    print(json.dumps({"ops": ops}))


if __name__ == "__main__":
    main()
