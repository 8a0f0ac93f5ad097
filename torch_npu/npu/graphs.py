"""torch.npu.NPUGraph, torch.npu.graph, graph_pool_handle, make_graphed_callables (torch_npu's
names, torch.cuda's API): npu operators and hccl collectives captured into npusim's task graphs.

The capture itself is runtime/torch/graphs.py's (its note says what a node is, how memory is
kept, what is refused); this module is the torch-facing API, as ``torch.cuda.graphs`` is for
CUDA: ``with torch.npu.graph(g):`` synchronizes the device, makes a side stream current (or the
``stream`` given), captures on it, and ``g.replay()`` runs the whole capture as one task on the
current stream. Tensors made during the capture are the static outputs: every replay rewrites
them in place; new inputs are copied into the static input tensors before a replay.
"""
from __future__ import annotations

import gc

import torch
from torch.utils import _pytree

import runtime
from runtime.torch import graphs as _tg

from .streams import Stream, stream as _stream_ctx
from .utils import synchronize

_MODES = ("global", "thread_local", "relaxed")


def is_current_stream_capturing() -> bool:
    """True while the current npu stream captures a graph."""
    return _tg.capturing()


def graph_pool_handle() -> _tg.Pool:
    """A memory pool handle graphs may share (``torch.npu.graph(g, pool=handle)``)."""
    return _tg.Pool()


class NPUGraph:
    """A captured sequence of npu work (torch_npu.npu.NPUGraph, torch.cuda.CUDAGraph's API):
    ``capture_begin`` / ``capture_end`` (or ``torch.npu.graph``), ``replay``, ``reset``,
    ``pool``."""

    def __init__(self, keep_graph: bool = False):
        self._t = _tg.TorchGraph()
        self._debug = False

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        """Capture the work enqueued on the current npu stream from here on (into this graph).
        ``capture_error_mode`` is accepted as torch.cuda's; npusim refuses what cannot be
        captured on the capturing thread whatever the mode."""
        if capture_error_mode not in _MODES:
            raise ValueError(f"capture_begin(capture_error_mode={capture_error_mode!r}): "
                             f"expected one of {_MODES}")
        self._t.begin(None, pool)

    def capture_end(self) -> None:
        self._t.end()

    def replay(self) -> None:
        """Run the captured work again, as one task on the current npu stream."""
        self._t.replay()

    def reset(self) -> None:
        """Drop the capture and give its memory back (its static outputs become plain
        tensors)."""
        self._t.reset()

    def pool(self) -> _tg.Pool:
        """This graph's memory pool handle, for another capture to share."""
        return self._t.pool()

    def instantiate(self) -> None:
        """Nothing to do: a capture is ready to replay when it ends."""

    def enable_debug_mode(self) -> None:
        self._debug = True

    def debug_dump(self, debug_path: str) -> None:
        """Write the graph's nodes, one a line, to ``debug_path``."""
        g = self._t.graph
        if g is None:
            raise RuntimeError("debug_dump: the graph has not been captured")
        with open(debug_path, "w") as f:
            for n in g._nodes:
                f.write(f"{n.name}\t{n.category}\t{n.stream.name}\t{n.site}\n")

    def __len__(self) -> int:
        g = self._t.graph
        return len(g) if g is not None else 0

    def __del__(self):
        try:
            if self._t._ctx is None:
                self._t.reset()
        except Exception:
            pass


class graph:
    """``with torch.npu.graph(g, pool=None, stream=None, capture_error_mode="global"):``
    captures the npu work of the block into NPUGraph ``g`` (torch.cuda.graph's API)."""

    default_capture_stream = None

    def __init__(self, npu_graph: NPUGraph, pool=None, stream=None,
                 capture_error_mode: str = "global"):
        if not isinstance(npu_graph, NPUGraph):
            raise TypeError(f"graph(npu_graph={npu_graph!r}): expected a torch.npu.NPUGraph")
        if capture_error_mode not in _MODES:
            raise ValueError(f"graph(capture_error_mode={capture_error_mode!r}): expected one "
                             f"of {_MODES}")
        if stream is None:
            s = self.__class__.default_capture_stream
            if s is None or s.npu_stream.device_id != runtime.get_device():
                s = self.__class__.default_capture_stream = Stream()
            stream = s
        self.npu_graph, self.pool, self.capture_stream = npu_graph, pool, stream
        self.mode = capture_error_mode

    def __enter__(self):
        synchronize()
        gc.collect()
        self.stream_ctx = _stream_ctx(self.capture_stream)
        self.stream_ctx.__enter__()
        try:
            self.npu_graph.capture_begin(self.pool, self.mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise
        return None

    def __exit__(self, exc_type, exc, tb):
        try:
            self.npu_graph._t.end(exc_type, exc, tb)
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)
        return None


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool=None):
    """Graphed versions of ``callables`` (functions or nn.Modules; one or a tuple), as
    torch.cuda.make_graphed_callables: each one's forward and backward are captured (after
    ``num_warmup_iters`` eager runs on a side stream) into two NPUGraphs, and the returned
    callable replays them inside an autograd Function. ``sample_args``: a tuple of tensors per
    callable (a tuple of tuples for several callables); later calls must pass tensors of the
    same sizes, dtypes and requires_grad."""
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError(f"make_graphed_callables: {len(callables)} callables but "
                         f"{len(sample_args)} sample_args tuples")
    if not isinstance(num_warmup_iters, int) or num_warmup_iters < 0:
        raise ValueError(f"make_graphed_callables(num_warmup_iters={num_warmup_iters!r}): "
                         "expected an int >= 0")
    flat_args, surfaces = [], []
    for c, args in zip(callables, sample_args):
        if not isinstance(args, tuple):
            raise TypeError("make_graphed_callables: sample_args must be a tuple of tensors per "
                            "callable")
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise RuntimeError("make_graphed_callables: a module with hooks cannot be "
                                   "graphed (its hooks would run once, at capture)")
        flat = tuple(_pytree.tree_leaves(args))
        for a in flat:
            if not isinstance(a, torch.Tensor) or a.device.type != "npu":
                where = f" on {a.device}" if isinstance(a, torch.Tensor) else ""
                raise TypeError("make_graphed_callables: every sample argument must be an npu "
                                f"tensor, got {type(a).__name__}{where}")
        params = tuple(c.parameters()) if isinstance(c, torch.nn.Module) else ()
        flat_args.append(flat)
        surfaces.append(flat + params)

    mempool = graph_pool_handle() if pool is None else pool
    synchronize()
    side = Stream()
    with _stream_ctx(side):             # warm up: lazy state (optimizer, caches) made eagerly
        for c, args, surf in zip(callables, sample_args, surfaces):
            for _ in range(num_warmup_iters):
                outs = [o for o in _pytree.tree_leaves(c(*args))
                        if isinstance(o, torch.Tensor) and o.requires_grad]
                ins = [t for t in surf if t.requires_grad]
                if outs and ins:
                    torch.autograd.grad(outs, ins, grad_outputs=[torch.ones_like(o) for o in outs],
                                        only_inputs=True, allow_unused=allow_unused_input)
                del outs
    synchronize()

    graphed = []
    for c, args, flat, surf in zip(callables, sample_args, flat_args, surfaces):
        fwd, bwd = NPUGraph(), NPUGraph()
        with graph(fwd, pool=mempool):
            out = c(*args)
        static_outs, spec = _pytree.tree_flatten(out)
        static_outs = tuple(static_outs)
        grad_outs = tuple(torch.empty_like(o) if isinstance(o, torch.Tensor) and o.requires_grad
                          else None for o in static_outs)
        ins_req = [t for t in surf if t.requires_grad]
        outs_req = [o for o in static_outs if isinstance(o, torch.Tensor) and o.requires_grad]
        with graph(bwd, pool=mempool):
            grads = torch.autograd.grad(outs_req, ins_req,
                                        grad_outputs=[g for g in grad_outs if g is not None],
                                        only_inputs=True, allow_unused=allow_unused_input) \
                if outs_req and ins_req else ()
        it = iter(grads)
        static_grad_ins = tuple(next(it) if t.requires_grad else None for t in surf)
        graphed.append(_graphed(c, fwd, bwd, len(flat), surf, static_outs, spec, grad_outs,
                                static_grad_ins))
    return graphed[0] if just_one else tuple(graphed)


def _graphed(c, fwd, bwd, n_user, surf, static_outs, spec, grad_outs, static_grad_ins):
    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for k in range(n_user):
                if surf[k].data_ptr() != inputs[k].data_ptr():
                    surf[k].copy_(inputs[k])
            fwd.replay()
            return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in static_outs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            for g, sg in zip(grads, grad_outs):
                if sg is not None and g is not None and g.data_ptr() != sg.data_ptr():
                    sg.copy_(g)
            bwd.replay()
            return tuple(b.detach() if b is not None else None for b in static_grad_ins)

    params = surf[n_user:]

    def functionalized(*user_args):
        flat = tuple(_pytree.tree_leaves(user_args))
        out = Graphed.apply(*flat, *params)
        return _pytree.tree_unflatten(list(out), spec)

    if isinstance(c, torch.nn.Module):
        training = c.training
        orig = c.forward

        def forward(*user_args):
            return functionalized(*user_args) if c.training == training else orig(*user_args)
        c.forward = forward
        return c
    return functionalized
