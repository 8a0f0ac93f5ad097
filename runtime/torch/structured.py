"""A structured operator's npu kernel in one Python call (``structured_kernel``).

Design note. For a functional structured operator (``add.Tensor``, ``mm``, ``sum.dim_IntList``:
kernels.py's ``_STRUCTURED``) torch gives a new backend a composite that calls the device twice:
``empty_strided`` for the result (sizes and strides from the meta function), then the ``out=``
form through the fallback. npusim registers one Python kernel instead, which does the same: the
result's metadata from the operator on meta tensors, remembered per argument signature (the
tensors' devices, dtypes, sizes and strides; the other arguments' types and values; torch's
default dtype), the result allocated with its CPU view (storage.empty_with_view), then, on an
idle stream with nothing recording, the ``out=`` form's CPU kernel on the shared views
(``_into``); otherwise the fallback takes the ``out=`` form (task path, capture, sanitizer
records as for any operator). The same kernel into the same layout: the same bits. A call the
signature does not cover (a CPU tensor with dimensions, also in a list, two devices) or whose
meta kernel raises takes the fallback with the functional operator, which raises torch's CPU
error. Measured (benchmarks/npu_ops.py, 64x64 ``a + b``): 42 us before, 22 us after, against 1.8
us on CPU; the floor of a Python device (benchmarks/npu_floor.py: this algorithm without the
pool, the stream and the checks) takes 15 us (docs/figures.md, "npu-ops").
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from runtime import hooks

from . import device as _device
from . import storage as S
from .ops import (OpInfo, rgraph, fallback, follow, idle_stream_on, info, map_npu, meta_like,
                  scalar_overload, wrapped_numbers)

_Tensor = torch.Tensor
_SEQ = (list, tuple)
_shared_view = S.shared_cpu_view
_default_dtype = torch.get_default_dtype

_BUILTIN = type(torch.add)     # torch's C++ bindings
_META: dict = {}              # (operator, its arguments' signature) -> the result's metadata
_META_MAX = 8192


def structured_kernel(op, out_op):
    """The npu kernel of ``op``, a functional structured operator (``add.Tensor``) whose ``out=``
    form is ``out_op`` (``add.out``): what torch's composite for a new backend does (allocate
    the result from the meta function's sizes and strides, then run ``out_op`` into it) in one
    Python call instead of two trips through the dispatcher (``empty_strided``, then the
    fallback). The result's metadata comes from ``op`` on meta tensors, remembered per argument
    signature (devices, dtypes, sizes, strides of the tensors; type and value of the rest;
    torch's default dtype): a
    training step calls the same operators on the same shapes again and again; where the meta
    kernel raises (shapes that do not fit), the fallback runs ``op`` and raises the CPU's
    error, in the CPU's words. The same
    kernel (``out_op``'s CPU kernel into a result of the same sizes and strides), so the same
    bits; anything unusual (a CPU tensor with dimensions mixed in, two devices)
    takes the fallback with ``op`` itself, which names the error."""
    oi = info(out_op)
    out_name = out_op._schema.arguments[-1].name      # out, grad_input

    def kernel(*args, **kwargs):
        key, dev = _signature(op, args, kwargs)
        if key is None:
            return fallback(op, *args, **kwargs)
        try:
            m = _META.get(key)
        except TypeError:       # an argument that cannot be a key: the fallback takes it
            return fallback(op, *args, **kwargs)
        if m is None:
            m = _meta(op, out_op, oi, key, args, kwargs)
            if m is None:   # shapes that do not fit: the CPU kernel names them (meta's words
                return fallback(op, *args, **kwargs)    # differ), or runs what meta lacks
        size, stride, dtype, run, call = m
        # the common case: the thread's device, its stream idle, nothing recording or capturing
        # (the fallback's own conditions for ``_now``); ``run``: the out= form, or its overload
        # for the Python numbers among the arguments (the fallback's choice: scalar_overload)
        if run is not None and hooks.profiler is None and hooks.stream_check is None and \
                not rgraph.active and idle_stream_on(dev):
            out, c = S.empty_with_view(size, stride, dtype, dev)
            return _into(call, out_name, args, kwargs, out, c, size, stride)
        if dev == _device.current():
            out = S.empty_strided(size, stride, dtype, dev)
        else:
            with _device.on(dev):
                out = S.empty_strided(size, stride, dtype, dev)
        kwargs[out_name] = out
        return fallback(out_op, *args, **kwargs)
    kernel.__name__ = f"npu_{op._schema.name.split('::')[-1]}"
    return kernel


def _meta(op, out_op, oi: OpInfo, key, args, kwargs):
    """The result's (sizes, strides, dtype, the out= operator to run: ``out_op`` or, for Python
    numbers among the arguments, its Scalar overload as the fallback picks it; None when there
    is none) for ``op`` on these arguments, from its meta kernel (remembered under ``key``);
    None when the meta raises."""
    mop, run = op, out_op
    i = info(op)
    if i.packet is not None:            # a Python number: the Scalar overloads
        numbers = wrapped_numbers(i, args, kwargs)
        if numbers:
            mop = i.packet.get(numbers) or i.packet.setdefault(
                numbers, scalar_overload(op, numbers))
            run = None if oi.packet is None else oi.packet.get(numbers) or \
                oi.packet.setdefault(numbers, scalar_overload(out_op, numbers))
    margs, mkwargs = map_npu(args, kwargs, meta_like)
    try:
        r = mop(*margs, **mkwargs)
    except Exception:
        return None
    call = run if run is None else _binding(run, margs, mkwargs, r)
    if len(_META) >= _META_MAX:
        _META.clear()
    m = _META[key] = (tuple(r.size()), tuple(r.stride()), r.dtype, run, call)
    return m


class _Seen(TorchDispatchMode):
    """The operators a call dispatches (``_binding``'s check)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _binding(run, margs, mkwargs, r):
    """What ``_into`` calls for ``run`` (an ``out=`` overload) on these arguments: torch's
    Python function of the same name (``torch.add(a, b, out=c)``) when, given the same arguments
    (on meta tensors), it dispatches exactly ``run`` and nothing else; else ``run`` itself. The
    function parses its arguments in C++ and calls the kernel unboxed: a 64x64 ``add.out`` costs
    1.55 us through ``torch.add`` against 2.6 us through the OpOverload (its Python ``__call__``
    and the boxed call), the same kernel, so the same bits. Decided once per argument signature
    (the overload a Python function picks depends on the arguments' types)."""
    name = run._schema.name.split("::")[-1]
    fn = getattr(torch, name, None)
    if type(fn) is not _BUILTIN:        # none, or a Python wrapper (a patched torch.add)
        return run
    out_name = run._schema.arguments[-1].name
    try:
        out = torch.empty_strided(r.size(), r.stride(), dtype=r.dtype, device="meta")
        seen = _Seen()
        with seen:
            fn(*margs, **mkwargs, **{out_name: out})
    except Exception:
        return run
    if seen.ops != [run]:
        return run
    return fn


def _into(out_op, out_name, args, kwargs, out, c, size, stride):
    """``out_op``'s CPU kernel on the arguments' shared CPU views into ``c``, the view of
    ``out``, a new npu tensor of the meta's sizes and strides (structured_kernel's common case:
    ``_signature`` checked the devices, the caller the stream); ``out``."""
    # a tensor here is an npu one or a 0-dim CPU one (``_signature``): the first, inline
    cargs = [_shared_view(a) if isinstance(a, _Tensor) and a.get_device() >= 0 else _cpu_of(a)
             for a in args]
    if kwargs:
        ckwargs = {k: _cpu_of(v) for k, v in kwargs.items()}
        ckwargs[out_name] = c
        out_op(*cargs, **ckwargs)
    else:
        out_op(*cargs, **{out_name: c})
    if c.size() != size or c.stride() != stride:    # never seen: a kernel that restrided it
        S.forget_cpu_view(out)
        follow(out, c)
    return out


def _signature(op, args, kwargs):
    """(the key of ``op``'s result metadata for these arguments, the npu device index), or
    (None, -1) when the call is unusual (see structured_kernel)."""
    key = [op]
    dev = -1
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, _Tensor):
            d = a.get_device()
            if d < 0:
                if a.dim():
                    return None, -1
            elif d != dev:
                if dev >= 0:
                    return None, -1
                dev = d
            key.append((d, a.dtype, a.size(), a.stride()))
        elif type(a) in _SEQ:             # sizes, dims; a list of npu tensors (cat)
            sub = []
            for b in a:
                if isinstance(b, _Tensor):
                    d = b.get_device()
                    if d < 0 or d != dev and dev >= 0:
                        return None, -1
                    dev = d
                    sub.append((d, b.dtype, b.size(), b.stride()))
                else:
                    sub.append((type(b), b))
            key.append((type(a), tuple(sub)))
        else:
            key.append((type(a), a))
    if dev < 0:
        return None, -1
    if kwargs:
        key.append(tuple(kwargs))
    key.append(_default_dtype())      # an int / int or int + float result's dtype follows it
    return tuple(key), dev


def _cpu_of(a):
    """``a`` with its npu tensors (also in a list) as their shared CPU views (``_into``)."""
    if isinstance(a, _Tensor):
        return _shared_view(a) if a.get_device() >= 0 else a
    if type(a) in _SEQ:
        for b in a:
            if isinstance(b, _Tensor):
                return type(a)(_shared_view(x) if isinstance(x, _Tensor) else x for x in a)
    return a


def out_form(op):
    """The ``out=`` overload of functional operator ``op`` (its arguments and one kwarg-only
    written Tensor: ``out``, ``grad_input``; one Tensor result), or None."""
    packet = getattr(torch.ops.aten, op._schema.name.split("::")[-1])
    want = [(a.name, str(a.type)) for a in op._schema.arguments]
    if len(op._schema.returns) != 1 or str(op._schema.returns[0].type) != "Tensor":
        return None
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        args = cand._schema.arguments
        last = args[-1]
        if [(a.name, str(a.type)) for a in args[:-1]] == want and last.kwarg_only and \
                last.alias_info is not None and last.alias_info.is_write and \
                len(cand._schema.returns) == 1:
            return cand
    return None
