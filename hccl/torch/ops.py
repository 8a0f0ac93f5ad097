"""The "hccl" torch backend's collectives, written once for npu and CPU tensors.

Design note. Every collective is one *body*: a function that, given a ``Body`` ``b`` and the
stream ``s``, turns the call's tensors into device buffers (``b.dense``, ``b.temp``,
``b.ptr``), issues the hccl collective(s) on ``s`` and registers what completes it
(``b.then``: AVG's division, the copy of a gathered buffer into a list of outputs). Two kinds
of Body carry it out:

- ``DeviceBody``, npu tensors (torch_npu's ProcessGroupHCCL; hccl/torch/npu.py): the buffers
  are the tensors' own device memory (a non-contiguous tensor gets a contiguous copy, copied
  back at the end); the body runs inside the communication stream's context, after the
  caller's current stream, so its copies, ``then`` steps and copies back are stream-ordered
  operators; ``Work.wait()`` orders the caller's stream after the end event and returns at once;
- ``StagedBody``, CPU tensors (and npu tensors a point-to-point lane of another NPU carries):
  the buffers are staging arrays in device memory (work.py's ``Staging``), loaded from the
  tensors on the calling thread; the ``then`` steps and the copies back run on the group's
  completer thread once the end event is reached, and ``Work.wait()`` blocks until then.

The ``then`` steps are torch operators on the buffers as tensors (a staging array is seen as a
CPU tensor sharing its memory), so the same code completes both. ``Ops.run`` picks the Body,
the stream and the completion; the process group (backend.py) checks the arguments first.
One dense npu tensor's all_reduce takes a shorter branch of the npu path (npu.py: ``FastAllReduce``).
"""
from __future__ import annotations

import torch

import runtime
from runtime.torch import device as npu_device
from runtime.torch import graphs as npu_graphs
from runtime.torch import storage as npu_storage

from .. import collectives as C
from .npu import Streams, device_of, on_npu
from . import work as torch_work
from .work import Spares, Staging, Work, as_tensor, np_dtype, view

_BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}


def _nothing() -> None:
    pass


def _block(o: torch.Tensor, buf: torch.Tensor, start: int) -> None:
    """Copy ``o.numel()`` elements of flat ``buf`` from ``start`` into ``o``."""
    if o.numel():
        o.copy_(buf[start:start + o.numel()].view(o.shape))


def _divide(d: torch.Tensor, size: int) -> None:
    d.div_(size)


def _fold(fn, gathered: torch.Tensor, d: torch.Tensor, size: int) -> None:
    """``d`` = ``fn`` over the ``size`` rows of ``gathered``, in rank order (exact: bitwise)."""
    n = d.numel()
    if n:
        acc = gathered[:n]
        for r in range(1, size):
            acc = fn(acc, gathered[r * n:(r + 1) * n])
        d.copy_(acc.view(d.shape))


class Body:
    """What one call does around its collectives: buffers, and the steps that complete it."""

    __slots__ = ("keep", "post", "back")

    def __init__(self):
        self.keep: list = []       # what must live until the end event (npu)
        self.post: list = []       # (fn, args): steps after the collectives
        self.back: list = []       # (fn, args): copies back into the caller's tensors, last

    def then(self, fn, *args) -> None:
        """Run ``fn(*args)`` once the collectives are done (in stream order on npu)."""
        self.post.append((fn, args))

    def put(self, buf: torch.Tensor, start: int, t: torch.Tensor) -> None:
        """Copy tensor ``t`` (any strides) into flat buffer ``buf`` at element ``start``, before
        the collective (on npu: in stream order)."""
        if t.numel():
            buf[start:start + t.numel()].view(t.shape).copy_(t.detach())

    def finish(self) -> None:
        for fn, args in self.post:
            fn(*args)
        for fn, args in self.back:
            fn(*args)


class DeviceBody(Body):
    """npu tensors: their own device memory (see the module note)."""

    __slots__ = ()

    def dense(self, t: torch.Tensor, back: bool = True, load: bool = True) -> torch.Tensor:
        """``t`` itself when contiguous, else a contiguous copy made on the stream (copied back
        at the end when ``back``)."""
        self.keep.append(t)
        if t.is_contiguous():
            return t
        c = t.contiguous()
        self.keep.append(c)
        if back:
            self.back.append((t.copy_, (c,)))
        return c

    def ptr(self, t: torch.Tensor):
        """The DevicePtr of contiguous npu tensor ``t`` (an empty DeviceArray when it has no
        bytes: every rank still takes part in the collective)."""
        o = npu_storage.owner_of(t)
        if o is None or t.numel() == 0:
            a = runtime.empty(0, np_dtype(t, "collective"))
            self.keep.append(a)
            return a
        return o.dev.ptr + t.storage_offset() * t.element_size()

    def temp(self, n: int, like: torch.Tensor) -> torch.Tensor:
        t = torch.empty(n, dtype=like.dtype, device=like.device)
        self.keep.append(t)
        return t


class StagedBody(Body):
    """Tensors staged through device buffers (work.py's ``Staging``; see the module note)."""

    __slots__ = ("staging", "arrays")

    def __init__(self, spares: Spares | None = None):
        super().__init__()
        self.staging = Staging(spares)
        self.arrays: dict = {}     # id of a staging tensor -> its device array

    def _stage(self, n: int, like: torch.Tensor, api: str = "collective"):
        a = self.staging.buffer(n, np_dtype(like, api))
        v = as_tensor(view(a), like.dtype, (n,))
        self.arrays[id(v)] = a
        self.keep.append(v)         # its id stays its own while the call lasts
        return a, v

    def dense(self, t: torch.Tensor, back: bool = True, load: bool = True) -> torch.Tensor:
        """A staging buffer (as a flat CPU tensor) loaded with ``t`` when ``load``, copied back
        into ``t`` at the end when ``back``."""
        a, v = self._stage(t.numel(), t)
        if load:
            torch_work.put(a, 0, t)
        if back:
            self.back.append((torch_work.take, (a, 0, t)))
        return v

    def ptr(self, t: torch.Tensor):
        return self.arrays[id(t)]

    def temp(self, n: int, like: torch.Tensor) -> torch.Tensor:
        return self._stage(n, like)[1]

    def finish(self) -> None:
        with torch.no_grad():       # the completer's thread: no autograd of its own
            Body.finish(self)


class Ops:
    """The collectives of a process group ``pg`` (an HcclProcessGroup): see the module note.
    ``streams``: its communication stream per NPU."""

    def __init__(self, pg, name: str):
        self._pg = pg
        self.streams = Streams(name)
        self.spares = Spares()      # staging buffers for the next calls

    def run(self, api: str, tensors: list, outputs: list, body, site: str, lane=None,
            staged: bool | None = None) -> Work:
        """Run ``body(b, stream, site)`` on ``tensors`` (all the call's tensors; ``outputs``:
        the Work's): npu tensors on the communication stream of their NPU (or the
        point-to-point ``lane``'s stream, a (stream, completer) pair), stream-ordered; CPU
        tensors (or ``staged``) staged, on the group's stream (or the lane's)."""
        pg = self._pg
        if staged is None:
            staged = not on_npu(tensors)
        if staged:
            for t in tensors:
                np_dtype(t, api)
            stream, completer = lane or (pg.stream, pg._completer)
            b = StagedBody(self.spares)
            try:
                body(b, stream, site)
            except BaseException:
                # a multi-tensor call may have enqueued some collectives: free after the stream
                completer.submit(Work(api, []), stream.record_event(), _nothing, b.staging.free)
                raise
            work = Work(api, outputs)
            completer.submit(work, stream.record_event(), b.finish, b.staging.free)
            return work
        dev = device_of(tensors, api)
        stream, completer = lane if lane is not None else (self.streams.get(dev), pg._completer)
        b = DeviceBody()
        with npu_device.on(dev):
            cur = runtime.current_stream()
            stream.wait_event(cur.record_event())
            try:
                with runtime.stream(stream), torch.no_grad():
                    body(b, stream, site)
                    b.finish()
            finally:
                end = stream.record_event()
        work = Work(api, outputs)
        work.order_after(dev, end)
        keep = b.keep
        if end.captured_by is not None:     # in a torch graph capture: done at each replay
            npu_graphs.captured_work(work, end, keep)
            return work
        completer.submit(work, end, _nothing, keep.clear)
        return work

    # -- collectives: the process group checked the arguments
    def allreduce(self, tensors, rop, avg: bool, site: str) -> Work:
        comm = self._pg.comm

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t)
                p = b.ptr(d)
                C.all_reduce(p, p, d.numel(), np_dtype(d, "allreduce"), rop, comm, s, site=site)
                if avg:
                    b.then(_divide, d, comm.size)
        return self.run("allreduce", list(tensors), list(tensors), body, site)

    def reduce_bitwise(self, api: str, tensors, kind: str, root, site: str) -> Work:
        """all_reduce (``root`` None) or reduce with BAND / BOR / BXOR (``kind``): every rank's
        tensors gathered, then folded in rank order (gloo's bitwise reductions)."""
        comm, fn = self._pg.comm, _BITWISE[kind]
        mine = root is None or comm.rank == root

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t, back=mine)
                g = b.temp(t.numel() * comm.size, d)
                C.all_gather(b.ptr(d), b.ptr(g), d.numel(), np_dtype(d, api), comm, s, site=site)
                if mine:
                    b.then(_fold, fn, g, d, comm.size)
        return self.run(api, list(tensors), list(tensors), body, site)

    def broadcast(self, tensors, root: int, site: str) -> Work:
        comm = self._pg.comm
        mine = comm.rank == root

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t, load=mine)
                C.broadcast(b.ptr(d), d.numel(), np_dtype(d, "broadcast"), root, comm, s,
                            site=site)
        return self.run("broadcast", list(tensors), list(tensors), body, site)

    def reduce(self, tensors, rop, avg: bool, root: int, site: str) -> Work:
        comm = self._pg.comm
        mine = comm.rank == root

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t, back=mine)       # only the root's tensor receives the result
                p = b.ptr(d)
                C.reduce(p, p if mine else None, d.numel(), np_dtype(d, "reduce"), rop, root,
                         comm, s, site=site)
                if avg and mine:
                    b.then(_divide, d, comm.size)
        return self.run("reduce", list(tensors), list(tensors), body, site)

    def allgather(self, outs, inp, site: str, api: str = "allgather") -> Work:
        """``outs``: one tensor per rank (a list: gather's is [] off the root), or one tensor
        of size x input's elements."""
        comm = self._pg.comm
        n, size = inp.numel(), comm.size
        single = isinstance(outs, torch.Tensor)

        def body(b, s, site):
            src = b.dense(inp, back=False)
            dst = b.dense(outs, load=False) if single else b.temp(n * size, inp)
            C.all_gather(b.ptr(src), b.ptr(dst), n, np_dtype(inp, api), comm, s, site=site)
            if not single:
                for r, o in enumerate(outs):
                    b.then(_block, o, dst, r * n)
        outputs = [outs] if single else list(outs)
        return self.run(api, [inp, *outputs], outputs, body, site)

    def scatter(self, out, ins, root: int, site: str) -> Work:
        """The root's blocks ``ins`` (one per rank; [] elsewhere) to every rank; each keeps its
        own."""
        comm = self._pg.comm
        n, size = out.numel(), comm.size

        def body(b, s, site):
            buf = b.temp(n * size, out)
            for r, t in enumerate(ins):
                b.put(buf, r * n, t)
            C.broadcast(b.ptr(buf), n * size, np_dtype(out, "scatter"), root, comm, s, site=site)
            b.then(_block, out, buf, comm.rank * n)
        return self.run("scatter", [out, *ins], [out], body, site)

    def reduce_scatter(self, out, ins, rop, avg: bool, site: str,
                       api: str = "reduce_scatter") -> Work:
        """``ins``: one tensor per rank (a list), or one tensor of size x output's elements."""
        comm = self._pg.comm
        n, size = out.numel(), comm.size
        single = isinstance(ins, torch.Tensor)

        def body(b, s, site):
            if single:
                src = b.dense(ins, back=False)
            else:
                src = b.temp(n * size, out)
                for r, t in enumerate(ins):
                    b.put(src, r * n, t)
            dst = b.dense(out, load=False)
            C.reduce_scatter(b.ptr(src), b.ptr(dst), n, np_dtype(out, api), rop, comm, s,
                             site=site)
            if avg:
                b.then(_divide, dst, size)
        inputs = [ins] if single else list(ins)
        return self.run(api, [out, *inputs], [out], body, site)

    def all_to_all(self, api: str, outputs, inputs, in_counts, out_counts, chunk: int,
                   site: str) -> Work:
        """Block ``dst`` of the flat ``inputs`` (``in_counts`` elements each, in order) to rank
        ``dst``, block ``src`` of the outputs (``out_counts``) from rank ``src``: hccl's
        AlltoAll of ``chunk`` elements per block (the largest count: smaller blocks padded).
        ``inputs`` / ``outputs``: lists of tensors; one tensor each, split by the counts, when
        the list holds one tensor and the counts more."""
        comm = self._pg.comm
        size = comm.size
        dt = np_dtype(outputs[0], api)
        one_in, one_out = len(inputs) != len(in_counts), len(outputs) != len(out_counts)
        even = one_in and one_out and chunk * size == inputs[0].numel() == outputs[0].numel() \
            and set(in_counts) == set(out_counts) == {chunk}

        def body(b, s, site):
            if even:        # the tensors as they are: no padding
                src, dst = b.dense(inputs[0], back=False), b.dense(outputs[0], load=False)
                C.all_to_all(b.ptr(src), chunk, b.ptr(dst), chunk, dt, comm, s, site=site)
                return
            send, recv = b.temp(chunk * size, outputs[0]), b.temp(chunk * size, outputs[0])
            flat_in = inputs[0].detach().reshape(-1) if one_in else None
            off = 0
            for dst, c in enumerate(in_counts):
                b.put(send, dst * chunk, flat_in[off:off + c] if one_in else inputs[dst])
                off += c
            C.all_to_all(b.ptr(send), chunk, b.ptr(recv), chunk, dt, comm, s, site=site)
            if one_out:
                flat = b.dense(outputs[0], load=False).view(-1)
                off = 0
                for src, c in enumerate(out_counts):
                    b.then(_block, flat[off:off + c], recv, src * chunk)
                    off += c
            else:
                for src, o in enumerate(outputs):
                    b.then(_block, o, recv, src * chunk)
        return self.run(api, [*outputs, *inputs], list(outputs), body, site)

    def barrier(self, site: str) -> Work:
        comm = self._pg.comm

        def body(b, s, site):
            C.barrier(comm, s, site=site)
        return self.run("barrier", [], [], body, site)

    def p2p(self, api: str, tensors, peer: int, lane, site: str) -> Work:
        """send or recv (``api``) of ``tensors`` with group rank ``peer`` on ``lane``: npu
        tensors of the lane's NPU on their memory, others staged."""
        comm = self._pg.comm
        op, send = (C.send, True) if api == "send" else (C.recv, False)
        staged = not on_npu(tensors) or any(
            t.device.type != "npu" or t.device.index != lane[0].device_id for t in tensors)

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t, back=not send, load=send)
                op(b.ptr(d), d.numel(), np_dtype(d, api), peer, comm, s, site=site)
        return self.run(api, list(tensors), list(tensors), body, site, lane, staged)

    def close(self) -> None:
        self.streams.close()
        self.spares.close()


__all__ = ["Ops", "Body", "DeviceBody", "StagedBody"]
