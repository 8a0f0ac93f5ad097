"""torch.compile on npu: Dynamo never traces npusim's own Python, and Inductor's CPU code
generation serves npu tensors.

Dynamo. An npu operator is a Python kernel that torch's dispatcher calls from C++. Under
``torch.compile`` Dynamo's frame callback sees every Python frame that starts while a compiled
function runs, also those the dispatcher starts: with ``DDP(model)``, whose hooks run eagerly
inside the compiled call, Dynamo tried to compile the fallback, then npusim's allocator
(``view.view(_Owner)``: "argument of type: <class 'type'>"). npusim's packages (runtime, hccl,
torch_npu) are therefore on Dynamo's skip list, as torch's own files and numpy are: their frames
run as plain Python, and a compiled function that calls one of them
(``torch.npu.current_stream()``) breaks its graph there, as at any skipped function. The list is
``torch._dynamo.trace_rules.add`` (what torch uses for its own skipped modules; not a documented
API: ``torch.compiler.disable`` is, but it wraps every call in a switch of the frame callback, a
cost on every operator). Importing ``torch._dynamo`` takes 2-3 s, so npusim does not import it:
the packages are added when Dynamo's trace_rules module is imported (an import hook), or at once
when it already is (importhook.py): ``skip_in_dynamo()``, at the device's registration.

Inductor. An npu tensor's bytes are host memory (storage.py), so the C++ kernels Inductor
generates for the CPU can read and write them as they are. Registering ``npu`` as an Inductor
device of its own (``register_backend_for_device("npu", CppScheduling, PythonWrapperCodegen)``,
tried first) does not get there: Inductor's scheduler, lowerings and C++ code generation test
``device.type == "cpu"`` in dozens of places (a reduction fused with a pointwise op on "npu"
took the GPU path of ``_try_reindex_pointwise_for_reduction`` and failed), so npu would have to
be CPU in every one of them. Instead, Inductor compiles the graph *for the CPU*, and the
compiled call runs on CPU views of the npu tensors:

- ``torch._inductor.compile_fx.compile_fx`` (what ``torch.compile(backend="inductor")`` calls,
  by module attribute, at every compile) is wrapped: a graph with an npu example input gets its
  ``npu`` device constants replaced by ``cpu`` and CPU fake tensors as example inputs, and is
  compiled by Inductor as any CPU graph (AOTAutograd, C++ kernels, extern aten kernels);
- each call: the device's current stream is waited for when it has work queued (stream order:
  the kernels read what earlier npu operators wrote), npu arguments become CPU views of their
  bytes (storage.cpu_view: no copy; an in-place write of the compiled code lands in the npu
  tensor), CPU results are copied into new npu tensors (dense, same strides);
- autograd: an argument that requires grad enters through ``_ToCpu`` and a result leaves
  through ``_ToNpu``, two autograd Functions whose backward moves the gradient the other way
  (the compiled backward of AOTAutograd runs on CPU views in between), so ``loss.backward()``
  reaches the npu parameters as in eager code.

What is left out, and why: a compiled result never aliases an npu input (a view returned by the
graph is a copy); the C++ wrapper (``cpp_wrapper``), AOTInductor and ``mode="reduce-overhead"``
(CUDA graph trees) are not provided for npu; a graph with tensors of two npu devices, or npu
and CPU tensors mixed, is compiled for the first npu device only if the CPU ones are scalars.
``torch._dynamo.device_interface`` has ``npu`` registered (the CPU's interface with npusim's
device index and synchronize) for code that asks it.

Inductor is imported lazily (2-5 s); ``install()`` wraps compile_fx when
``torch._inductor.compile_fx`` is imported, as ``skip_in_dynamo`` does for Dynamo's skip list.
"""
from __future__ import annotations

import functools

import torch

import runtime

from . import device as _device
from . import storage as S
from .importhook import when_imported

_DYNAMO_RULES = "torch._dynamo.trace_rules"
PACKAGES = ("runtime", "hccl", "torch_npu")       # the packages Dynamo skips


def _skip(trace_rules) -> None:
    for name in PACKAGES:
        try:
            trace_rules.add(name)
        except Exception:          # a package not importable here (hccl without its extras)
            pass


def skip_in_dynamo() -> None:
    """Put npusim's packages on Dynamo's skip list, now or when Dynamo is imported."""
    when_imported(_DYNAMO_RULES, _skip)


_TARGET = "torch._inductor.compile_fx"
_done = False
_CPU = torch.device("cpu")


def _ready(dev: int) -> None:
    """The npu device's current stream has no queued work left (stream order)."""
    with _device.on(dev):
        s = runtime.current_stream()
        if not s.idle():
            s.synchronize()


class _ToCpu(torch.autograd.Function):
    """npu tensor -> a CPU view of its bytes; the gradient goes back to the npu."""

    @staticmethod
    def forward(ctx, t):
        ctx.dev = t.device
        return S.cpu_view(t)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dev)


class _ToNpu(torch.autograd.Function):
    """CPU result -> a new npu tensor; the gradient comes to the CPU as a view of its bytes."""

    @staticmethod
    def forward(ctx, c, dev: int):
        ctx.dev = dev
        from .ops import to_npu
        with _device.on(dev):
            return to_npu(c.contiguous() if not _dense(c) else c, dev)

    @staticmethod
    def backward(ctx, g):
        if g.device.type == "npu":
            _ready(g.device.index)
            return S.cpu_view(g), None
        return g, None


def _dense(c) -> bool:
    from .ops import non_overlapping_dense
    return non_overlapping_dense(c.size(), c.stride())


def _to_cpu_graph(gm) -> None:
    """Replace the npu device constants of ``gm``'s nodes by the CPU (in place)."""
    def fix(a):
        if isinstance(a, torch.device) and a.type == "npu":
            return _CPU
        if isinstance(a, str) and a.startswith("npu"):
            return "cpu"
        return a
    changed = False
    for node in gm.graph.nodes:
        args = torch.utils._pytree.tree_map(fix, node.args)
        kwargs = torch.utils._pytree.tree_map(fix, node.kwargs)
        if args != node.args or kwargs != node.kwargs:
            node.args, node.kwargs, changed = args, kwargs, True
    if changed:
        gm.recompile()


def _cpu_example(t, fake_mode):
    if not isinstance(t, torch.Tensor) or t.device.type != "npu":
        return t
    with fake_mode:
        c = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
    if t.requires_grad:
        c.requires_grad_(True)
    return c


def _npu_device_of(example_inputs):
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "npu":
            return t.device
    return None


def compile_fx_npu(orig, model_, example_inputs_, *args, **kwargs):
    """``compile_fx`` for a graph of npu tensors: compiled for the CPU, run on CPU views (see
    the note); any other graph goes to ``orig`` unchanged."""
    dev = _npu_device_of(example_inputs_)
    if dev is None or not isinstance(model_, torch.fx.GraphModule):
        return orig(model_, example_inputs_, *args, **kwargs)
    from torch._guards import detect_fake_mode
    fake_mode = detect_fake_mode(example_inputs_)
    if fake_mode is None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake_mode = FakeTensorMode()
    _to_cpu_graph(model_)
    cpu_inputs = [_cpu_example(t, fake_mode) for t in example_inputs_]
    compiled = orig(model_, cpu_inputs, *args, **kwargs)
    index = dev.index if dev.index is not None else _device.current()
    return _npu_call(compiled, index)


def _npu_call(compiled, index: int):
    def run(*args):
        _ready(index)
        grad = torch.is_grad_enabled()
        cargs = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type == "npu":
                a = _ToCpu.apply(a) if grad and a.requires_grad else S.cpu_view(a)
            cargs.append(a)
        args = None
        out = compiled(*cargs)

        def back(o):
            if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                if grad and o.requires_grad:
                    return _ToNpu.apply(o, index)
                from .ops import to_npu
                with _device.on(index):
                    return to_npu(o if _dense(o) else o.contiguous(), index)
            return o
        if isinstance(out, (list, tuple)):
            return type(out)(back(o) for o in out)
        return back(out)
    return run


def register() -> None:
    """Wrap Inductor's compile_fx and register npu's device interface (once)."""
    global _done
    if _done:
        return
    _done = True
    import torch._inductor.compile_fx as cfx
    from torch._dynamo.device_interface import CpuInterface, register_interface_for_device

    orig = cfx.compile_fx
    cfx.compile_fx = functools.wraps(orig)(functools.partial(compile_fx_npu, orig))

    class NpuInterface(CpuInterface):
        @staticmethod
        def current_device() -> int:
            return _device.current()

        @staticmethod
        def set_device(device) -> None:
            runtime.set_device(_device.target(device))

        @staticmethod
        def device_count() -> int:
            return torch.npu.device_count()

        @staticmethod
        def synchronize(device=None) -> None:
            torch.npu.synchronize(device)

        @staticmethod
        def is_triton_capable(device=None) -> bool:
            return False

    register_interface_for_device("npu", NpuInterface)


def install() -> None:
    """Register now if Inductor is imported, else when it is."""
    when_imported(_TARGET, lambda module: register())
