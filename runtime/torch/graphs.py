"""torch operators captured into npusim's task graphs (torch.npu.NPUGraph; torch_npu/npu/graphs.py).

Design note. ``runtime.graph`` turns every enqueue on a capturing stream into a node of a
``runtime.Graph``. An npu operator is a task only on its slow path: on an idle stream the
fallback runs it at once (ops.py's ``_now`` / ``_run_now``), and a capturing stream is idle (its
nodes are not queued). So while the current stream captures (``Stream.capture``), the fallback
hands every computing operator to ``capture_op`` here, which takes the task path always: the
meta kernel gives the results' sizes and strides, the results are allocated now, and the task
(torch's CPU kernel on the CPU views, then a copy into the results) becomes the node. A replay
runs that task again on the same addresses: the same kernel on the same bytes, so bitwise the
eager result, without the per-operator work of the eager call (argument walk, allocation,
dispatch to the fallback): that work is what a replay saves.

Memory, as a CUDA graph's private mempool has it: an allocation during a capture comes from the
graph's ``runtime.memory.PrivatePool``; the tensors made during the capture keep their addresses
for every replay (the static outputs), and one that dies is held, not given back, since a
replay writes there; the pool is given back by ``reset()`` (or when the graph is collected).
The storages of tensors made before the capture that a node reads or writes (the static inputs,
the parameters) are kept alive by the graph too, so a replay never touches freed memory. A plain
``with runtime.graph(g):`` captures npu operators the same way but has no private pool: there a
new tensor raises the runtime's malloc GraphCaptureError (write into tensors allocated before,
``out=`` and in-place operators; or use NPUGraph).

What cannot be captured raises ``GraphCaptureError`` naming the operator, as CUDA's "operation
not permitted when stream is capturing": an operator whose result is data on the host (``item``,
``equal``, ``nonzero``: torch's ``Scalar`` / data-dependent results), a copy to the host
(``.cpu()``, ``print``), and, from runtime.graph, a synchronize. The capture then goes on (the
error leaves the ``with`` block, which discards it).

Imports: this module imports ops.py and registers ``capture_op`` with it (``ops.set_capture``);
ops.py never imports this module (kernels.py imports both, so the hook is set at registration).
"""
from __future__ import annotations

import importlib

import runtime
from runtime.errors import GraphCaptureError
from runtime.memory import PrivatePool, private_pool

from . import ops
from . import storage as S

rgraph = importlib.import_module("runtime.graph")      # the module (runtime.graph is a function)


def capturing(stream=None) -> bool:
    """Whether ``stream`` (the current stream when None) is capturing a graph."""
    if not rgraph.active:
        return False
    s = stream if stream is not None else runtime.current_stream()
    return s.capture is not None


def refuse(what: str, s=None) -> None:
    """Raise GraphCaptureError for ``what`` (an operator name, a copy), which cannot be captured
    on stream ``s`` (the current one when None)."""
    s = s if s is not None else runtime.current_stream()
    cap = s.capture
    gname = cap.graph.name if cap is not None else "a graph"
    raise GraphCaptureError(
        f"{what}: operation not permitted when stream is capturing ({s.name} captures "
        f"{gname}): it needs the data on the host, which a capture does not compute. Move it "
        "before the capture or after the replay (synchronize, then read the static outputs).")


def _keep_storages(s, tensors) -> None:
    """Keep the allocations of npu ``tensors`` alive as long as the graph ``s`` captures."""
    keep = getattr(s.capture.graph, "npu_keep", None)
    if keep is None:
        return
    for t in tensors:
        if t.device.type == "npu":
            o = S.owner_of(t)
            if o is not None:
                keep[id(o.dev)] = o.dev


def capture_op(op, i, dev: int, s, args, kwargs):
    """The fallback's computing operator ``op`` (``i``: ops.OpInfo) as a node of the graph that
    stream ``s`` captures (see the note)."""
    if i.sync:
        refuse(f"{i.name} (a result on the host: a Scalar, a bool; .item())", s)
    try:
        margs, mkwargs = ops.map_npu(args, kwargs, ops.meta_like)
        mout = op(*margs, **mkwargs)
    except GraphCaptureError:
        raise
    except Exception as e:      # eager code would wait for the stream and run it at once
        try:
            refuse(f"{i.name} (no result sizes without the data: its meta kernel raised "
                   f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})", s)
        except GraphCaptureError as err:
            raise err from e
    g = s.capture.graph
    if getattr(g, "npu_keep", None) is None:
        g.npu_keep = {}         # a plain ``with runtime.graph(g)``: kept while g lives
    result = ops.enqueue_task(op, i, dev, s, args, kwargs, margs, mkwargs, mout)
    _keep_storages(s, ops.tensors_in(args, kwargs))
    _keep_storages(s, ops.flat(result))
    return result


class Pool:
    """A graph memory pool handle (``torch.npu.graph_pool_handle()``, ``NPUGraph.pool()``):
    graphs captured with one share its PrivatePool, which is given back once the last of them
    is reset."""

    def __init__(self):
        self.private = PrivatePool()
        self.users = 0

    def acquire(self) -> None:
        self.users += 1

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0:
            self.users = 0
            self.private.release()


class TorchGraph:
    """One capture of npu operators and collectives: ``begin(stream, pool)``, ``end()``,
    ``replay(stream)``, ``reset()``. torch_npu.npu.NPUGraph is the torch-facing class."""

    def __init__(self):
        self._g = None
        self._ctx = None
        self._pool: Pool | None = None
        self._keep: dict = {}
        self._prev_pool = None

    @property
    def graph(self):
        return self._g

    def begin(self, stream=None, pool: Pool | None = None) -> None:
        if self._ctx is not None:
            raise GraphCaptureError("capture_begin: this graph is capturing already")
        if self._g is not None:
            raise GraphCaptureError("capture_begin: this graph was captured already; call "
                                    "reset() first to capture again")
        if pool is not None and not isinstance(pool, Pool):
            raise TypeError(f"capture_begin(pool={pool!r}): expected a handle from "
                            "torch.npu.graph_pool_handle() or another graph's pool()")
        g = runtime.Graph()
        g.npu_keep = self._keep
        ctx = runtime.graph(g, stream=stream)
        ctx.__enter__()
        if pool is not None and pool is not self._pool:
            if self._pool is not None:
                self._pool.release()
            self._pool = pool
            pool.acquire()
        elif self._pool is None:
            self._pool = Pool()
            self._pool.acquire()
        g.npu_pool = self._pool.private
        self._g, self._ctx = g, ctx
        self._prev_pool = getattr(private_pool, "pool", None)
        private_pool.pool = self._pool.private

    def end(self, exc_type=None, exc=None, tb=None) -> None:
        if self._ctx is None:
            raise GraphCaptureError("capture_end: no capture is running on this graph")
        ctx, self._ctx = self._ctx, None
        private_pool.pool = self._prev_pool
        self._prev_pool = None
        try:
            ctx.__exit__(exc_type, exc, tb)
        except BaseException:
            self.reset()
            raise
        if exc_type is not None:
            self.reset()            # the capture is discarded (runtime.graph's rule)

    def replay(self, stream=None) -> int:
        if self._g is None or not self._g.captured:
            raise GraphCaptureError("replay: the graph has not been captured (use "
                                    "torch.npu.graph(g) or capture_begin / capture_end first)")
        return self._g.replay(stream)

    def reset(self) -> None:
        if self._ctx is not None:
            raise GraphCaptureError("reset: the graph is capturing; end the capture first")
        self._g = None
        self._keep.clear()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.release()

    def pool(self) -> Pool:
        if self._pool is None:
            self._pool = Pool()
            self._pool.acquire()
        return self._pool


def captured_work(work, end, keep) -> None:
    """A collective of the torch backend (hccl/torch/npu.py) issued while its streams capture:
    its Work completes now (what it orders is the graph's; ``wait()`` joins the capture through
    its end event), and what the collective must keep alive (``keep``: temporaries) lives as
    long as the graph, since every replay uses it."""
    g = end.captured_by[0].graph
    keep_all = getattr(g, "npu_keep", None)
    if keep_all is not None:
        keep_all[id(keep)] = keep
    # the capturing stream joins the collective now: DDP waits on the Work's future, which
    # orders no stream (a replay runs the nodes one after the other anyway: nothing is lost)
    cur = runtime.current_stream()
    if cur.capture is not None:
        cur.wait_event(end)
    work.complete(None)


ops.set_capture(capture_op)      # the fallback's operators on a capturing stream become nodes
