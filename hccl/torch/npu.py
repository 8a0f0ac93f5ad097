"""npu tensors in the "hccl" backend: collectives on the tensors' own device memory.

Design note (torch_npu's ProcessGroupHCCL). An npu tensor's bytes are npusim device memory
(runtime/torch/storage.py), so a collective takes its ``DevicePtr`` as it is: no staging copy,
no host round trip. Ordering is the stream's, as on a real NPU:

- the process group keeps one communication stream per NPU (``Streams``); a collective call
  records an event on the caller's current stream of the tensors' NPU and makes the
  communication stream wait for it (stream-side: the host does not block), so the collective
  runs after the kernels that produced its inputs;
- the collective, and what completes it on the device (AVG's division, the copy of a gathered
  buffer into a list of outputs, a non-contiguous tensor's copy back), are enqueued on the
  communication stream; an end event is recorded after them;
- ``Work.wait()`` makes the caller's current stream wait for the end event and returns at once
  (torch_npu's ``synchronizeStreams``); the Work's future completes, on the group's completer
  thread, once the end event is reached (DDP's reducer reads it), and fails with npusim's error;
- the tensors (and temporaries) are kept alive until the end event is reached, so their memory
  is not reused while the communication stream still reads or writes it (torch_npu's
  ``recordStream``).

Repeated calls on the same tensors pass the same DevicePtrs, so they find the Call the
communicator bound the first time (hccl/call.py): DDP's buckets are the same tensors every step.
What is not done here (gather, scatter, bitwise reductions, uneven all_to_all, all_to_all on
lists, receive from any source) stages through host memory as CPU tensors do, and its
``Work.wait()`` blocks the host (docs/torch.md).
"""
from __future__ import annotations

import threading

import torch

import runtime
from runtime import graph, sanitizer
from runtime.context import contexts_by_device, current_stream_of
from runtime.errors import NpuError
from runtime.torch import device as npu_device
from runtime.torch import graphs as npu_graphs
from runtime.torch import storage as npu_storage

from .. import collectives as C
from ..errors import InvalidArgumentError
from .work import Work, np_dtype


def on_npu(tensors) -> bool:
    """Whether any of ``tensors`` is an npu tensor (the npu path takes the call)."""
    return any(isinstance(t, torch.Tensor) and t.device.type == "npu" for t in tensors)


_DEVICES: dict = {}     # torch.device -> NPU index, of the npu devices met (``npu_index``)


def npu_index(t: torch.Tensor) -> int | None:
    """The NPU of tensor ``t``, None when it is not an npu tensor (a dict lookup by its
    ``torch.device``: the device's type name costs more than the lookup)."""
    d = t.device
    i = _DEVICES.get(d)
    if i is None:
        if d.type != "npu":
            return None
        i = _DEVICES[d] = d.index if d.index is not None else 0
    return i


def device_of(tensors, api: str) -> int:
    """The one NPU all ``tensors`` are on; InvalidArgumentError naming the devices if not."""
    devs = {str(t.device) for t in tensors}
    if len(devs) != 1:
        raise InvalidArgumentError(f"{api}: tensors are on {sorted(devs)}; one collective takes "
                                   "tensors of one device (move them with .to())")
    return tensors[0].device.index


_NP: dict = {}      # torch dtype -> numpy dtype, of the dtypes allreduce_one has met
_KEY = "torch npu allreduce"    # its Calls' keys: (_KEY, address, count, dtype, op, stream)


def _nothing() -> None:
    pass


class Streams:
    """The process group's communication stream on each NPU, made on first use."""

    def __init__(self, name: str):
        self._name = name
        self._streams: dict[int, runtime.Stream] = {}
        self._lock = threading.Lock()

    def get(self, dev: int) -> runtime.Stream:
        s = self._streams.get(dev)
        if s is None:
            with self._lock:
                s = self._streams.get(dev)
                if s is None:
                    with npu_device.on(dev):
                        s = self._streams[dev] = runtime.Stream(name=f"torch {self._name} npu")
        return s

    def close(self) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for s in streams:
            try:
                s.synchronize()
                s.destroy()
            except NpuError:
                pass          # the error was (or will be) delivered to its Work


class _Body:
    """What one call enqueues on the communication stream: pointers of dense tensors, and the
    tensors to keep alive until the end event."""

    __slots__ = ("keep", "after")

    def __init__(self):
        self.keep: list = []
        self.after: list = []      # (dense temporary, tensor) pairs copied back at the end

    def dense(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` itself when contiguous, else a contiguous copy made on the stream (copied back
        by ``finish``)."""
        self.keep.append(t)
        if t.is_contiguous():
            return t
        c = t.contiguous()
        self.keep.append(c)
        self.after.append((c, t))
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

    def finish(self) -> None:
        for c, t in self.after:
            t.copy_(c)


class NpuCollectives:
    """The npu path of a process group ``pg`` (an HcclProcessGroup): see the module note."""

    def __init__(self, pg, completer, name: str):
        self._pg = pg
        self._completer = completer
        self.streams = Streams(name)

    def _run(self, api: str, tensors: list, outputs: list, body, site: str, lane=None) -> Work:
        """Enqueue ``body(b, stream)`` on the communication stream of the tensors' NPU (or the
        point-to-point ``lane``'s stream), after the caller's current stream; a Work whose
        ``wait()`` orders the caller's current stream after it."""
        dev = device_of(tensors, api)
        stream, completer = lane if lane is not None else (self.streams.get(dev),
                                                           self._completer)
        b = _Body()
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
        completer.submit(work, end, lambda: None, keep.clear)
        return work

    def allreduce_one(self, t: torch.Tensor, dev: int, rop, site: str) -> Work | None:
        """The common call (one contiguous npu tensor, no AVG, no capture, no stream check:
        the backend's ``allreduce`` checked the rest) with only what it needs, or None for
        the general path (``allreduce``); ``dev``: its NPU (``npu_index``). The communication
        stream waits for the caller's current stream only when that one has work pending, and
        a collective that ran whole at its issue (hccl/call.py's ``begin``) completes its Work
        at once: no events, no completer, nothing for ``wait()`` to order."""
        ctx = contexts_by_device.get(dev)
        n = t.numel()
        if ctx is None or not n or sanitizer.on or graph.active:
            return None
        stream = self.streams._streams.get(dev) or self.streams.get(dev)
        cur = current_stream_of(ctx)
        if stream.capture is not None or cur.capture is not None:
            return None
        if not cur.idle():
            stream.wait_event(cur.record_event())
        p = npu_storage.owner_of(t)
        if p is None:
            return None
        p = p.dev.ptr + t.storage_offset() * t.element_size()
        dt = _NP.get(t.dtype)
        if dt is None:
            dt = _NP[t.dtype] = np_dtype(t, "allreduce")    # raises for a dtype hccl lacks
        # the communicator's Call for these very arguments (as a method's repeat finds it:
        # ``collectives._repeat``), else checked and made, and remembered under this key
        comm, objs = self._pg.comm, (p, p)
        key = (_KEY, p.addr, n, dt, rop, stream)
        call = comm._calls.find(key, objs)
        if call is not None:
            call.issue(objs, site)
        else:
            C.all_reduce_keyed(p, p, n, dt, rop, comm, stream, site, key)
        outputs = [t]
        work = Work("allreduce", outputs)
        # idle(): done at the call, every task before it finished, no error pending
        if stream._done >= stream._issued and stream._error is None and \
                self._completer.finished(work):
            return work
        end = stream.record_event()
        work.order_after(dev, end)
        self._completer.submit(work, end, _nothing, outputs.copy().clear)
        return work

    # -- collectives: each returns a Work, or None when the npu path does not take the call
    def allreduce(self, tensors, rop, avg: bool, site: str) -> Work:
        pg = self._pg

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t)
                p = b.ptr(d)
                C.all_reduce(p, p, d.numel(), np_dtype(d, "allreduce"), rop, pg.comm, s, site=site)
                if avg:
                    d.div_(pg.comm.size)
        return self._run("allreduce", list(tensors), list(tensors), body, site)

    def broadcast(self, tensors, root: int, site: str) -> Work:
        pg = self._pg

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t)
                C.broadcast(b.ptr(d), d.numel(), np_dtype(d, "broadcast"), root, pg.comm, s,
                            site=site)
        return self._run("broadcast", list(tensors), list(tensors), body, site)

    def reduce(self, tensors, rop, avg: bool, root: int, site: str) -> Work:
        pg = self._pg
        mine = pg.comm.rank == root

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t) if mine else t.contiguous()     # only the root's is written
                b.keep.append(d)
                p = b.ptr(d)
                C.reduce(p, p if mine else None, d.numel(), np_dtype(d, "reduce"), rop, root,
                         pg.comm, s, site=site)
                if avg and mine:
                    d.div_(pg.comm.size)
        return self._run("reduce", list(tensors), list(tensors), body, site)

    def allgather(self, outs, inp, site: str, api: str = "allgather") -> Work:
        """``outs``: one tensor per rank (a list), or one tensor of size x input's elements."""
        pg = self._pg
        n, size = inp.numel(), pg.comm.size
        single = isinstance(outs, torch.Tensor)

        def body(b, s, site):
            src = b.dense(inp)
            if single:
                dst = b.dense(outs)
            else:
                dst = b.temp(n * size, inp)
            C.all_gather(b.ptr(src), b.ptr(dst), n, np_dtype(inp, api), pg.comm, s, site=site)
            if not single:
                for r, o in enumerate(outs):
                    o.copy_(dst[r * n:(r + 1) * n].view(o.shape))
        outputs = [outs] if single else list(outs)
        return self._run(api, [inp, *outputs], outputs, body, site)

    def reduce_scatter(self, out, ins, rop, avg: bool, site: str,
                       api: str = "reduce_scatter") -> Work:
        """``ins``: one tensor per rank (a list), or one tensor of size x output's elements."""
        pg = self._pg
        n = out.numel()
        single = isinstance(ins, torch.Tensor)

        def body(b, s, site):
            if single:
                src = b.dense(ins)
            else:
                src = torch.cat([t.reshape(-1) for t in ins]) if n else b.temp(0, out)
                b.keep.append(src)
            dst = b.dense(out)
            C.reduce_scatter(b.ptr(src), b.ptr(dst), n, np_dtype(out, api), rop, pg.comm, s,
                             site=site)
            if avg:
                dst.div_(pg.comm.size)
        inputs = [ins] if single else list(ins)
        return self._run(api, [out, *inputs], [out], body, site)

    def all_to_all_single(self, output, input, chunk: int, site: str) -> Work:
        """Equal blocks of ``chunk`` elements to and from every rank."""
        pg = self._pg
        api = "all_to_all_single"

        def body(b, s, site):
            src, dst = b.dense(input), b.dense(output)
            C.all_to_all(b.ptr(src), chunk, b.ptr(dst), chunk, np_dtype(output, api), pg.comm, s,
                         site=site)
        return self._run(api, [output, input], [output], body, site)

    def send(self, tensors, dst: int, lane, site: str) -> Work:
        pg = self._pg

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t)
                C.send(b.ptr(d), d.numel(), np_dtype(d, "send"), dst, pg.comm, s, site=site)
        return self._run("send", list(tensors), list(tensors), body, site, lane)

    def recv(self, tensors, src: int, lane, site: str) -> Work:
        pg = self._pg

        def body(b, s, site):
            for t in tensors:
                d = b.dense(t)
                C.recv(b.ptr(d), d.numel(), np_dtype(d, "recv"), src, pg.comm, s, site=site)
        return self._run("recv", list(tensors), list(tensors), body, site, lane)

    def close(self) -> None:
        self.streams.close()
