"""torch.distributed's "hccl" backend (torch_npu's name) for CPU and npu tensors, on npusim
communicators.

Importing this module registers the backend, so a torch_npu training script runs unchanged
under npurun (or launcher.spawn)::

    import hccl.torch_backend  # noqa: F401   (torch_npu's ``import torch_npu``)
    dist.init_process_group(backend="hccl")
    model = DistributedDataParallel(model)

Every torch collective becomes hccl collectives, written once (ops.py): on npu tensors
(``import torch_npu``) on their own device memory, stream-ordered, without a copy (npu.py); on
CPU tensors on the process group's own runtime stream, the tensors copied into device memory on
the calling thread and the results copied back by a completer thread, which completes the Work
(work.py; docs/torch.md). This module checks the arguments and picks the op. The
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
import os
import sys
import threading

import typing_extensions
import runtime
from runtime.errors import NpuError

from .. import config
from ..comm import Comm
from ..errors import InvalidArgumentError
from . import p2p as torch_p2p
from . import rendezvous as torch_rendezvous
from .npu import FastAllReduce
from .ops import Ops
from .sparse import SparseAllReduce
from .rendezvous import DEFAULT_TIMEOUT, JobStore
from .work import Completer, check_list, check_numel, np_dtype, same_dtype, splits
from ..types import ReduceOp

BACKEND = "hccl"

_REDUCE = {dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.PRODUCT: ReduceOp.PROD,
           dist.ReduceOp.MIN: ReduceOp.MIN, dist.ReduceOp.MAX: ReduceOp.MAX,
           dist.ReduceOp.AVG: ReduceOp.SUM}

# gloo's bitwise reductions, for integer and bool tensors: an all_gather, then the same
# reduction in rank order on every rank (exact, so every rank holds the same bits: ops.py)
_BITWISE = (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)
# bool tensors travel as bytes 0 / 1: logical or and and are MAX and MIN, as gloo's bool
_BOOL = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PROD: ReduceOp.MIN}

# what an all_reduce on one dense npu tensor (not bool) takes straight to
# FastAllReduce.allreduce_one: a reduction that is neither AVG nor bitwise, by its RedOpType's
# value (an int: the enum's own hash is a call into torch)
_PLAIN = {k.value: v for k, v in _REDUCE.items() if k != dist.ReduceOp.AVG}

_world_lock = threading.Lock()
_world: Comm | None = None          # the default group's communicator (sub-groups derive from it)


# Call sites (flight recorder, errors) name the user's line: skip torch's frames, its
# deprecation wrapper (typing_extensions) and npusim's own.
_LIBRARY = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, runtime)) + \
    (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,     # all of hccl/
     os.path.splitext(os.path.abspath(typing_extensions.__file__))[0])


_LIB: dict = {}         # code object -> whether it is a library's (decided once per code)
_SITES: dict = {}       # (code object, line) -> the site's text, made once per call site


def _user_site() -> str:
    f, lib = sys._getframe(2), _LIB
    while f is not None:
        code = f.f_code
        is_lib = lib.get(code)
        if is_lib is None:
            if len(lib) > 4096:
                lib.clear()
            is_lib = lib[code] = code.co_filename.startswith(_LIBRARY)
        if not is_lib:
            break
        f = f.f_back
    if f is None:
        return "?"
    key = (code, f.f_lineno)
    site = _SITES.get(key)
    if site is None:
        if len(_SITES) > 4096:
            _SITES.clear()
        site = _SITES[key] = f"{code.co_filename}:{f.f_lineno} in {code.co_name}"
    return site


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
        self._ops = Ops(self, comm.name)
        self._fast = FastAllReduce(self, self._ops.streams)
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
    def _site(self, api: str) -> str:
        """The user's line (raises once the group was shut down)."""
        if self._closed:
            raise InvalidArgumentError(f"{api}: the process group was shut down")
        return _user_site()

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
    def _bitwise(op, api: str, tensors) -> str | None:
        """"BAND" / "BOR" / "BXOR" for such an ``op`` (None for the others), dtypes checked."""
        kind = getattr(op, "op", op)
        if kind not in _BITWISE:
            return None
        bad = [str(t.dtype) for t in tensors if t.is_floating_point() or t.is_complex()]
        if bad:     # gloo's words
            raise InvalidArgumentError(f"{api}: Cannot use ReduceOp.{kind.name} with "
                                       f"non-integral dtype {bad[0]}")
        for t in tensors:
            np_dtype(t, api)
        return kind.name

    # -- collectives: checked here, run by ops.py (npu tensors on their memory, CPU staged)
    def allreduce(self, tensors, opts=None):
        site = None
        if opts is not None and len(tensors) == 1 and not self._closed:
            # the common call: one dense tensor, a plain op; npu.py's short branch tells the
            # rest (an npu tensor, not bool) by what it found for this tensor before
            t = tensors[0]
            if not t.is_sparse and t.is_contiguous():
                r = opts.reduceOp
                kind = getattr(r, "op", r).value
                if kind in _PLAIN:
                    site = _user_site()
                    work = self._fast.allreduce_one(t, kind, _PLAIN[kind], site)
                    if work is not None:
                        return work
        opts = opts or dist.AllreduceOptions()
        if any(t.is_sparse for t in tensors):
            return self._sparse.all_reduce(tensors, opts.reduceOp)
        site = site or self._site("allreduce")
        kind = self._bitwise(opts.reduceOp, "allreduce", tensors)
        if kind is not None:
            return self._ops.reduce_bitwise("allreduce", tensors, kind, None, site)
        rop, avg = self._redop(opts.reduceOp, "allreduce", tensors)
        return self._ops.allreduce(tensors, rop, avg, site)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        for t in tensors:
            np_dtype(t, "broadcast")
        return self._ops.broadcast(tensors, opts.rootRank, self._site("broadcast"))

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        root = opts.rootRank
        kind = self._bitwise(opts.reduceOp, "reduce", tensors)
        if kind is not None:
            return self._ops.reduce_bitwise("reduce", tensors, kind, root, self._site("reduce"))
        rop, avg = self._redop(opts.reduceOp, "reduce", tensors)
        return self._ops.reduce(tensors, rop, avg, root, self._site("reduce"))

    def allgather(self, output_tensors, input_tensors, opts=None):
        n, size = input_tensors[0].numel(), self.comm.size
        outs = output_tensors[0]
        check_list(outs, size, n, "allgather", "output_tensors[0]")
        same_dtype([*outs, input_tensors[0]], "allgather")
        return self._ops.allgather(list(outs), input_tensors[0], self._site("allgather"))

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # output_lists[r][k]: rank r's tensor k
        if len(output_lists) != self.comm.size:
            raise InvalidArgumentError(f"all_gather_coalesced: output_tensor_lists holds "
                                       f"{len(output_lists)} lists but the group has "
                                       f"{self.comm.size} ranks")
        works = [self.allgather([[outs[k] for outs in output_lists]], [t], opts)
                 for k, t in enumerate(input_list)]
        return works[-1] if works else self.barrier()

    def _root_list(self, root: int, lists, mine, api: str, name: str) -> list:
        """The root's list of one tensor per rank (checked; [] elsewhere), dtypes checked."""
        blocks = list(lists[0]) if self.comm.rank == root else []
        if self.comm.rank == root:
            check_list(blocks, self.comm.size, mine.numel(), api, name)
        same_dtype([*blocks, mine], api)
        return blocks

    def gather(self, output_tensors, input_tensors, opts=None):
        # every rank gets the blocks; only the root keeps them
        root = (opts or dist.GatherOptions()).rootRank
        inp = input_tensors[0]
        outs = self._root_list(root, output_tensors, inp, "gather", "gather_list")
        return self._ops.allgather(outs, inp, self._site("gather"), "gather")

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = (opts or dist.ScatterOptions()).rootRank
        out = output_tensors[0]
        ins = self._root_list(root, input_tensors, out, "scatter", "scatter_list")
        return self._ops.scatter(out, ins, root, self._site("scatter"))

    def all_gather_single(self, output, input, opts=None):
        n, size = input.numel(), self.comm.size
        check_numel(output, n * size, "all_gather_into_tensor", "output", f"{size} x input's {n}")
        same_dtype([output, input], "all_gather_into_tensor")
        return self._ops.allgather(output, input, self._site("all_gather_into_tensor"),
                                   "all_gather_into_tensor")

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]      # completes after the others: one group completes in call order

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        out, ins = output_tensors[0], list(input_tensors[0])
        check_list(ins, self.comm.size, out.numel(), "reduce_scatter", "input_list")
        rop, avg = self._redop(opts.reduceOp, "reduce_scatter", [out])
        same_dtype([out, *ins], "reduce_scatter")
        return self._ops.reduce_scatter(out, ins, rop, avg, self._site("reduce_scatter"))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        api, n, size = "reduce_scatter_tensor", output.numel(), self.comm.size
        check_numel(input, n * size, api, "input", f"{size} x output's {n}")
        rop, avg = self._redop(opts.reduceOp, api, [output])
        same_dtype([output, input], api)
        return self._ops.reduce_scatter(output, input, rop, avg, self._site(api), api)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        api, size = "all_to_all_single", self.comm.size
        same_dtype([output, input], api)
        in_rows = splits(input, input_split_sizes, size, api, "input")
        out_rows = splits(output, output_split_sizes, size, api, "output")
        in_row = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        out_row = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        if in_row != out_row:
            raise InvalidArgumentError(f"{api}: input rows hold {in_row} elements but output rows "
                                       f"hold {out_row}")
        in_counts = [r * in_row for r in in_rows]
        out_counts = [r * out_row for r in out_rows]
        if input_split_sizes or output_split_sizes:     # what every rank sends: exchanged
            chunk = self._chunk(api, in_counts, out_counts)
        else:       # even splits on every rank: equal blocks, as they are
            chunk = in_counts[0]
        return self._ops.all_to_all(api, [output], [input], in_counts, out_counts, chunk,
                                    self._site(api))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        api, size = "alltoall", self.comm.size
        if len(output_tensors) != size or len(input_tensors) != size:
            raise InvalidArgumentError(f"{api}: expected {size} input and output tensors, got "
                                       f"{len(input_tensors)} and {len(output_tensors)}")
        same_dtype([*output_tensors, *input_tensors], api)
        in_counts = [t.numel() for t in input_tensors]
        out_counts = [t.numel() for t in output_tensors]
        chunk = self._chunk(api, in_counts, out_counts)
        return self._ops.all_to_all(api, list(output_tensors), list(input_tensors), in_counts,
                                    out_counts, chunk, self._site(api))

    def _chunk(self, api, in_counts, out_counts) -> int:
        """All-to-all with any split sizes: the ranks first exchange their send counts (checked
        against what this rank expects), then every block is padded to the largest one, so
        hccl's equal-count AlltoAll carries them: that count."""
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
        return int(matrix.max())

    def barrier(self, opts=None):
        return self._ops.barrier(self._site("barrier"))

    # -- point-to-point: one lane per direction and peer (torch_p2p), so any posting order works
    def send(self, tensors, dstRank, tag=0):
        site = self._site("send")
        return self._ops.p2p("send", tensors, dstRank, self._lanes.get("send", dstRank), site)

    def recv(self, tensors, srcRank, tag=0, *, site=None):
        site = site or self._site("recv")
        return self._ops.p2p("recv", tensors, srcRank, self._lanes.get("recv", srcRank), site)

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
        self._ops.close()
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
        pg.comm.set_slice_bytes(mb * config.MiB)


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
