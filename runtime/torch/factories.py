"""The npu kernels of the factories and small setup operators: ``arange``, ``zeros``, ``ones``,
``full``, ``scalar_tensor``, ``eye``, ``linspace``, ``zeros_like`` / ``ones_like`` /
``full_like``, ``new_zeros`` / ``new_ones`` / ``new_full``, ``_to_copy`` (what
``torch.tensor(data, device="npu")``, ``t.to("npu")`` and ``t.half()`` reach) and the
attention chooser ``_fused_sdp_choice`` (attention.py).

Design note. torch gives a new backend these operators as CompositeExplicitAutograd kernels
that call the device two or three times: ``zeros`` is ``empty`` then ``zero_`` through the
fallback; ``arange`` is ``empty`` of no elements, then ``arange.start_out`` through the
fallback, whose CPU kernel cannot grow the device memory ("not resizable"), so the fallback ran
it again into a resizable CPU tensor and the npu result followed it (a resize and a copy: 70 us
against 2 us on CPU). Here each is one Python call that does what the composite does, in
torch's own words: the result's sizes and dtype from torch (``arange``'s length and dtype from
its meta kernel, which is the CPU's ``arange_out`` on meta tensors, remembered per argument
signature; ``full``'s dtype from its meta kernel per type of fill value and default dtype), the
result allocated with its CPU view (storage.empty_with_view), then the CPU kernel the
composite's second call runs (``arange(out=)``, ``zero_``, ``fill_``, ``copy_``) on that view:
the same kernels into the same layout, so the same bits.

When. Only in the common case, as kernels.py's and structured.py's fast paths: the thread's
device, its stream idle, nothing recording (``hooks.profiler``), no sanitizer
(``hooks.stream_check``), no graph capture (``runtime.graph.active``), plain arguments (no
``pin_memory``, a strided layout, a dtype npusim stores, sizes torch accepts). Anything else is
torch's composite kernel itself, taken from the dispatcher before these kernels were registered
(``torch.library.get_kernel``): the same calls, task names (``aten::arange.start_out`` in a
trace), captures and errors as before.
"""
from __future__ import annotations

import torch

from runtime import hooks

from . import device as _device
from . import storage as S
from .ops import idle_stream_on, non_overlapping_dense, rgraph

_VF = torch._C._VariableFunctions     # torch's builtins, not a patched torch.arange
_arange = _VF.arange
_choice_cpu = _VF._fused_sdp_choice
_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
_default_dtype = torch.get_default_dtype
_strided = torch.strided
_preserve = torch.preserve_format
_contiguous = torch.contiguous_format
_choice_op = torch.ops.aten._fused_sdp_choice.default

# the dtypes a fast path allocates (the storage's element sizes); others take the composite
_DTYPES = frozenset(S.ITEMSIZE)

_COMPOSITE: dict = {}         # operator name -> torch's kernel for PrivateUse1 before ours
_ARANGE: dict = {}            # arange's arguments -> (length, dtype), from its meta kernel
_FULL: dict = {}              # (type of fill value, default dtype) -> full's dtype
_LINSPACE: dict = {}          # (types of start and end, dtype, default dtype) -> its dtype
_MAX = 4096


def _ready(dev: int) -> bool:
    """The fast paths' condition: ``dev`` is the thread's device, its stream idle, nothing
    recording, checking or capturing."""
    return hooks.profiler is None and hooks.stream_check is None and not rgraph.active and \
        idle_stream_on(dev)


def _plain(layout, pin_memory) -> bool:
    return (layout is None or layout == _strided) and not pin_memory


def _target(device) -> int:
    """The npu device index a factory places its result on (device.py's ``target``); -1 when
    the composite must decide (another device type: torch's own error)."""
    if device is None:
        return _device.current()
    if type(device) is torch.device and device.type == "npu" and not device.index:
        return _device.current()
    try:
        return _device.target(device)
    except Exception:
        return -1


# ---------------------------------------------------------------------- arange
def _arange_meta(start, end, step, dtype):
    """(length, dtype) of ``arange(start, end, step, dtype=dtype)``, from torch's meta kernel
    (the CPU's ``arange_out``), remembered; None when it raises (the composite then raises the
    CPU's error)."""
    key = (type(start), start, type(end), end, type(step), step, dtype, _default_dtype())
    try:
        m = _ARANGE.get(key)
    except TypeError:
        return None
    if m is None:
        try:
            r = _arange(start, end, step, dtype=dtype, device="meta")
        except Exception:
            return None
        if len(_ARANGE) >= _MAX:
            _ARANGE.clear()
        m = _ARANGE[key] = (r.numel(), r.dtype)
    return m


def _arange_fast(name, start, end, step, dtype, layout, device, pin_memory, args, kwargs):
    if _plain(layout, pin_memory):
        dev = _target(device)
        if dev >= 0 and _ready(dev):
            m = _arange_meta(start, end, step, dtype)
            if m is not None and m[0] and m[1] in _DTYPES:    # an empty range: the composite
                n, dt = m                                     # (its kernel judges the dtype)
                out, c = S.empty_with_view((n,), (1,), dt, dev)
                _arange(start, end, step, out=c)      # CPU's arange_out into a right-sized view
                return out
    return _COMPOSITE[name].call_boxed(_KS, *args, **kwargs)


def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_fast("arange", 0, end, 1, dtype, layout, device, pin_memory, (end,),
                        dict(dtype=dtype, layout=layout, device=device, pin_memory=pin_memory))


def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _arange_fast("arange.start", start, end, 1, dtype, layout, device, pin_memory,
                        (start, end),
                        dict(dtype=dtype, layout=layout, device=device, pin_memory=pin_memory))


def arange_start_step(start, end, step=1, *, dtype=None, layout=None, device=None,
                      pin_memory=None):
    return _arange_fast("arange.start_step", start, end, step, dtype, layout, device,
                        pin_memory, (start, end, step),
                        dict(dtype=dtype, layout=layout, device=device, pin_memory=pin_memory))


# ---------------------------------------------------------------------- zeros, ones, full
def _new(size, dtype, dev):
    """(npu tensor, its CPU view or None when it has no elements) of contiguous ``size`` (a
    tuple; a negative size raises the CPU's error: storage.contiguous_layout)."""
    stride, n = S.contiguous_layout(size)
    if not n:
        return S.empty_strided(size, stride, dtype, dev), None
    return S.empty_with_view(size, stride, dtype, dev)


def _fill(r: tuple, value) -> torch.Tensor:
    """The new result ``r`` (the npu tensor, its CPU view or None when it has no elements) filled
    with ``value``: the npu tensor. A fill of no elements still converts ``value`` to the dtype:
    the CPU's error for a value out of its range (``full((0,), 300, dtype=int8)``), as the
    composite's ``fill_`` raises it."""
    if r[1] is not None:
        r[1].fill_(value)
    else:
        torch.empty(0, dtype=r[0].dtype).fill_(value)
    return r[0]


def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.zeros(..., device="npu")``: the composite's ``empty`` then ``zero_`` (a negative
    size: the composite, which checks it first in its own words)."""
    size = tuple(size)
    if _plain(layout, pin_memory) and (not size or min(size) >= 0):
        dt = dtype or _default_dtype()
        dev = _target(device)
        if dt in _DTYPES and dev >= 0 and _ready(dev):
            r = _new(size, dt, dev)
            if r[1] is not None:
                r[1].zero_()
            return r[0]
    return _COMPOSITE["zeros"].call_boxed(_KS, size, dtype=dtype, layout=layout, device=device,
                                          pin_memory=pin_memory)


def _full_dtype(value):
    """``full``'s dtype for fill value ``value`` given no dtype (torch's inference: bool, int64,
    the default dtype or its complex type), from its meta kernel, remembered."""
    key = (type(value), _default_dtype())
    dt = _FULL.get(key)
    if dt is None:
        dt = _FULL[key] = _VF.full((), value, device="meta").dtype
    return dt


def _filled(size, value, dtype, layout, device, pin_memory):
    """``full`` / ``ones`` (``value`` 1.0, as torch's ones calls full): ``empty`` then
    ``fill_``."""
    size = tuple(size)
    if _plain(layout, pin_memory):
        dev = _target(device)
        if dev >= 0 and _ready(dev):
            dt = dtype or _full_dtype(value)
            if dt in _DTYPES:
                return _fill(_new(size, dt, dev), value)
    return None


def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    out = _filled(size, 1.0, dtype, layout, device, pin_memory)
    if out is not None:
        return out
    return _COMPOSITE["ones"].call_boxed(_KS, size, dtype=dtype, layout=layout, device=device,
                                         pin_memory=pin_memory)


def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    out = _filled(size, fill_value, dtype, layout, device, pin_memory)
    if out is not None:
        return out
    return _COMPOSITE["full"].call_boxed(_KS, size, fill_value, dtype=dtype, layout=layout,
                                         device=device, pin_memory=pin_memory)


def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.scalar_tensor``: a 0-dim tensor of ``dtype`` (the default dtype when None)
    filled with ``s``."""
    if _plain(layout, pin_memory):
        dt = dtype or _default_dtype()
        dev = _target(device)
        if dt in _DTYPES and dev >= 0 and _ready(dev):
            out, c = S.empty_with_view((), (), dt, dev)
            c.fill_(s)
            return out
    return _COMPOSITE["scalar_tensor"].call_boxed(_KS, s, dtype=dtype, layout=layout,
                                                  device=device, pin_memory=pin_memory)


def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _eye("eye", n, n, (n,), dtype, layout, device, pin_memory)


def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _eye("eye.m", n, m, (n, m), dtype, layout, device, pin_memory)


def _eye(name, n, m, args, dtype, layout, device, pin_memory):
    """``torch.eye``: the composite's ``eye.m_out`` (zero, then the diagonal), into a result of
    its sizes (the composite's ``empty`` of no elements made the fallback grow it)."""
    if _plain(layout, pin_memory) and type(n) is int and type(m) is int and n >= 0 and m >= 0:
        dt = dtype or _default_dtype()
        dev = _target(device)
        if dt in _DTYPES and dev >= 0 and _ready(dev):
            r = _new((n, m), dt, dev)
            if r[1] is not None:
                _VF.eye(n, m, out=r[1])
            return r[0]
    return _COMPOSITE[name].call_boxed(_KS, *args, dtype=dtype, layout=layout, device=device,
                                       pin_memory=pin_memory)


def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.linspace``: the composite's ``linspace.out`` into a result of ``steps``
    elements, of the dtype torch infers (from its meta kernel, per the types of ``start`` and
    ``end``, ``dtype`` and the default dtype)."""
    if _plain(layout, pin_memory) and type(steps) is int and steps >= 0:
        dev = _target(device)
        if dev >= 0 and _ready(dev):
            key = (type(start), type(end), dtype, _default_dtype())
            dt = _LINSPACE.get(key)
            if dt is None:
                try:
                    dt = _VF.linspace(start, end, 0, dtype=dtype, device="meta").dtype
                except Exception:
                    dt = False
                _LINSPACE[key] = dt
            if dt in _DTYPES:
                r = _new((steps,), dt, dev)
                if r[1] is not None:
                    _VF.linspace(start, end, steps, out=r[1])
                return r[0]
    return _COMPOSITE["linspace"].call_boxed(_KS, start, end, steps, dtype=dtype, layout=layout,
                                             device=device, pin_memory=pin_memory)


# ---------------------------------------------------------------------- new_*
def _new_of(self, size, dtype, layout, device, pin_memory):
    """(npu tensor, its CPU view or None) as ``self.new_empty(size, ...)`` makes it (contiguous,
    ``self``'s dtype and device unless given), or None for the composite."""
    if not _plain(layout, pin_memory):
        return None
    dev = self.get_device()
    if dev < 0 or device is not None and _target(device) != dev:
        return None
    dt = dtype or self.dtype
    size = tuple(size)
    if dt not in _DTYPES or not _ready(dev):
        return None
    return _new(size, dt, dev)


def new_zeros(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    r = _new_of(self, size, dtype, layout, device, pin_memory)
    if r is not None:
        if r[1] is not None:
            r[1].zero_()
        return r[0]
    return _COMPOSITE["new_zeros"].call_boxed(_KS, self, size, dtype=dtype, layout=layout,
                                              device=device, pin_memory=pin_memory)


def new_ones(self, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    r = _new_of(self, size, dtype, layout, device, pin_memory)
    if r is not None:
        return _fill(r, 1.0)
    return _COMPOSITE["new_ones"].call_boxed(_KS, self, size, dtype=dtype, layout=layout,
                                             device=device, pin_memory=pin_memory)


def new_full(self, size, fill_value, *, dtype=None, layout=None, device=None,
             pin_memory=None):
    r = _new_of(self, size, dtype, layout, device, pin_memory)
    if r is not None:
        return _fill(r, fill_value)
    return _COMPOSITE["new_full"].call_boxed(_KS, self, size, fill_value, dtype=dtype,
                                             layout=layout, device=device,
                                             pin_memory=pin_memory)


# ---------------------------------------------------------------------- *_like
def _strides_like(self, size: tuple, memory_format):
    """The strides torch's ``empty_like`` gives a tensor like ``self`` in ``memory_format``:
    its own for preserve_format on a non-overlapping dense tensor, contiguous ones for
    contiguous_format, else what ``empty_like`` answers on a meta tensor of ``self``'s layout
    (``suggest_memory_format``, channels_last; the CPU's error for channels_last on a tensor
    that is not 4-d, which the composite's ``empty`` on npu did not raise)."""
    if self.numel():
        if memory_format is None or memory_format == _preserve:
            stride = tuple(self.stride())
            if non_overlapping_dense(size, stride):
                return stride
        elif memory_format == _contiguous:
            return S.contiguous_layout(size)[0]
    m = torch.empty_strided(size, self.stride(), dtype=self.dtype, device="meta")
    return tuple(_VF.empty_like(m, memory_format=memory_format).stride())


def _like(self, dtype, layout, device, pin_memory, memory_format):
    """(npu tensor, its CPU view or None when it has no elements) laid out as torch's
    ``empty_like`` lays it out for ``self`` (``_strides_like``), or None for the composite."""
    size = tuple(self.size())
    stride = _strides_like(self, size, memory_format)       # torch's errors on every path
    if not _plain(layout, pin_memory) or self.is_conj() or self.is_neg():
        return None
    dev = self.get_device()
    if dev < 0 or device is not None and _target(device) != dev:
        return None
    dt = dtype or self.dtype
    if dt not in _DTYPES or not _ready(dev):
        return None
    if not self.numel():
        return S.empty_strided(size, stride, dt, dev), None
    return S.empty_with_view(size, stride, dt, dev)


def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None):
    r = _like(self, dtype, layout, device, pin_memory, memory_format)
    if r is not None:
        if r[1] is not None:
            r[1].zero_()
        return r[0]
    return _COMPOSITE["zeros_like"].call_boxed(_KS, self, dtype=dtype, layout=layout,
                                               device=device, pin_memory=pin_memory,
                                               memory_format=memory_format)


def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    r = _like(self, dtype, layout, device, pin_memory, memory_format)
    if r is not None:
        return _fill(r, 1)
    return _COMPOSITE["ones_like"].call_boxed(_KS, self, dtype=dtype, layout=layout,
                                              device=device, pin_memory=pin_memory,
                                              memory_format=memory_format)


def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    r = _like(self, dtype, layout, device, pin_memory, memory_format)
    if r is not None:
        return _fill(r, fill_value)
    return _COMPOSITE["full_like"].call_boxed(_KS, self, fill_value, dtype=dtype, layout=layout,
                                              device=device, pin_memory=pin_memory,
                                              memory_format=memory_format)


# ---------------------------------------------------------------------- _to_copy
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    """``_to_copy`` with an npu result: a host tensor to the npu (``torch.tensor(data,
    device="npu")``, ``t.to("npu")``) or an npu tensor to another dtype on its device. The
    composite's ``empty_like``-laid result, then ``copy_`` (``_copy_from``'s immediate copy on
    an idle stream) through the result's CPU view."""
    src = self.get_device()
    if device is None:
        dev = src
    elif type(device) is torch.device and device.type != "npu":
        if device.type == "cpu" and src >= 0:
            out = _to_host(self, dtype, layout, pin_memory, non_blocking, memory_format, src)
            if out is not None:
                return out
        dev = -1
    else:
        dev = _target(device)
    if dev >= 0 and (src < 0 or src == dev) and _plain(layout, pin_memory) and \
            not self.is_conj() and not self.is_neg() and self.layout == _strided and \
            (src >= 0 or self.device.type == "cpu"):
        size = tuple(self.size())
        stride = _strides_like(self, size, memory_format)   # torch's errors on every path
        dt = dtype or self.dtype
        if dt in _DTYPES and self.dtype in _DTYPES and _ready(dev):
            if not self.numel():
                return S.empty_strided(size, stride, dt, dev)
            out, c = S.empty_with_view(size, stride, dt, dev)
            c.copy_(S.shared_cpu_view(self) if src >= 0 else self)
            return out
    return _COMPOSITE["_to_copy"].call_boxed(_KS, self, dtype=dtype, layout=layout,
                                             device=device, pin_memory=pin_memory,
                                             non_blocking=non_blocking,
                                             memory_format=memory_format)


def _to_host(self, dtype, layout, pin_memory, non_blocking, memory_format, src: int):
    """``_to_copy`` of npu tensor ``self`` to the host (``.cpu()``, ``.to("cpu")``) in the common
    case (a blocking copy into pageable memory, ``src`` the thread's device with its stream
    idle, nothing recording or capturing): the composite's CPU result laid out as
    ``empty_like``, then ``_copy_from``'s copy from the tensor's CPU view; None otherwise (the
    composite: it waits for the stream, refuses a capture)."""
    if non_blocking or pin_memory or layout is not None and layout != _strided or \
            self.is_conj() or self.is_neg() or not _ready(src):
        return None
    dt = dtype or self.dtype
    if dt not in _DTYPES or self.dtype not in _DTYPES:
        return None
    size = tuple(self.size())
    out = torch.empty_strided(size, _strides_like(self, size, memory_format), dtype=dt)
    if self.numel():
        out.copy_(S.shared_cpu_view(self))
    return out


# ---------------------------------------------------------------------- attention's chooser
def sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
               scale=None, enable_gqa=False):
    """``_fused_sdp_choice`` for npu tensors (attention.py asks it per call): the CPU's chooser
    on the tensors' shared CPU views, as the fallback's fast path runs it, without the
    fallback's argument walk (it reads only the metadata). Anything unusual (a mask on another
    device, two devices, a busy stream, the profiler, the sanitizer, a capture) is the
    operator through the dispatcher, as before."""
    dev = query.get_device()
    if dev >= 0 and key.get_device() == dev and value.get_device() == dev and \
            (attn_mask is None or attn_mask.get_device() == dev) and _ready(dev):
        v = S.shared_cpu_view
        return _choice_cpu(v(query), v(key), v(value),
                           None if attn_mask is None else v(attn_mask), dropout_p, is_causal,
                           scale=scale, enable_gqa=enable_gqa)
    return _choice_op(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                      enable_gqa=enable_gqa)


_KERNELS = {
    "arange": arange,
    "arange.start": arange_start,
    "arange.start_step": arange_start_step,
    "zeros": zeros,
    "ones": ones,
    "full": full,
    "scalar_tensor": scalar_tensor,
    "eye": eye,
    "eye.m": eye_m,
    "linspace": linspace,
    "new_zeros": new_zeros,
    "new_ones": new_ones,
    "new_full": new_full,
    "zeros_like": zeros_like,
    "ones_like": ones_like,
    "full_like": full_like,
    "_to_copy": to_copy,
}


def register(lib) -> None:
    """Register the kernels above on ``lib`` (an ``aten`` IMPL library) for PrivateUse1, each
    keeping torch's kernel it replaces (the composite) for the cases it does not take."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name, fn in _KERNELS.items():
        if has("aten::" + name, "PrivateUse1"):
            continue          # someone registered one already: theirs stays
        _COMPOSITE[name] = torch.library.get_kernel("aten::" + name, "PrivateUse1")
        lib.impl(name, fn, "PrivateUse1")
