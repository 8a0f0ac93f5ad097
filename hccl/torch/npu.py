"""npu tensors in the "hccl" backend: their NPU, the communication streams, and the short
branch of one dense tensor's all_reduce.

Design note (torch_npu's ProcessGroupHCCL). An npu tensor's bytes are npusim device memory
(runtime/torch/storage.py), so a collective takes its ``DevicePtr`` as it is: no staging copy,
no host round trip (ops.py writes every collective once; this module holds what is npu's):

- the process group keeps one communication stream per NPU (``Streams``); a collective call
  records an event on the caller's current stream of the tensors' NPU and makes the
  communication stream wait for it (stream-side: the host does not block);
- ``Work.wait()`` makes the caller's current stream wait for the end event and returns at once
  (torch_npu's ``synchronizeStreams``); the Work's future completes once the end event is
  reached (DDP's reducer reads it), and fails with npusim's error;
- the tensors are kept alive until the end event is reached (torch_npu's ``recordStream``).

``FastAllReduce`` is the npu path's branch for its common call: one dense tensor (DDP's
buckets, the same tensors every step), found by its DevicePtr in the communicator's bound Calls
(hccl/call.py); a collective that ran whole at its issue completes its Work at once, a late
one is completed by the group's next call or by whoever asks its Work, without waking the
completer thread (work.py's ``Completer.defer``).
"""
from __future__ import annotations

import threading

import torch

import runtime
from runtime import graph, sanitizer
from runtime.context import contexts_by_device, current_stream_of
from runtime.errors import NpuError
from runtime.torch import device as npu_device
from runtime.torch import storage as npu_storage

from .. import collectives as C
from ..errors import InvalidArgumentError
from .work import Work, np_dtype


def on_npu(tensors) -> bool:
    """Whether any of ``tensors`` is an npu tensor (the npu path takes the call)."""
    return any(isinstance(t, torch.Tensor) and t.device.type == "npu" for t in tensors)


NPU_OF: dict = {}     # torch.device -> NPU index, of the npu devices met (``npu_index``)


def npu_index(t: torch.Tensor) -> int | None:
    """The NPU of tensor ``t``, None when it is not an npu tensor (a dict lookup by its
    ``torch.device``: the device's type name costs more than the lookup)."""
    d = t.device
    i = NPU_OF.get(d)
    if i is None:
        if d.type != "npu":
            return None
        i = NPU_OF[d] = d.index if d.index is not None else 0
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


class FastAllReduce:
    """One dense tensor's all_reduce, the common call (DDP's buckets), on the shortest branch
    of the npu path (ops.py). What the general path finds per call is found once per (tensor
    address, count, dtype, op) and kept (``_seen``): whether it is an npu tensor the branch
    takes, its NPU, the communication stream, the DevicePtr, and the Call the communicator
    bound for it, which ``Call.holds`` validates at every call (a freed or reallocated tensor
    misses: found afresh). A collective done at its issue completes its Work at once; a late
    one is deferred (work.py's ``Completer.defer``)."""

    BOUND = 4096        # entries of ``_seen`` (cleared when full)

    def __init__(self, pg, streams: Streams):
        self._pg = pg
        self._completer = pg._completer
        self.streams = streams
        self._seen: dict = {}
        # the last Work completed at the call (``_seen``'s key, Work), given again for the same
        # tensor's next call completed at the call while nobody made its futures
        # (``Completer.again``): a completed Work is all state, and making one is a call into
        # torch's C++. One only: it keeps its tensor alive until the group's next such call
        self._last: tuple = (None, None)

    def allreduce_one(self, t: torch.Tensor, kind: int, rop, site: str) -> Work | None:
        """All_reduce of contiguous dense ``t`` with ``rop`` (torch's op ``kind``: neither AVG
        nor bitwise; the backend checked), or None for the general path (not an npu tensor of
        npusim's memory, bool, empty, a capture, the stream sanitizer). The communication
        stream waits for the caller's current stream only when that one has work pending."""
        seen = (t.data_ptr(), t.numel(), t.dtype, kind)
        got = self._seen.get(seen)
        if got is None:
            got = self._find(t, rop, seen)
        if got is False or sanitizer.on or graph.active:
            return None
        dev, stream, objs, call = got
        ctx = contexts_by_device.get(dev)
        if ctx is None:
            return None
        cur = current_stream_of(ctx)
        if stream.capture is not None or cur.capture is not None:
            return None
        if not cur.idle():
            stream.wait_event(cur.record_event())
        if call is None or not call.holds(objs):    # first call, or the memory changed hands
            got = self._find(t, rop, seen)
            if got is False or got[0] != dev:
                return None
            dev, stream, objs, call = got
        if call is not None:
            call.issue(objs, site)
        else:   # checked and made, and remembered under its key (``collectives._repeat``)
            p = objs[0]
            key = (_KEY, p.addr, t.numel(), _NP[t.dtype], rop, stream)
            C.all_reduce_keyed(p, p, t.numel(), key[3], rop, self._pg.comm, stream, site, key)
            self._seen[seen] = (dev, stream, objs, self._pg.comm.find_call(key, objs))
        # idle(): done at the call, every task before it finished, no error pending
        if stream.idle():
            key, work = self._last
            if key == seen and self._completer.again(work, t):
                return work     # the same tensor's last Work: completed, untouched, as new
            work = Work("allreduce", [t])
            if self._completer.finished(work):
                self._last = (seen, work) if work.is_success() else (None, None)
                return work
        else:
            work = Work("allreduce", [t])
        self._last = (None, None)       # kept for the next call only
        end = stream.record_event()
        work.order_after(dev, end)
        self._completer.defer(work, end, [t].clear)
        return work

    def _find(self, t: torch.Tensor, rop, seen):
        """(NPU, stream, buffers, bound Call or None) of ``t``'s all_reduce, kept under
        ``seen``; False (kept too) when the branch does not take ``t``."""
        if len(self._seen) >= self.BOUND:
            self._seen.clear()
        self._last = (None, None)
        dev = npu_index(t)
        o = None if dev is None or t.dtype == torch.bool or not t.numel() else \
            npu_storage.owner_of(t)
        if o is None:
            self._seen[seen] = False
            return False
        p = o.dev.ptr + t.storage_offset() * t.element_size()
        dt = _NP.get(t.dtype)
        if dt is None:
            dt = _NP[t.dtype] = np_dtype(t, "allreduce")    # raises for a dtype hccl lacks
        stream = self.streams.get(dev)
        objs = (p, p)
        call = self._pg.comm.find_call((_KEY, p.addr, t.numel(), dt, rop, stream), objs)
        got = self._seen[seen] = (dev, stream, objs, call)
        return got
