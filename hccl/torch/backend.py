"""torch.distributed's "hccl" backend (torch_npu's name) for CPU and npu tensors, on npusim
communicators.

Importing this module registers the backend, so a torch_npu training script runs unchanged
under npurun (or launcher.spawn)::

    import hccl.torch_backend  # noqa: F401   (torch_npu's ``import torch_npu``)
    dist.init_process_group(backend="hccl")
    model = DistributedDataParallel(model)

Every torch collective on CPU tensors becomes an hccl collective on the process group's own
runtime stream: the tensors are copied into device memory on the calling thread, the collective
is enqueued, and a completer thread copies the results back and completes the Work
(docs/torch.md). On npu tensors (``import torch_npu``) it runs on their own device memory,
stream-ordered, without a copy (npu.py). The
collectives carry hccl's sequence numbers, so a torch job that desyncs or hangs gets the same
CollectiveMismatchError, flight recorder and npurun verdict as a native one.

Under npurun, MASTER_ADDR:MASTER_PORT is npusim's authenticated store, not a torch TCPStore;
this module therefore routes torch's ``env://`` rendezvous to that store (any backend, gloo
included) when the job secret is in the environment. Outside npusim jobs ``env://`` is torch's.

torch is an optional dependency: ``pip install -e '.[torch]'``.
"""
from __future__ import annotations

try:
    import torch
    import torch.distributed as dist
except ImportError as _e:  # pragma: no cover - exercised only without torch
    raise ImportError("hccl.torch_backend needs torch, an optional extra of npusim: "
                      "pip install -e '.[torch]' (the CPU wheel is enough)") from _e

import datetime
import itertools
import os
import sys
import threading

import numpy as np
import typing_extensions
import runtime
from runtime.errors import NpuError

from .. import collectives as C
from .. import config
from ..comm import Comm
from ..errors import InvalidArgumentError
from . import p2p as torch_p2p
from . import rendezvous as torch_rendezvous
from .npu import NpuCollectives, npu_index, on_npu
from .sparse import SparseAllReduce
from .rendezvous import DEFAULT_TIMEOUT, JobStore
from .work import (Completer, Staging, Work, check_list, check_numel, np_dtype, put,
                         same_dtype, splits, take, view)
from ..types import ReduceOp

BACKEND = "hccl"

_REDUCE = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.PRODUCT: ReduceOp.PROD,
           dist.ReduceOp.MIN: ReduceOp.MIN, dist.ReduceOp.MAX: ReduceOp.MAX,
           dist.ReduceOp.AVG: ReduceOp.SUM}

# gloo's bitwise reductions, for integer and bool tensors: an all_gather, then the same
# reduction in rank order on every rank (exact, so every rank holds the same bits)
_BITWISE = {dist.ReduceOp.BAND: np.bitwise_and, dist.ReduceOp.BOR: np.bitwise_or,
            dist.ReduceOp.BXOR: np.bitwise_xor}
# bool tensors travel as bytes 0 / 1: logical or and and are MAX and MIN, as gloo's bool
_BOOL = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PROD: ReduceOp.MIN}

# what an all_reduce on one dense npu tensor (not bool) takes straight to
# NpuCollectives.allreduce_one: a reduction that is neither AVG nor bitwise
_PLAIN = {k: v for k, v in _REDUCE.items() if k != dist.ReduceOp.AVG}

_world_lock = threading.Lock()
_world: Comm | None = None          # the default group's communicator (sub-groups derive from it)


# Call sites (flight recorder, errors) name the user's line: skip torch's frames, its
# deprecation wrapper (typing_extensions) and npusim's own.
_LIBRARY = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, runtime)) + \
    (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,     # all of hccl/
     os.path.splitext(os.path.abspath(typing_extensions.__file__))[0])


def _user_site() -> str:
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_LIBRARY):
        f = f.f_back
    return "?" if f is None else f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"


# ---------------------------------------------------------------------- the process group
class HcclProcessGroup(dist.ProcessGroup):
    """A torch ProcessGroup whose collectives run on an npusim ``hccl.Comm``.

    ``comm`` is the communicator; every collective is enqueued on this group's own runtime
    stream (``stream``), in call order, and returns a Work whose ``wait()`` raises npusim's error.
    """

    def __init__(self, comm: Comm):
        super().__init__(comm.rank, comm.size)
        self.comm = comm
        self.stream = runtime.Stream(name=f"torch {comm.name}")
        self._completer = Completer(comm.name)
        self._lanes = torch_p2p.Lanes(comm.name)
        self._sparse = SparseAllReduce(self)
        self._npu = NpuCollectives(self, self._completer, comm.name)
        self._closed = False
        self._group_name = self._group_desc = ""

    def getBackendName(self) -> str:
        return BACKEND

    # torch keeps a group's name on its backends; this group is its own backend, so it keeps
    # them itself (functional collectives, DTensor and FSDP2 find the group by this name)
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    # The group is its own backend for cpu and npu: torch asks a group for its backend on a
    # device (``_get_backend``) and reads the backend's capabilities, in batch_isend_irecv
    # (torch >= 2.14 asks subclasses too), in init_process_group(device_id=...) and new_group
    # (splitting), and for FSDP2's buffers. This group splits, coalesces, estimates and
    # allocates nothing itself: torch then takes its plain paths.
    supports_splitting = supports_coalescing = supports_time_estimate = False
    supports_shrinking = False

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def _get_backend(self, device):
        kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
        if kind in ("cpu", "npu"):
            return self
        raise RuntimeError(f"No backend type associated with device type {kind}")

    def __repr__(self):
        return f"<HcclProcessGroup {self.comm.name} rank {self.rank()}/{self.size()}>"

    # -- plumbing
    def _submit(self, name: str, outputs: list, staging: Staging, lane, finish=None) -> Work:
        work = Work(name, outputs)
        stream, completer = lane
        completer.submit(work, stream.record_event(), finish or (lambda: None), staging.free)
        return work

    def _call(self, name: str, outputs: list, build, lane=None, site=None) -> Work:
        """Stage and enqueue with ``build(staging, site) -> finish`` (run once the results are
        in) on ``lane`` (stream, completer): the group's own unless a point-to-point lane."""
        if self._closed:
            raise InvalidArgumentError(f"{name}: the process group was shut down")
        lane = lane or (self.stream, self._completer)
        staging = Staging()
        try:
            finish = build(staging, site or _user_site())
        except BaseException:
            # a multi-tensor call may have enqueued some collectives: free after the stream
            self._submit(name, [], staging, lane)
            raise
        return self._submit(name, outputs, staging, lane, finish)

    def _site(self, api: str) -> str:
        """The user's line, for a call the npu path takes (npu.py)."""
        if self._closed:
            raise InvalidArgumentError(f"{api}: the process group was shut down")
        return _user_site()

    def _npu_lane(self, tensors, lane, api: str) -> bool:
        """Whether point-to-point ``tensors`` take the npu path: npu tensors of the NPU the
        lane's stream is on (others stage)."""
        if not on_npu(tensors):
            return False
        for t in tensors:
            np_dtype(t, api)
        return all(t.device.type == "npu" and t.device.index == lane[0].device_id
                   for t in tensors)

    def _redop(self, op, api: str, tensors) -> tuple[ReduceOp, bool]:
        kind = getattr(op, "op", op)      # a ReduceOp instance carries its RedOpType
        try:
            rop = _REDUCE[kind]
        except (KeyError, TypeError):
            raise InvalidArgumentError(f"{api}: Cannot use ReduceOp.{getattr(kind, 'name', kind)} "
                                       "with hccl (SUM, AVG, PRODUCT, MIN, MAX; BAND, BOR, BXOR "
                                       "in all_reduce and reduce)") from None
        avg = kind == dist.ReduceOp.AVG
        if avg and any(not t.is_floating_point() for t in tensors):
            raise InvalidArgumentError(f"{api}: ReduceOp.AVG needs floating-point tensors, got "
                                       f"{[str(t.dtype) for t in tensors]}")
        if any(t.dtype == torch.bool for t in tensors):
            rop = _BOOL.get(rop, rop)
        return rop, avg

    @staticmethod
    def _bitwise(op, api: str, tensors):
        """numpy's ufunc for a BAND / BOR / BXOR ``op`` (None for the others)."""
        kind = getattr(op, "op", op)
        ufunc = _BITWISE.get(kind)
        if ufunc is not None:
            bad = [str(t.dtype) for t in tensors if t.is_floating_point() or t.is_complex()]
            if bad:     # gloo's words
                raise InvalidArgumentError(f"{api}: Cannot use ReduceOp.{kind.name} with "
                                           f"non-integral dtype {bad[0]}")
        return ufunc

    def _reduce_bitwise(self, api, tensors, ufunc, root=None) -> Work:
        """all_reduce (``root`` None) or reduce with a bitwise ``ufunc``."""
        size = self.comm.size

        def build(st, site):
            gathered = []
            for t in tensors:
                a = st.load(t, api)
                g = st.buffer(a.size * size, a.dtype)
                C.all_gather(a, g, a.size, a.dtype, self.comm, self.stream, site=site)
                gathered.append(g)

            def finish():
                if root is None or self.comm.rank == root:
                    for g, t in zip(gathered, tensors):
                        if t.numel():
                            v = view(g)
                            v[:t.numel()] = ufunc.reduce(v.reshape(size, -1), axis=0)
                            take(g, 0, t)
            return finish
        return self._call(api, list(tensors), build)

    # -- collectives
    def allreduce(self, tensors, opts=None):
        if opts is not None and len(tensors) == 1:     # the common call, checked at once
            t = tensors[0]
            rop = _PLAIN.get(getattr(opts.reduceOp, "op", opts.reduceOp))
            dev = None if rop is None else npu_index(t)
            if dev is not None and t.dtype is not torch.bool and not t.is_sparse \
                    and t.is_contiguous():
                if self._closed:
                    raise InvalidArgumentError("allreduce: the process group was shut down")
                work = self._npu.allreduce_one(t, dev, rop, _user_site())
                if work is not None:
                    return work
        opts = opts or dist.AllreduceOptions()
        if any(t.is_sparse for t in tensors):
            return self._sparse.all_reduce(tensors, opts.reduceOp)
        ufunc = self._bitwise(opts.reduceOp, "allreduce", tensors)
        if ufunc is not None:
            return self._reduce_bitwise("allreduce", tensors, ufunc)
        rop, avg = self._redop(opts.reduceOp, "allreduce", tensors)
        if on_npu(tensors):
            return self._npu.allreduce(tensors, rop, avg, self._site("allreduce"))

        def build(st, site):
            bufs = [st.load(t, "allreduce") for t in tensors]
            for a in bufs:
                C.all_reduce(a, a, a.size, a.dtype, rop, self.comm, self.stream, site=site)

            return lambda: self._take_reduced(bufs, tensors, avg)
        return self._call("allreduce", list(tensors), build)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        root = opts.rootRank
        if on_npu(tensors):
            for t in tensors:
                np_dtype(t, "broadcast")
            return self._npu.broadcast(tensors, root, self._site("broadcast"))

        def build(st, site):
            bufs = [st.load(t, "broadcast") if self.comm.rank == root
                    else st.buffer(t.numel(), np_dtype(t, "broadcast")) for t in tensors]
            for a in bufs:
                C.broadcast(a, a.size, a.dtype, root, self.comm, self.stream, site=site)
            return lambda: [take(a, 0, t) for a, t in zip(bufs, tensors)]
        return self._call("broadcast", list(tensors), build)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        root = opts.rootRank
        ufunc = self._bitwise(opts.reduceOp, "reduce", tensors)
        if ufunc is not None:
            return self._reduce_bitwise("reduce", tensors, ufunc, root)
        rop, avg = self._redop(opts.reduceOp, "reduce", tensors)
        if on_npu(tensors):
            return self._npu.reduce(tensors, rop, avg, root, self._site("reduce"))

        def build(st, site):
            bufs = [st.load(t, "reduce") for t in tensors]
            for a in bufs:
                C.reduce(a, a, a.size, a.dtype, rop, root, self.comm, self.stream, site=site)

            def finish():
                if self.comm.rank == root:    # only the root's tensor receives the result
                    self._take_reduced(bufs, tensors, avg)
            return finish
        return self._call("reduce", list(tensors), build)

    def _take_reduced(self, bufs, tensors, avg: bool) -> None:
        """Copy reduced device buffers back into ``tensors``; AVG divides by the world first."""
        for a, t in zip(bufs, tensors):
            if avg:
                v = view(a)
                v /= v.dtype.type(self.comm.size)
            take(a, 0, t)

    def allgather(self, output_tensors, input_tensors, opts=None):
        n, size = input_tensors[0].numel(), self.comm.size
        outs = output_tensors[0]
        check_list(outs, size, n, "allgather", "output_tensors[0]")
        dt = same_dtype([*outs, input_tensors[0]], "allgather")
        if on_npu([*outs, input_tensors[0]]):
            return self._npu.allgather(outs, input_tensors[0], self._site("allgather"))

        def build(st, site):
            src = st.load(input_tensors[0], "allgather")
            dst = st.buffer(n * size, dt)
            C.all_gather(src, dst, n, dt, self.comm, self.stream, site=site)
            return lambda: [take(dst, r * n, o) for r, o in enumerate(outs)]
        return self._call("allgather", outs, build)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # output_lists[r][k]: rank r's tensor k
        if len(output_lists) != self.comm.size:
            raise InvalidArgumentError(f"all_gather_coalesced: output_tensor_lists holds "
                                       f"{len(output_lists)} lists but the group has "
                                       f"{self.comm.size} ranks")
        works = [self.allgather([[outs[k] for outs in output_lists]], [t], opts)
                 for k, t in enumerate(input_list)]
        return works[-1] if works else self.barrier()

    def _root_list(self, root: int, lists, mine, api: str, name: str):
        """The root's list of one tensor per rank (checked; [] elsewhere) and the dtype."""
        blocks = lists[0] if self.comm.rank == root else []
        if self.comm.rank == root:
            check_list(blocks, self.comm.size, mine.numel(), api, name)
        return blocks, same_dtype([*blocks, mine], api)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = (opts or dist.GatherOptions()).rootRank
        size, inp, n = self.comm.size, input_tensors[0], input_tensors[0].numel()
        outs, dt = self._root_list(root, output_tensors, inp, "gather", "gather_list")

        def build(st, site):       # every rank gets the blocks; only the root keeps them
            src = st.load(inp, "gather")
            dst = st.buffer(n * size, dt)
            C.all_gather(src, dst, n, dt, self.comm, self.stream, site=site)
            return lambda: [take(dst, r * n, o) for r, o in enumerate(outs)]
        return self._call("gather", list(outs), build)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = (opts or dist.ScatterOptions()).rootRank
        size, out, n = self.comm.size, output_tensors[0], output_tensors[0].numel()
        ins, dt = self._root_list(root, input_tensors, out, "scatter", "scatter_list")

        def build(st, site):       # the root's blocks to every rank; each keeps its own
            buf = st.buffer(n * size, dt)
            for r, t in enumerate(ins):
                put(buf, r * n, t)
            C.broadcast(buf, n * size, dt, root, self.comm, self.stream, site=site)
            return lambda: take(buf, self.comm.rank * n, out)
        return self._call("scatter", [out], build)

    def all_gather_single(self, output, input, opts=None):
        n, size = input.numel(), self.comm.size
        check_numel(output, n * size, "all_gather_into_tensor", "output", f"{size} x input's {n}")
        dt = same_dtype([output, input], "all_gather_into_tensor")
        if on_npu([output, input]):
            return self._npu.allgather(output, input, self._site("all_gather_into_tensor"),
                                       "all_gather_into_tensor")

        def build(st, site):
            src = st.load(input, "all_gather_into_tensor")
            dst = st.buffer(n * size, dt)
            C.all_gather(src, dst, n, dt, self.comm, self.stream, site=site)
            return lambda: take(dst, 0, output)
        return self._call("all_gather_into_tensor", [output], build)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]      # completes after the others: one group completes in call order

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        out, ins, size = output_tensors[0], input_tensors[0], self.comm.size
        n = out.numel()
        check_list(ins, size, n, "reduce_scatter", "input_list")
        rop, avg = self._redop(opts.reduceOp, "reduce_scatter", [out])
        dt = same_dtype([out, *ins], "reduce_scatter")
        if on_npu([out, *ins]):
            return self._npu.reduce_scatter(out, ins, rop, avg, self._site("reduce_scatter"))

        def build(st, site):
            src = st.buffer(n * size, dt)
            for r, t in enumerate(ins):
                put(src, r * n, t)
            return self._reduce_scatter(st, site, src, out, n, dt, rop, avg)
        return self._call("reduce_scatter", [out], build)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        n, size = output.numel(), self.comm.size
        check_numel(input, n * size, "reduce_scatter_tensor", "input", f"{size} x output's {n}")
        rop, avg = self._redop(opts.reduceOp, "reduce_scatter_tensor", [output])
        dt = same_dtype([output, input], "reduce_scatter_tensor")
        if on_npu([output, input]):
            return self._npu.reduce_scatter(output, input, rop, avg,
                                            self._site("reduce_scatter_tensor"),
                                            "reduce_scatter_tensor")

        def build(st, site):
            return self._reduce_scatter(st, site, st.load(input, "reduce_scatter_tensor"), output,
                                        n, dt, rop, avg)
        return self._call("reduce_scatter_tensor", [output], build)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter(self, st, site, src, out, n, dt, rop, avg):
        dst = st.buffer(n, dt)
        C.reduce_scatter(src, dst, n, dt, rop, self.comm, self.stream, site=site)

        def finish():
            if avg:
                v = view(dst)
                v /= v.dtype.type(self.comm.size)
            take(dst, 0, out)
        return finish

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        api, size = "all_to_all_single", self.comm.size
        dt = same_dtype([output, input], api)
        in_rows = splits(input, input_split_sizes, size, api, "input")
        out_rows = splits(output, output_split_sizes, size, api, "output")
        in_row = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        out_row = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        if in_row != out_row:
            raise InvalidArgumentError(f"{api}: input rows hold {in_row} elements but output rows "
                                       f"hold {out_row}")
        if on_npu([output, input]) and len(set(in_rows + out_rows)) == 1:
            # equal blocks: hccl's AlltoAll on the tensors as they are (uneven ones stage)
            return self._npu.all_to_all_single(output, input, in_rows[0] * in_row,
                                               self._site(api))
        flat_in = input.detach().reshape(-1)
        in_counts = [r * in_row for r in in_rows]
        out_counts = [r * out_row for r in out_rows]
        dense = output.is_contiguous()

        def write(recv, offsets, chunk):
            flat = output.view(-1) if dense else torch.empty(output.numel(), dtype=output.dtype)
            for src, (off, c) in enumerate(zip(offsets, out_counts)):
                take(recv, src * chunk, flat[off:off + c])
            if not dense:
                with torch.no_grad():
                    output.copy_(flat.view(output.shape))
        return self._alltoall(api, flat_in, in_counts, out_counts, dt, write, [output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        api, size = "alltoall", self.comm.size
        if len(output_tensors) != size or len(input_tensors) != size:
            raise InvalidArgumentError(f"{api}: expected {size} input and output tensors, got "
                                       f"{len(input_tensors)} and {len(output_tensors)}")
        dt = same_dtype([*output_tensors, *input_tensors], api)
        flat_in = torch.cat([t.detach().reshape(-1) for t in input_tensors])

        def write(recv, offsets, chunk):
            for src, o in enumerate(output_tensors):
                take(recv, src * chunk, o)
        return self._alltoall(api, flat_in, [t.numel() for t in input_tensors],
                              [t.numel() for t in output_tensors], dt, write, list(output_tensors))

    def _alltoall(self, api, flat_in, in_counts, out_counts, dt, write, outputs):
        """All-to-all with any split sizes: the ranks first exchange their send counts, then
        every block is padded to the largest one so hccl's equal-count AlltoAll carries them."""
        size, me = self.comm.size, self.comm.rank
        counts = torch.tensor(in_counts, dtype=torch.int64)
        matrix = torch.empty(size * size, dtype=torch.int64)
        self.all_gather_single(matrix, counts).wait()
        matrix = matrix.view(size, size)          # [src, dst] element counts
        sent_to_me = matrix[:, me].tolist()
        if sent_to_me != list(out_counts):
            raise InvalidArgumentError(
                f"{api}: rank {me} expects {list(out_counts)} elements from ranks 0..{size - 1} "
                f"but they send {sent_to_me}")
        chunk = int(matrix.max())
        offsets_out = list(itertools.accumulate([0, *out_counts[:-1]]))

        def build(st, site):
            send = st.buffer(chunk * size, dt)
            recv = st.buffer(chunk * size, dt)
            off = 0
            for dst, c in enumerate(in_counts):
                put(send, dst * chunk, flat_in[off:off + c])
                off += c
            C.all_to_all(send, chunk, recv, chunk, dt, self.comm, self.stream, site=site)
            return lambda: write(recv, offsets_out, chunk)
        return self._call(api, outputs, build)

    def barrier(self, opts=None):
        def build(st, site):
            C.barrier(self.comm, self.stream, site=site)
        return self._call("barrier", [], build)

    # -- point-to-point: one lane per direction and peer (torch_p2p), so any posting order works
    def send(self, tensors, dstRank, tag=0):
        lane = self._lanes.get("send", dstRank)
        if self._npu_lane(tensors, lane, "send"):
            return self._npu.send(tensors, dstRank, lane, self._site("send"))

        def build(st, site):
            for t in tensors:
                a = st.load(t, "send")
                C.send(a, a.size, a.dtype, dstRank, self.comm, lane[0], site=site)
        return self._call("send", list(tensors), build, lane)

    def recv(self, tensors, srcRank, tag=0, *, site=None):
        lane = self._lanes.get("recv", srcRank)
        if self._npu_lane(tensors, lane, "recv"):
            return self._npu.recv(tensors, srcRank, lane, site or self._site("recv"))

        def build(st, site):
            bufs = [st.buffer(t.numel(), np_dtype(t, "recv")) for t in tensors]
            for a in bufs:
                C.recv(a, a.size, a.dtype, srcRank, self.comm, lane[0], site=site)
            return lambda: [take(a, 0, t) for a, t in zip(bufs, tensors)]
        return self._call("recv", list(tensors), build, lane, site)

    def recv_anysource(self, tensors, tag=0):
        if self._closed:
            raise InvalidArgumentError("recv: the process group was shut down")
        for t in tensors:
            np_dtype(t, "recv")
        return torch_p2p.recv_anysource(self, tensors, _user_site())

    # -- lifecycle
    def shutdown(self) -> None:
        """Finish the queued work, stop the completer and destroy the communicator."""
        global _world
        if self._closed:
            return
        self._closed = True
        self._completer.close()
        self._lanes.close()
        self._npu.close()
        try:
            self.stream.synchronize()
            self.stream.destroy()
        except NpuError:
            pass          # the error was (or will be) delivered to its Work
        with _world_lock:
            if _world is self.comm:
                _world = None
        self.comm.destroy()

    abort = shutdown


class HcclOptions:
    """``ProcessGroupHCCL.Options`` (torch_npu's ``pg_options``): ``hccl_config``, a dict.

    Applied where it has a meaning here: ``hccl_buffer_size`` (MB) is the group's HCCL_BUFFSIZE
    (its slice size, at most the wire slice). Other keys (``group_name``,
    ``hccl_op_expansion_mode``, QoS) are kept on the group's ``hccl_config`` and change nothing.
    """

    hccl_config: dict = {}

    def __init__(self, is_high_priority_stream: bool = False):
        self.is_high_priority_stream = is_high_priority_stream
        self.hccl_config = {}
        self._timeout = DEFAULT_TIMEOUT


HcclProcessGroup.Options = HcclOptions


def _apply_hccl_config(pg: "HcclProcessGroup", cfg) -> None:
    if not isinstance(cfg, dict):
        raise InvalidArgumentError(f"pg_options.hccl_config must be a dict, got "
                                   f"{type(cfg).__name__}")
    pg.hccl_config = dict(cfg)
    mb = cfg.get("hccl_buffer_size")
    if mb is not None:
        if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
            raise InvalidArgumentError(f"hccl_config['hccl_buffer_size'] must be an int >= 1 (MB), "
                                       f"got {mb!r}")
        algo = config.algo() if config.algo_set() else "auto"
        pg.comm._knobs = (algo, min(mb * config.MiB, config.wire_slice_bytes()),
                          pg.comm.world.transport.solo_bytes)


# ---------------------------------------------------------------------- creation
def _create(dist_opts, backend_opts=None) -> HcclProcessGroup:
    """torch's backend creator (extended API): the default group or a sub-group."""
    global _world
    try:
        runtime.get_device()
    except NpuError:     # torch_npu scripts call torch.npu.set_device; here the backend binds it
        # mp.spawn sets no LOCAL_RANK: one device per rank then
        runtime.set_device(config.local_rank(dist_opts.group_rank))
    ranks = list(dist_opts.global_ranks_in_group)
    with _world_lock:
        world = _world
    if not ranks:
        comm = torch_rendezvous.world_comm(dist_opts.store, dist_opts.group_rank,
                                           dist_opts.group_size, dist_opts.timeout)
        with _world_lock:
            _world = comm
    elif world is None:
        raise InvalidArgumentError("new_group(backend='hccl'): the default group must be on "
                                   "hccl too (dist.init_process_group(backend='hccl'))")
    else:
        comm = world.create_sub_comm(ranks)
    if (comm.rank, comm.size) != (dist_opts.group_rank, dist_opts.group_size):
        comm.destroy()
        raise InvalidArgumentError(
            f"init_process_group(backend='hccl'): torch says rank {dist_opts.group_rank} of "
            f"{dist_opts.group_size} but npusim's environment says rank {comm.rank} of {comm.size}; "
            "start the job with npurun and let it set RANK and WORLD_SIZE")
    timeout = dist_opts.timeout
    if isinstance(timeout, datetime.timedelta) and timeout != DEFAULT_TIMEOUT:
        comm.set_exec_timeout(timeout.total_seconds())      # an explicit torch timeout wins
    pg = HcclProcessGroup(comm)
    pg.hccl_config = {}
    if getattr(backend_opts, "hccl_config", None):           # ProcessGroupHCCL.Options
        _apply_hccl_config(pg, backend_opts.hccl_config)
    return pg


torch_rendezvous.install()
dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "npu"])

__all__ = ["BACKEND", "HcclProcessGroup", "JobStore"]
