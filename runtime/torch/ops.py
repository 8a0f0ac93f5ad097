"""Every aten operator on ``npu`` tensors: torch's CPU kernel on CPU views of the device memory.

Design note. One boxed fallback for the PrivateUse1 key takes every operator torch does not
resolve above it (autograd, composite decompositions); a handful of operators that own storage
or move data across devices (``empty``, ``empty_strided``, ``_copy_from``, ``set_``, ...) have
kernels of their own. The fallback classifies an operator once, from its schema:

- a *view* (a return that aliases an argument without writing it: view, as_strided, ...) runs
  torch's CPU kernel on the npu tensor itself: it only makes new sizes and strides over the same
  storage, and the result stays on the npu;
- anything else *computes*. Its arguments become CPU views (storage.cpu_view) and torch's CPU
  kernel runs on them, so results are bitwise the CPU's. A new result is copied into a new npu
  tensor (same sizes and strides); a written argument (in place, ``out=``) is written in place.

When it runs. A computing operator is a task on the device's current npusim stream, in stream
order: its output tensors are allocated at the call, with sizes and strides from torch's meta
kernels (the operator run on ``meta`` tensors), and the task fills them later. Measured, a task
costs more than a small operator (the meta run, the enqueue, the hand-off to the worker: see
benchmarks/npu_ops.py), and a training step is mostly small operators. So when the stream is
*idle* (nothing queued, no error pending: ``Stream.idle()``), the operator runs at once on the
calling thread: the stream had nothing that could come before it, so the order is the same as if
it had been queued and waited for (the runtime's synchronous copies do the same). The task path
is taken whenever work is queued on the stream (a kernel, a collective, an earlier operator),
while the profiler records (every operator is then a task on the trace) and while the stream
sanitizer checks (every operator declares its reads and writes: read-only inputs as reads,
results and written arguments as writes). Operators whose results depend on the data (``item``,
``nonzero``, ``equal``; any operator without a meta kernel) wait for the stream, then run at once.

The common case, fast (``_now``). A training step is hundreds of small operators, so the path of
an operator on an idle stream is one walk over the arguments that both finds the device (and
leaves for the general path on anything unusual: a CPU tensor mixed in, two devices, a device
other than the thread's, a factory, a random operator, a busy stream, the profiler or the
sanitizer on) and swaps each npu tensor for its CPU view. The views come from a cache on the
storage (storage.shared_cpu_view), as the same tensors are read again and again. A kernel that
changed the metadata of a written argument's view (an ``out=`` it resized) is caught by comparing
the view's address, sizes and strides before and after; the npu tensor then follows and the
cached view is dropped. Nothing else is captured on that path: the call site is taken only where
something will name it (a task, a sanitizer record; a TaskError needs a task).

Structured operators in one call: runtime/torch/structured.py (kernels.py registers them;
they take this fallback for anything unusual).
"""
from __future__ import annotations

import importlib

import torch

import runtime
from runtime import current as _current
from runtime import hooks, profiler
from runtime.errors import GraphCaptureError

from . import device as _device
from . import random as _random
from . import storage as S
from .exitgate import gated
from .site import user_site

rgraph = importlib.import_module("runtime.graph")   # the module: runtime.graph is a function

_NPU = "npu"
_CPU_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_info: dict = {}
_Tensor = torch.Tensor
_SEQ = (list, tuple)
_LATER = object()             # _now's answer when the operator needs the general path
_shared_view = S.shared_cpu_view
_thread = _current.thread
_contexts = _current.contexts_by_device


class OpInfo:
    """What the fallback needs to know about one operator, from its schema."""
    __slots__ = ("name", "view", "written", "out", "sync", "gen", "plain", "wrapped", "packet")

    def __init__(self, op):
        schema = op._schema
        self.name = schema.name + ("." + schema.overload_name if schema.overload_name else "")
        rets = schema.returns
        self.view = any(r.alias_info is not None and not r.alias_info.is_write for r in rets)
        # argument positions / names a kernel writes (in place, out=)
        self.written = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                             if a.alias_info is not None and a.alias_info.is_write)
        # the written keyword-only arguments: out= (resized to the result's sizes)
        self.out = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                         if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)
        # results that are not tensors (a Scalar, a bool) need the data: run synchronously
        self.sync = any(not _tensor_type(str(r.type)) for r in rets)
        # a random operator given no generator draws from its npu device's (random.py)
        self.gen = next(((k, a.name) for k, a in enumerate(schema.arguments)
                         if a.name == "generator"), None)
        # neither random nor a factory: the fast path may take it
        self.plain = self.gen is None and not any(a.name == "device" for a in schema.arguments)
        # Tensor arguments past the first: torch hands a Python number wrapped as a tensor
        # (``a % 4`` reaches ``remainder.Tensor`` through ``remainder.Scalar``'s composite) to
        # Python as the number itself, which this overload refuses (see ``fallback``)
        self.wrapped = tuple((k, a.name) for k, a in enumerate(schema.arguments)
                             if k and str(a.type) == "Tensor")
        self.packet = {} if self.wrapped and schema.name.startswith("aten::") else None


def _tensor_type(t: str) -> bool:
    return t in ("Tensor", "Tensor[]", "Optional[Tensor]", "List[Tensor]", "Tensor?", "Tensor?[]",
                 "List[Optional[Tensor]]")


def _no_capture(op, i, dev, s, args, kwargs):
    raise GraphCaptureError(f"{i.name}: npu operators are captured by runtime/torch/graphs.py, "
                            "which is not imported (import torch_npu)")


_capture = _no_capture       # what a capturing stream's operator becomes: graphs.py sets it


def set_capture(fn) -> None:
    """Make ``fn(op, info, device, stream, args, kwargs)`` what an operator on a capturing
    stream becomes (graphs.py's capture_op): ops never imports graphs, graphs imports ops."""
    global _capture
    _capture = fn


def idle_stream_on(dev: int) -> bool:
    """True when ``dev`` is the calling thread's device and its current stream is idle: the
    fast paths' condition (``_now``, structured.py), read from the thread state once
    (``runtime.current``) instead of asking for the device, then the stream (0.5 -> 0.25 us)."""
    t = _thread
    d = t.device
    if d is None:
        d = _current.process_device
    if d != dev:
        return False
    ctx = _contexts.get(d)
    if ctx is None:
        return False
    stacks = t.streams
    st = stacks.get(d) if stacks else None
    return (st[-1] if st else ctx.default_stream).idle()


def info(op) -> OpInfo:
    i = _info.get(op)
    if i is None:
        i = _info[op] = OpInfo(op)
    return i


# ---------------------------------------------------------------------- argument walks
def _devices(args, kwargs, name):
    """The npu device index of the operation; torch's error for an npu / CPU mix."""
    dev = None
    cpu = None
    for a in tensors_in(args, kwargs):
        t = a.device.type
        if t == _NPU:
            i = a.device.index
            if dev is None:
                dev = i
            elif i != dev:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at "
                                   f"least two devices, npu:{dev} and npu:{i}! (in {name})")
        elif a.dim() != 0:        # a 0-dim CPU tensor is a scalar, as on CUDA
            cpu = a.device
    if cpu is not None and dev is not None:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two "
                           f"devices, npu:{dev} and {cpu}! (in {name}: move the CPU tensor with "
                           f".to('npu:{dev}') or the npu tensor with .cpu())")
    return dev


def tensors_in(args, kwargs):
    """Every tensor among ``args`` and ``kwargs``' values, also inside lists and tuples."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b


def map_npu(args, kwargs, fn):
    """(args, kwargs) with every npu tensor (also inside lists) replaced by ``fn(tensor)``."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return fn(a) if a.device.type == _NPU else a
        if isinstance(a, (list, tuple)) and a and any(isinstance(b, torch.Tensor) for b in a):
            return type(a)(fn(b) if isinstance(b, torch.Tensor) and b.device.type == _NPU else b
                           for b in a)
        return a
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def meta_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="meta")


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return S.cpu_view(t)


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


def _rebuild(out, fn):
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, (list, tuple)):
        return type(out)(fn(o) if isinstance(o, torch.Tensor) else o for o in out)
    return out


def _dense_strides(r: torch.Tensor) -> tuple:
    """The strides of a new npu tensor for CPU result ``r``: its own when they are dense (a
    permuted layout, e.g. the gradients of CPU's fused attention: what torch's ``empty_like``
    keeps, and what the following operators see), else contiguous ones."""
    if r.is_contiguous() or r.is_contiguous(memory_format=torch.channels_last):
        return r.stride()
    if non_overlapping_dense(r.size(), r.stride()):
        return r.stride()
    return S.contiguous_strides(r.size())


def non_overlapping_dense(size, stride) -> bool:
    expect = 1
    for n, st in sorted(zip(size, stride), key=lambda d: d[1]):
        if n == 1:
            continue
        if st != expect:
            return False
        expect *= n
    return True


# ---------------------------------------------------------------------- the fallback
def fallback(op, *args, **kwargs):
    i = _info.get(op)
    if i is None:
        i = info(op)
    if i.view:
        return op.redispatch(_CPU_KS, *args, **kwargs)
    if i.packet is not None:
        numbers = wrapped_numbers(i, args, kwargs)
        if numbers:               # the Scalar overload, as torch picks for a number (see OpInfo)
            op = i.packet.get(numbers) or i.packet.setdefault(
                numbers, scalar_overload(op, numbers))
    if i.plain and hooks.profiler is None and hooks.stream_check is None and \
            not rgraph.active:           # a capture takes the task path (graphs.py)
        out = _now(op, i, args, kwargs)
        if out is not _LATER:
            return out
    dev = _devices(args, kwargs, i.name)
    if dev is None:               # no npu tensor among the arguments: a factory given device=npu
        d = kwargs.get("device")
        dev = _device.target(d)
    if dev == _device.current():
        return _compute(op, i, dev, args, kwargs)
    with _device.on(dev):
        return _compute(op, i, dev, args, kwargs)


def scalar_overload(op, numbers: tuple):
    """The overload of ``op``'s packet that takes a Scalar where ``op`` takes a Tensor at the
    positions ``numbers`` and is otherwise the same (``remainder.Tensor`` -> ``.Scalar``,
    ``mul_.Tensor`` -> ``mul_.Scalar``): what the CPU runs for a Python number. The packet
    itself (slower: it resolves the overload per call) when there is none."""
    packet = getattr(torch.ops.aten, op._schema.name[len("aten::"):])
    want = [(a.name, "number" if k in numbers else str(a.type))
            for k, a in enumerate(op._schema.arguments)]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        if [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
            return cand
    return packet


def wrapped_numbers(i: OpInfo, args, kwargs) -> tuple:
    """The positions of the Tensor arguments that came as Python numbers (wrapped scalars)."""
    out = ()
    for pos, name in i.wrapped:
        a = args[pos] if pos < len(args) else kwargs.get(name)
        if a is not None and not isinstance(a, _Tensor) and isinstance(a, (int, float, complex)):
            out += (pos,)
    return out


def _call(op, i: OpInfo, args, kwargs, cargs: list, ckwargs: dict):
    """``op`` on the CPU views ``cargs``/``ckwargs``; returns (its result, None), or, when an
    npu ``out=`` tensor must grow (its view's CPU storage is the device memory, which torch
    cannot resize: "Trying to resize storage that is not resizable"), (the result, {id(old
    view): new CPU tensor}) of a second run given new empty CPU tensors as those ``out=``
    arguments, which the caller's written-argument check then follows (``follow``). torch's
    kernel resizes before it writes, and has warned once already ("An output with one or more
    elements was resized"), as on CPU."""
    try:
        return op(*cargs, **ckwargs), None
    except RuntimeError as e:
        if not i.written or "not resizable" not in str(e):
            raise
    fresh = {}

    def grow(a, c):
        if not isinstance(a, _Tensor) or a.device.type != _NPU:
            return c
        # a resizable CPU copy of the argument, its sizes, strides and values (not an empty
        # tensor: a kernel lays out an empty out= its own way, e.g. LAPACK's column-major, and
        # an in-place one, addbmm_, reads it), from the npu tensor's metadata (the failed call
        # may have changed the view's)
        n = fresh[id(c)] = torch.empty_strided(a.size(), a.stride(), dtype=a.dtype).copy_(
            S.cpu_view(a))
        return n
    for pos, name in i.written:
        if pos < len(args):
            a, c, into, key = args[pos], cargs[pos], cargs, pos
        elif name in kwargs:
            a, c, into, key = kwargs[name], ckwargs[name], ckwargs, name
        else:
            continue
        if isinstance(a, _Tensor):
            into[key] = grow(a, c)
        elif type(a) in _SEQ:
            into[key] = type(c)(grow(x, y) for x, y in zip(a, c))
    return op(*cargs, **ckwargs), fresh


def _now(op, i: OpInfo, args, kwargs):
    """The operator run at once on shared CPU views, or _LATER (see the note: the fast path)."""
    dev = -1                      # the npu device index
    cargs = []
    for a in args:                # the common walk inline: tensors and plain values
        if isinstance(a, _Tensor):
            d = a.get_device()
            if d < 0:             # a CPU tensor: only a 0-dim one (a scalar) may join npu ones
                if a.dim():
                    return _LATER
                cargs.append(a)
                continue
            if d != dev:
                if dev >= 0:      # two npu devices: the general path names them
                    return _LATER
                dev = d
            cargs.append(_shared_view(a))
        elif type(a) in _SEQ:
            st = [dev, False]
            cargs.append(_view(a, st))
            if st[1]:
                return _LATER
            dev = st[0]
        else:
            cargs.append(a)
    if kwargs:
        st = [dev, False]
        ckwargs = {k: _view(v, st) for k, v in kwargs.items()}
        if st[1]:
            return _LATER
        dev = st[0]
    else:
        ckwargs = kwargs
    if dev < 0 or not idle_stream_on(dev):
        return _LATER
    if not i.written:
        out = op(*cargs, **ckwargs)
        if type(out) is _Tensor:
            return to_npu(out, dev)
        return _rebuild(out, lambda r: to_npu(r, dev))
    pairs = []                    # (npu tensor, its CPU view) of each written npu argument
    for pos, name in i.written:
        if pos < len(args):
            a, c = args[pos], cargs[pos]
        else:
            a, c = kwargs.get(name), ckwargs.get(name)
        if isinstance(a, _Tensor):
            if c is not a:
                pairs.append((a, c))
        elif type(a) in _SEQ:
            pairs.extend((x, y) for x, y in zip(a, c) if y is not x)
    marks = [(c.data_ptr(), c.size(), c.stride()) for _, c in pairs]
    out, fresh = _call(op, i, args, kwargs, cargs, ckwargs)
    if fresh:
        pairs = [(a, fresh.get(id(c), c)) for a, c in pairs]
    for (a, c), (ptr, size, stride) in zip(pairs, marks):
        if c.data_ptr() != ptr or c.size() != size or c.stride() != stride:
            S.forget_cpu_view(a)
            follow(a, c)
    if out is None:
        return out
    if len(pairs) == 1 and out is pairs[0][1]:      # in place / one out=: the argument itself
        return pairs[0][0]
    back = {id(c): a for a, c in pairs}

    def npu_of(r):
        a = back.get(id(r))
        return a if a is not None else to_npu(r, dev)
    return _rebuild(out, npu_of)


def _view(a, st):
    """``a`` with its npu tensors (also inside a list) swapped for their shared CPU views;
    ``st``: [npu device index, True when the general path must take the operator]."""
    if isinstance(a, _Tensor):
        d = a.get_device()
        if d < 0:                 # a CPU tensor: only a 0-dim one (a scalar) may join npu ones
            if a.dim():
                st[1] = True
            return a
        if d != st[0]:
            if st[0] >= 0:        # two npu devices: the general path names them
                st[1] = True
            st[0] = d
        return _shared_view(a)
    if type(a) in _SEQ:
        for b in a:
            if isinstance(b, _Tensor):
                return type(a)([_view(b, st) for b in a])
    return a


def follow(a: torch.Tensor, c: torch.Tensor) -> None:
    """Make npu tensor ``a`` what the CPU kernel made of its view ``c`` (an ``out=`` it resized
    into CPU memory, or restrided)."""
    a.resize_(c.size())
    if c.stride() != a.stride():
        span = S.element_span(c.size(), c.stride())
        if span > a.numel():      # a layout with gaps (LAPACK's leading dimension): more storage
            a.resize_((span,))
        a.as_strided_(c.size(), c.stride())
    S.cpu_view(a).copy_(c)


def _compute(op, i: OpInfo, dev: int, args, kwargs):
    s = runtime.current_stream()
    if i.gen is not None:
        args, kwargs = _with_generator(i, dev, args, kwargs)
    if "device" in kwargs:        # a factory: its CPU kernel makes a CPU result, copied after
        kwargs = dict(kwargs, device="cpu")
    if s.capture is not None:     # the stream captures a graph: a node (graphs.py)
        return _capture(op, i, dev, s, args, kwargs)
    if s.idle() and not profiler.active() and not runtime.stream_check_enabled() or i.sync:
        if not s.idle():
            s.synchronize()
        return _run_now(op, i, dev, args, kwargs)
    try:
        margs, mkwargs = map_npu(args, kwargs, meta_like)
        mout = op(*margs, **mkwargs)
    except Exception:             # no meta kernel, or a data-dependent one: wait, then run
        s.synchronize()
        return _run_now(op, i, dev, args, kwargs)
    return enqueue_task(op, i, dev, s, args, kwargs, margs, mkwargs, mout)


def _with_generator(i: OpInfo, dev: int, args, kwargs):
    pos, name = i.gen
    if pos < len(args):
        if args[pos] is None:
            args = args[:pos] + (_random.generator(dev),) + args[pos + 1:]
    elif kwargs.get(name) is None:
        kwargs = dict(kwargs, **{name: _random.generator(dev)})
    return args, kwargs


def _written_args(i: OpInfo, args, kwargs):
    """The tensors the operator writes (in place / out=), in schema order."""
    return _at(i.written, args, kwargs)


def _at(where, args, kwargs):
    """The tensors of the arguments at ``where`` ((position, name) pairs), in that order."""
    out = []
    for pos, name in where:
        a = args[pos] if pos < len(args) else kwargs.get(name)
        out.extend(flat(a))
    return out


def _run_now(op, i: OpInfo, dev: int, args, kwargs):
    cargs, ckwargs = map_npu(args, kwargs, _cpu)
    if not i.written:
        return _rebuild(op(*cargs, **ckwargs), lambda r: to_npu(r, dev))
    before = [(a, c, c.data_ptr(), c.size(), c.stride()) for a, c in
              zip(_written_args(i, args, kwargs), _written_args(i, cargs, ckwargs)) if a is not c]
    cargs = list(cargs)
    out, fresh = _call(op, i, args, kwargs, cargs, ckwargs)
    if fresh:
        before = [(a, fresh.get(id(c), c), *m) for a, c, *m in before]
    # an out= argument the CPU kernel resized now lives in CPU memory: resize the npu one
    for a, c, ptr, size, stride in before:
        if c.data_ptr() != ptr or c.size() != size or c.stride() != stride:
            S.forget_cpu_view(a)
            follow(a, c)
    # results that alias a written argument are that argument (in place, out=)
    by_id = {}
    for a, c in zip(_flat_all(args, kwargs), _flat_all(cargs, ckwargs)):
        by_id[id(c)] = a
    def back(r):
        a = by_id.get(id(r))
        return a if a is not None else to_npu(r, dev)
    return _rebuild(out, back)


def _flat_all(args, kwargs):
    return [t for t in tensors_in(args, kwargs)]


def to_npu(r: torch.Tensor, dev: int) -> torch.Tensor:
    """A new npu tensor holding CPU result ``r`` (same sizes, dense strides)."""
    if r.device.type == _NPU:
        return r
    if not r.numel():
        return S.empty_strided(r.size(), _dense_strides(r), r.dtype, dev)
    t, c = S.empty_with_view(tuple(r.size()), _dense_strides(r), r.dtype, dev)
    c.copy_(r)                  # through its cached view: the next operator will read t
    return t


def enqueue_task(op, i: OpInfo, dev: int, s, args, kwargs, margs, mkwargs, mout):
    site = user_site(3)
    # the meta results: written arguments come back as themselves, new ones get npu tensors
    meta_to_npu = {id(m): a for m, a in zip(_flat_all(margs, mkwargs), _flat_all(args, kwargs))}
    fresh = []

    def npu_of(m):
        a = meta_to_npu.get(id(m))
        if a is not None:
            return a
        t = S.empty_strided(m.size(), m.stride(), m.dtype, dev)
        fresh.append(t)
        return t
    result = _rebuild(mout, npu_of)
    written = [t for t in _written_args(i, args, kwargs) if t.device.type == _NPU]
    # out= arguments the meta kernel resized: resize the npu ones before their views are taken
    for a, m in zip(_written_args(i, args, kwargs), _written_args(i, margs, mkwargs)):
        if a.device.type == _NPU and a.size() != m.size():
            a.resize_(m.size())
    if runtime.stream_check_enabled():
        wset = {id(t) for t in written}
        reads = [t for t in _flat_all(args, kwargs) if t.device.type == _NPU and id(t) not in wset]
        runtime.declare_access(s, i.name, site=site, reads=_spans(reads),
                               writes=_spans(written + fresh))
    cargs, ckwargs = map_npu(args, kwargs, _cpu)
    cfresh = [S.cpu_view(t) for t in fresh]
    fresh_ids = {id(t) for t in fresh}
    # which positions of the flat result are new tensors, to copy the CPU results into
    slots = [k for k, t in enumerate(flat(result)) if id(t) in fresh_ids]

    def task():
        out = flat(op(*cargs, **ckwargs))
        for k, c in zip(slots, cfresh):
            c.copy_(out[k])
    s.enqueue(gated(task, s), i.name, "kernel", None, site)
    return result


def _spans(ts):
    out = []
    for t in ts:
        o = S.owner_of(t)
        if o is not None:
            sp = S.span(t, o)
            if sp is not None:
                out.append(sp)
    return out
