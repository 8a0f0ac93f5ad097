"""The npu kernels that own storage or cross devices: empty, empty_strided, resize_, set_,
_copy_from (host <-> device, device <-> device) and the small ones torch asks every backend for.

Copies keep stream order: a copy to the host waits for the stream (``.cpu()``, ``.item()``,
``print`` are synchronous, as on a real NPU); a copy from the host runs at once on an idle
stream, and otherwise is queued behind the stream's work with the source staged (a pageable
host buffer may be reused at once, as with ``runtime.memcpy_async``).
"""
from __future__ import annotations

import functools
import importlib

import torch

import runtime
from runtime import hooks, profiler

from . import device as _device
from . import graphs as _graphs
from . import pinned as _pinned
from . import storage as S
from .exitgate import gated
from .ops import fallback, idle_stream_on, non_overlapping_dense
from .structured import out_form, structured_kernel
from .site import user_site

_CPU_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_rgraph = importlib.import_module("runtime.graph")   # the module: runtime.graph is a function
_clone = torch.ops.aten.clone.default
_copy = torch.ops.aten.copy_.default
_relu = torch.ops.aten.relu.default
_lib = None
_aten = None


def _dev(device) -> int:
    return _device.target(device)


def empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None,
                        memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    size = tuple(size)
    if memory_format is None or memory_format == torch.contiguous_format:
        # the common case: contiguous, on the thread's device (index None or 0, see device.py)
        c = S.contiguous_layout(size)
        if c[1] and dtype in S.NUMPY_DTYPES and (device is None or not device.index):
            d = _device.current()
            return S.empty_contiguous(size, dtype, d, S.NUMPY_DTYPES[dtype], c[1])
        return _empty_on(_dev(device), size, c[0], dtype)
    # the CPU's errors, in its words: a channels-last format of another rank; preserve_format,
    # which has no tensor to follow
    rank = _CHANNELS_LAST_RANK.get(memory_format)
    if rank is None:
        name = "Preserve" if memory_format == torch.preserve_format else memory_format
        raise RuntimeError(f"unsupported memory format {name}")
    if len(size) != rank:
        raise RuntimeError(f"required rank {rank} tensor to use {str(memory_format)[6:]} format")
    # torch's channels-last strides (c10 get_channels_last_strides_2d / _3d), zero sizes as they
    # are: channels innermost, then width, height (depth), batch (a negative size: the CPU's
    # error from storage.empty_strided)
    c = size[1]
    inner = [1, c]                          # the strides of channels, then of width
    for x in reversed(size[3:]):            # width, then height (and depth)
        inner.append(inner[-1] * x)
    stride = (inner[-1] * size[2], 1, *reversed(inner[1:]))
    return _empty_on(_dev(device), size, stride, dtype)


_CHANNELS_LAST_RANK = {torch.channels_last: 4, torch.channels_last_3d: 5}


def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    return _empty_on(_dev(device), tuple(size), tuple(stride), dtype)


def _empty_on(d: int, size: tuple, stride: tuple, dtype) -> torch.Tensor:
    if d == _device.current():      # the common case, without a context manager's cost
        return S.empty_strided(size, stride, dtype, d)
    with _device.on(d):
        return S.empty_strided(size, stride, dtype, d)


def _stream_of(d: int):
    with _device.on(d):
        return runtime.current_stream()


def copy_from(src, dst, non_blocking=False):
    """``dst.copy_(src)`` where either is on the npu (torch's _copy_from)."""
    d = dst.get_device()
    if d >= 0 and src.get_device() == d:
        # within one device, the common case as the fallback's ``_now`` takes it (the thread's
        # device, its stream idle, nothing recording or capturing): the CPU's copy between the
        # shared views, which never changes ``dst``'s metadata; a copy is exact
        if hooks.profiler is None and hooks.stream_check is None and not _rgraph.active and \
                idle_stream_on(d):
            S.shared_cpu_view(dst).copy_(S.shared_cpu_view(src), non_blocking)
            return dst
        return fallback(_copy, dst, src, non_blocking)
    if src.device.type == "npu" and dst.device.type == "npu":
        # between two simulated NPUs: the source's stream first, then a copy on the target's
        s_src = _stream_of(src.device.index)
        s_src.synchronize()
        with _device.on(src.device.index):
            host = S.cpu_view(src).clone()
        return copy_from(host, dst, non_blocking)
    if src.device.type == "npu":               # device -> host: waits for the stream
        with _device.on(src.device.index):
            s = runtime.current_stream()
            if s.capture is not None:           # a graph capture computes no data (graphs.py)
                _graphs.refuse("aten::_copy_from to the host (.cpu(), .to('cpu'), print)", s)
            if not s.idle():
                s.synchronize()
            if runtime.stream_check_enabled():
                s.synchronize()                 # the host's clock follows the stream's
            dst.copy_(S.cpu_view(src))
        return dst
    # host -> device
    d = dst.device.index
    with _device.on(d):
        s = runtime.current_stream()
        if s.idle() and not profiler.active() and not runtime.stream_check_enabled() and \
                s.capture is None:              # captured: a node (graphs.py)
            S.cpu_view(dst).copy_(src)
            return dst
        site = user_site(2)
        view = S.cpu_view(dst)
        if _pinned.is_pinned(src):             # pinned: copied from where it is, as a DMA
            staged = src.detach()
        else:
            staged = src.detach().clone() if src.device.type == "cpu" else src.detach().cpu()
        if runtime.stream_check_enabled():
            o = S.owner_of(dst)
            if o is not None and S.span(dst, o) is not None:
                runtime.declare_access(s, "copy H2D", site=site, writes=[S.span(dst, o)])
        s.enqueue(gated(lambda: view.copy_(staged), s), "copy H2D", "copy",
                  {"bytes": int(view.nbytes)}, site)
    return dst


def clone(self, *, memory_format=None):
    """``aten::clone`` on npu in one Python call. torch's composite for a new backend called the
    device twice (``empty_like``, then ``copy_`` through ``_copy_from`` and the fallback); a
    training step clones a score of activations (attention's projections and its backward).
    The common case, as the fallback's ``_now`` takes it (an idle stream on the thread's device,
    nothing recording, no conjugate / negative bit), with ``preserve_format`` on a
    non-overlapping dense tensor (what CPU's ``empty_like`` keeps: the same sizes and strides)
    or ``contiguous_format`` (``contiguous()``: contiguous strides): the result allocated with
    its CPU view and the CPU's copy into it (a copy is exact, so the same bits). Anything else
    is the fallback's ``clone`` (task path, capture, other layouts)."""
    if memory_format is None or memory_format == torch.preserve_format:
        stride = tuple(self.stride())
        if not non_overlapping_dense(self.size(), stride):
            stride = None
    elif memory_format == torch.contiguous_format:      # ``contiguous()``
        stride = S.contiguous_strides(self.size())
    else:
        stride = None
    if stride is not None and self.get_device() == _device.current() and self.numel() and \
            not self.is_conj() and not self.is_neg() and not profiler.active() and \
            not runtime.stream_check_enabled() and not _rgraph.active and \
            runtime.current_stream().idle():
        out, c = S.empty_with_view(tuple(self.size()), stride, self.dtype, self.get_device())
        c.copy_(S.shared_cpu_view(self))
        return out
    return fallback(_clone, self, memory_format=memory_format)


def relu(self):
    """``aten::relu`` on npu: the CPU's own definition, ``clamp_min(self, 0)`` (aten's relu is
    that call), through the structured ``clamp_min`` kernel, which writes the result straight
    into device memory; torch's CPU relu on a view made a CPU result that was then copied (a
    1 MB activation: ~50 us of the ~75). A bool tensor takes the fallback (the CPU's error), and
    so does every call while the profiler or the sanitizer records or a graph captures: their
    records name ``aten::relu``, the operator the user called."""
    if self.dtype == torch.bool or hooks.profiler is not None or \
            hooks.stream_check is not None or _rgraph.active:
        return fallback(_relu, self)
    return torch.clamp_min(self, 0)


def copy_from_and_resize(src, dst):
    if dst.numel() == 0 and src.numel():
        resize_(dst, src.size())
    return copy_from(src, dst)


def copy_math_bits(src, dst, non_blocking=False):
    """``_copy_from`` where a tensor has a conjugate or negative bit (a lazy ``conj()``, the
    gradients of complex operators). torch's fallback for those bits materializes the source
    with ``clone``, whose copy is this ``_copy_from`` again: without this kernel every such copy
    (``x.conj().cpu()``) recursed until the stack overflowed. The bits are resolved by computing
    operators (conj_physical, neg) on views without them, then a plain copy."""
    s = src
    if s.is_conj():
        s = torch.conj_physical(s.conj())
    if s.is_neg():
        s = torch.neg(torch._neg_view(s))
    d = dst
    if d.is_conj():               # storing into a conjugate view stores the conjugate
        d, s = d.conj(), torch.conj_physical(s)
    if d.is_neg():
        d, s = torch._neg_view(d), torch.neg(s)
    d.copy_(s, non_blocking)
    return dst


def resize_(self, size, *, memory_format=None):
    """Grow the storage with a new allocation when needed (the old bytes are kept)."""
    size = tuple(size)
    if memory_format is None and tuple(self.size()) == size:
        return self             # torch's resize_: the same sizes keep their strides
    if memory_format is not None:
        stride = torch.empty(size, memory_format=memory_format, device="meta").stride()
    else:
        stride = S.contiguous_strides(size)
    need = S.element_span(size, stride)
    need = (need + self.storage_offset()) * self.element_size() if need else 0
    have = self.untyped_storage().nbytes()
    d = self.device.index
    if need > have:
        with _device.on(d):
            base = S.new_storage_tensor(need, d)
            old = S.owner_of(self)
            if old is not None:         # keep the old bytes (rare: torch resizes empty tensors)
                runtime.current_stream().synchronize()
                S.cpu_bytes(S.owner_of(base))[:have].copy_(S.cpu_bytes(old)[:have])
        torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
            _CPU_KS, self, base.untyped_storage(), self.storage_offset(), size, stride)
        return self
    return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KS, self, self.untyped_storage(), self.storage_offset(), size, stride)


_SHALLOW_COPY_DEVICES = frozenset(("cpu", "npu", "cuda", "xpu", "mps", "hpu", "mtia"))


def has_compatible_shallow_copy_type(self, src):
    """Whether ``self.data = src`` may keep ``self`` (torch's ``set_data`` and ``Module._apply``
    ask): as torch answers for CPU and CUDA, dense strided tensors of the dense devices are
    compatible with each other. Without this kernel torch's composite answers False for an npu
    tensor and a CPU one, and ``module.to("npu")`` made new Parameters: tied weights came apart
    and an optimizer made before the move updated stale host tensors."""
    if self.layout != torch.strided or src.layout != torch.strided:
        return self.layout == src.layout and self.device.type == src.device.type
    return self.device.type in _SHALLOW_COPY_DEVICES and src.device.type in _SHALLOW_COPY_DEVICES


def _redispatch_cpu(op):
    def k(*args, **kwargs):
        return op.redispatch(_CPU_KS, *args, **kwargs)
    return k


def record_stream(self, s):
    """The tensor's memory is also used by the work enqueued on ``s``: its free waits for that
    work too, not only for the allocating stream's (npusim's stream sanitizer names a free
    that another stream's work races with). ``s`` arrives as a ``torch.Stream`` (a
    torch.npu.Stream is one); it must be an npu stream, as CUDA's must be a CUDA one."""
    if s.device.type != "npu":
        raise RuntimeError(f"record_stream(stream={s!r}): expected a stream of the npu device "
                           f"of the tensor ({self.device})")
    # ZeRO-3 frees a parameter gathered on its all-gather stream after the default stream
    # read it: without this the pool reused it under that read (tests/libs/test_record_stream.py)
    o = S.owner_of(self)
    if o is not None:
        from torch_npu.npu.streams import rt_stream
        runtime.memory.record_stream(o.dev, rt_stream(s))


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    """torch asks backends other than CPU/CUDA for convolution_overrideable: the CPU one."""
    return fallback(torch.ops.aten.convolution.default, input, weight, bias, stride, padding,
                    dilation, transposed, output_padding, groups)


def convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    bias_sizes = [weight.size(1) * groups if transposed else weight.size(0)]
    return fallback(torch.ops.aten.convolution_backward.default, grad_output, input, weight,
                    bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                    output_mask)


def is_pinned(self, device=None):
    """Whether a CPU tensor is in npusim's pinned host memory (pinned.py)."""
    return _pinned.is_pinned(self)


def pin_memory(self, device=None):
    """A host tensor pinned for the npu device: a copy in npusim's pinned host memory
    (pinned.py). torch's Python route to PrivateUse1 has no pinned-memory allocator hook, and
    without these CPU kernels ``t.pin_memory()`` and ``DataLoader(pin_memory=True)`` (the npu
    being torch's accelerator) raise."""
    return _pinned.pin(self)


def _to_blocking_to_cpu(op):
    """``Tensor.to`` (``op``, a CompositeImplicitAutograd overload) for npu tensors, at the
    AutogradPrivateUse1 key: a non-blocking copy to the host is made blocking. torch's
    ``_to_copy`` would allocate its result in pinned memory for a non-blocking copy from a
    PrivateUse1 tensor to the CPU, which a Python backend cannot give it (pinned.py); a blocking
    copy has the same values when it returns (non_blocking is a hint: CUDA's copy into pageable
    memory blocks too). Anything else runs torch's own composite, autograd included."""
    names = [a.name for a in op._schema.arguments]
    pos = names.index("non_blocking")
    target = names.index("device") if "device" in names else names.index("other")

    def k(*args, **kwargs):
        nb = args[pos] if pos < len(args) else kwargs.get("non_blocking", False)
        if nb:
            to = args[target] if target < len(args) else kwargs.get(names[target])
            if isinstance(to, torch.Tensor):
                to = to.device
            if to is not None and torch.device(to).type == "cpu":
                if pos < len(args):
                    args = args[:pos] + (False,) + args[pos + 1:]
                else:
                    kwargs = dict(kwargs, non_blocking=False)
        return op.decompose(*args, **kwargs)
    return k


def _cuda_device_present() -> bool:
    """True when this torch is a CUDA build and sees a GPU. PyPI's default x86_64 wheel is a
    CUDA build: on a machine without a GPU its pinned-memory kernel cannot serve the npu
    device either, so npusim's kernels above take its place there as on the CPU build."""
    return torch.backends.cuda.is_built() and torch._C._cuda_getDeviceCount() > 0


def register() -> None:
    """Register the fallback and the kernels above for the PrivateUse1 key (once)."""
    global _lib, _aten
    if _lib is not None:
        return
    _lib = torch.library.Library("_", "IMPL")
    _lib.fallback(fallback, "PrivateUse1")
    # autocast: every operator falls through but the ones autocast.py casts
    _lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _aten = torch.library.Library("aten", "IMPL")
    a = torch.ops.aten
    impls = {
        "empty.memory_format": empty_memory_format,
        "empty_strided": empty_strided,
        "_copy_from": copy_from,
        "_copy_from_and_resize": copy_from_and_resize,
        "resize_": resize_,
        "record_stream": record_stream,
        "convolution_overrideable": convolution,
        "convolution_backward_overrideable": convolution_backward,
        "set_.source_Storage": _redispatch_cpu(a.set_.source_Storage),
        "set_.source_Storage_storage_offset": _redispatch_cpu(a.set_.source_Storage_storage_offset),
        "set_.source_Tensor": _redispatch_cpu(a.set_.source_Tensor),
        "set_": _set_empty,
        "_has_compatible_shallow_copy_type": has_compatible_shallow_copy_type,
        "clone": clone,
        "relu": relu,
    }
    for name, fn in impls.items():
        _aten.impl(name, fn, "PrivateUse1")
    from . import factories             # arange, zeros, full, *_like, _to_copy: one call each
    factories.register(_aten)
    for key in ("Conjugate", "Negative"):      # above the backend: a bit on either tensor
        _aten.impl("_copy_from", copy_math_bits, key)
    # operators with a CPU kernel that torch would otherwise decompose for a new backend (other
    # rounding, more calls): they take the CPU kernel too, through the fallback
    from .foreach import foreach_kernel
    register_cpu_kernels(_aten, structured_kernel, fallback, foreach_kernel)
    if not _cuda_device_present():     # with a GPU, torch's CUDA pinned memory stays
        _aten.impl("is_pinned", is_pinned, "CPU")
        _aten.impl("_pin_memory", pin_memory, "CPU")
    S.install_storage_resize()
    S.install_storage_new()
    _pinned.watch_ddp()
    for ov in ("device", "dtype_layout", "other"):
        _aten.impl(f"to.{ov}", _to_blocking_to_cpu(getattr(torch.ops.aten.to, ov)),
                   "AutogradPrivateUse1")
    from . import attention, autocast, serialization
    attention.register(_aten)
    autocast.register(_aten)
    serialization.register()


_CPU_FUSED = [n for n in ("native_layer_norm", "native_layer_norm_backward", "native_group_norm",
                          "native_group_norm_backward", "_softmax", "_log_softmax",
                          "_softmax_backward_data", "_log_softmax_backward_data",
                          "_fused_sdp_choice",
                          # their CPU out= kernels write the elementwise loss into out= first:
                          # the composite's 0-d out= warned "An output ... was resized"
                          "mse_loss", "smooth_l1_loss",
                          # a composite that accepts CPU and CUDA tensors only: on CPU views
                          "mode.values",
                          # in-place composites calling their out= form with out=self: through
                          # the boxed fallback torch's "out is self" checks no longer held, and
                          # npu accepted what CPU rejects (a 0-d self of addr_, a zero-element
                          # self of another broadcast shape); on CPU views they are the CPU's
                          "addr_", "logical_and_", "logical_or_", "logical_xor_", "ldexp_")
              if not torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + n, "PrivateUse1")]


# the functional structured operators a training step calls most (forward, backward, losses):
# on npu each is one Python kernel (structured.py) in place of torch's composite, which
# called the device twice (empty_strided, then the out= form through the fallback)
_STRUCTURED = ("add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "div.Tensor_mode", "mm",
               "addmm", "bmm", "baddbmm", "sum.dim_IntList", "mean.dim", "pow.Tensor_Scalar",
               "pow.Tensor_Tensor", "threshold_backward", "gelu", "gelu_backward", "silu",
               "silu_backward", "sigmoid", "sigmoid_backward", "tanh", "tanh_backward", "exp",
               "log", "neg", "sqrt", "rsqrt", "sin", "cos", "maximum", "minimum", "clamp",
               "clamp_min", "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar", "lt.Tensor",
               "lt.Scalar", "gt.Tensor", "gt.Scalar", "le.Scalar", "ge.Scalar", "addcmul",
               "addcdiv", "lerp.Scalar", "cat", "triu", "tril", "_softmax", "_log_softmax",
               "_softmax_backward_data", "_log_softmax_backward_data")


def register_cpu_kernels(lib, make_structured, run, make_foreach=None) -> None:
    """Register on ``lib`` (an ``aten`` IMPL library) the PrivateUse1 kernels of every operator
    that takes torch's CPU kernel: ``make_structured(op, out_op)`` for the structured operators
    (one Python call each instead of torch's composite's two, where that composite is the
    structured one), ``run(op, *args, **kwargs)`` (a boxed fallback) for every operator with a
    CPU kernel that a new backend would decompose, and the ``_foreach_*`` ones. Used by
    ``register`` and by benchmarks/npu_floor.py's bare device (the same operators).
    ``make_foreach(op)``: a ``_foreach_*`` overload's own kernel, or None for ``run``'s."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in _STRUCTURED:
        if has("aten::" + name, "CompositeExplicitAutogradNonFunctional") and \
                not has("aten::" + name, "PrivateUse1"):
            op = _overload(name)
            out_op = out_form(op)
            if out_op is not None:
                lib.impl(name, make_structured(op, out_op), "PrivateUse1")
    for name in _cpu_kernel_ops() + _foreach_ops():
        op = _overload(name)
        k = make_foreach(op) if make_foreach is not None and name.startswith("_foreach_") \
            else None
        lib.impl(name, k if k is not None else functools.partial(run, op), "PrivateUse1")


def _overload(name: str):
    op = torch.ops.aten
    for part in name.split("."):
        op = getattr(op, part)
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = op.default
    return op


def _cpu_kernel_ops() -> list:
    """Every aten operator that has a kernel of its own for CPU and that a new backend would run
    as a decomposition, CompositeImplicitAutograd (``silu_backward``, ``mish_backward``) or
    CompositeExplicitAutograd (``addr``, ``_stack``, ``native_layer_norm``): other rounding
    than CPU's kernel. On npu they take the CPU kernel through the fallback, as the CPU does,
    so the dispatch table of npu is the CPU's for them: autograd included (a backend kernel
    keeps a CompositeImplicitAutograd op from the Autograd key on CPU too).

    The functional and in-place forms of structured operators (``add.Tensor``: their other
    composite, CompositeExplicitAutogradNonFunctional) keep it: it allocates the npu result
    and runs the ``out=`` form, the CPU kernel, into it (the same bits). Taken by the fallback
    they cost one Python call less (a 64x64 add 43 -> 31 us) but a copy of the result more (the
    CPU kernel allocates it in host memory), which a training step of 1 MB activations paid."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    out = set(n for n in _CPU_FUSED)
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::") or not has(full, "CPU") or has(full, "PrivateUse1"):
            continue
        if has(full, "CompositeImplicitAutograd") or has(full, "CompositeExplicitAutograd"):
            out.add(full[len("aten::"):])
    return sorted(n for n in out if not has("aten::" + n, "PrivateUse1"))


def _foreach_ops() -> list:
    """The ``_foreach_*`` operators (what optimizers call: AdamW's step is a dozen of them over
    every parameter). torch gives a new backend their composite form, one operator per tensor;
    taken whole by the fallback, each is one call that runs torch's CPU kernel (the same loop
    over the same per-tensor kernels, so the same bits) over the lists of CPU views."""
    out = []
    for full in torch._C._dispatch_get_all_op_names():
        if full.startswith("aten::_foreach_") and not \
                torch._C._dispatch_has_kernel_for_dispatch_key(full, "PrivateUse1"):
            out.append(full[len("aten::"):])
    return sorted(out)


def _set_empty(self):
    return torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KS, self, torch._C._acc.create_empty_tensor((0,), self.dtype).untyped_storage(), 0,
        (0,), (1,))
