"""Adjacent small AllReduces of a task graph run as one exchange at replay.

Design note. At 1 KiB an AllReduce's cost is its exchange (a message each way, a wake-up per
rank), not its bytes, so a training step of eight small AllReduces pays eight exchanges. NCCL's
group calls and torch's ``all_reduce_coalesced`` pack such calls into one; a task graph knows
the whole step at capture, so it does that by itself: when a capture ends, ``runtime.graph``
fuses each run of adjacent nodes whose ``Fusable`` keys are equal and that ``fits`` accepts,
and a replay packs the members' bytes into one staging buffer, runs ONE in-place AllReduce of
the concatenation and copies each member's slice back.

What may fuse (the key and ``fits``):
- AllReduces of one communicator on one stream, with one dtype and one reduce op, adjacent in
  the graph (nothing is reordered), with HCCL_ALGO unset;
- whose algorithm, chosen by size, reduces every element in rank order at the member's size and
  at the fused size alike (oneshot at 2 ranks up to 64 KiB, star from 3 ranks up to 4 MiB): an
  element's result does not depend on where it sits in the buffer, so the fused results are
  bitwise those of the separate calls;
- whose buffers do not overlap where one member writes what another reads or writes (a member
  that reduces the result of the previous one must wait for it).

Sequence numbers and records stay per call: a fused group of k takes the communicator's next k
sequence numbers and k flight-recorder entries, so eager calls after a replay line up with the
other ranks' as before. The exchange runs under the first of those numbers with the fingerprint
``ALLREDUCE(count=<total>, ..., fused=k)``: a rank that replays another graph, or issues the
calls eagerly where the others replay, is a collective mismatch naming both calls, as for
eager code (graphs must be replayed on every rank, as NCCL requires of captured collectives).
"""
from __future__ import annotations

import functools
import time
from typing import NamedTuple

import numpy as np

import runtime
from runtime.graph import Fusable
from runtime.memory import allocation_marks, same_allocations

from . import executor, plan, schedule
from ..flight import recorder
from ..types import OpType

_ORDERED = ("oneshot", "star")      # AllReduce algorithms that reduce each element in rank order
_time = time.time


class Member(NamedTuple):
    """One captured AllReduce: its Call and the buffers of its issue."""

    call: object            # the hccl.call.Call
    objs: tuple             # its buffers, in the Call's ``names`` order
    site: str
    regions: tuple          # ((device, start, end, writes), ...): its bytes in device memory


def fusable(call, objs: tuple, site: str) -> Fusable | None:
    """The ``Fusable`` of a captured AllReduce ``call`` (issued with ``objs``), or None when it
    runs on its own."""
    comm, dtype = call.comm, call.dtype
    algo, slice_bytes = call.knobs[:2]
    nbytes = call.count * dtype.itemsize
    if algo != "auto" or comm.size < 2 or call.count == 0:
        return None
    chosen = schedule.choose(OpType.ALLREDUCE, nbytes, comm.size)
    if chosen not in _ORDERED:
        return None
    regions = []
    for k, b in zip(call.names, objs):
        ptr = b.ptr if isinstance(b, runtime.DeviceArray) else b
        regions.append((ptr.device_id, ptr.addr, ptr.addr + call.plan.nbytes[k], k == "recv"))
    member = Member(call, objs, site, tuple(regions))
    key = ("allreduce", call.cid, int(dtype), int(call.redop), chosen)

    def fits(items: list, item: Member) -> bool:
        total = (sum(m.call.count for m in items) + item.call.count) * dtype.itemsize
        if schedule.choose(OpType.ALLREDUCE, total, comm.size) != chosen:
            return False
        return not any(_conflict(a, b) for m in items for a in m.regions for b in item.regions)

    return Fusable(key, member, fits, _Fused)


def _conflict(a, b) -> bool:
    """Two regions overlap and at least one of them is written."""
    return a[0] == b[0] and (a[3] or b[3]) and a[1] < b[2] and b[1] < a[2]


class _Fused:
    """The ``make`` of a fused group: planned and bound once (on its own staging buffer, with
    the members' views and the copies in and out of it), run at every replay."""

    def __init__(self, items: list):
        first = items[0].call
        comm, dtype = first.comm, first.dtype
        self.items, self.first, self.k = items, first, len(items)
        total = sum(m.call.count for m in items)
        pl = plan.collective(OpType.ALLREDUCE, comm.rank, comm.size, total, dtype, first.redop,
                             None, None, True, *first.knobs)
        self.fp = pl.fp._replace(root=self.k)   # root is unused by AllReduce: the group's size
        self.wire_fp = tuple(self.fp)
        size = dtype.itemsize
        self.offsets, at = [], 0
        for m in items:
            self.offsets.append(at)
            at += m.call.count * size
        self.staging = np.empty(max(pl.nbytes["recv"], at), np.uint8)
        self.steps = pl.steps
        # the members' records share these (``recorder.group``), made once
        self.protos = tuple(recorder.proto(comm, m.call.plan.names, first.stream.name, None,
                                           m.call.count * size) for m in items)
        self.sites = tuple(m.site for m in items)
        # every member's buffers, as ``same_allocations`` checks them at each run
        self.objs = tuple(o for m in items for o in m.objs)
        self.marks = allocation_marks(self.objs)
        self.program = self._bind()
        self.copies_in, self.copies_out = self._bind_copies()

    def _bind(self) -> executor.Program:
        first, steps = self.first, self.steps
        comm, t = first.comm, first.comm.world.transport
        views = executor.prepare_buffers(steps, {"send": self.staging, "recv": self.staging})
        return executor.bind(steps, views, first.redop, first.dtype,
                             [t.pair(w) for w in comm.ranks], (first.cid, self.wire_fp))

    def _bind_copies(self) -> tuple:
        """(dst, src, small) of every member's copy into the staging buffer and out of it, on
        the members' buffers as they are now (``runtime.host_view`` raises the use-after-free
        error); ``small``: a memoryview copy that keeps the GIL (``executor.copy_bytes``)."""
        size, staging = self.first.dtype.itemsize, self.staging
        ins, outs = [], []
        for m, off in zip(self.items, self.offsets):
            n = m.call.count * size
            bufs = dict(zip(m.call.names, m.objs))
            src = runtime.host_view(bufs["send"], n, name="send")
            recv = bufs.get("recv")
            out = src if recv is None or m.call.inplace else \
                runtime.host_view(recv, n, name="recv")
            stage = staging[off:off + n]
            small = n <= executor.GIL_COPY_BYTES
            if small:
                ins.append((memoryview(stage), memoryview(src), True))
                outs.append((memoryview(out), memoryview(stage), True))
            else:
                ins.append((stage, src, False))
                outs.append((out, stage, False))
        return tuple(ins), tuple(outs)

    def __call__(self):
        comm = self.first.comm
        seq0 = comm.take_seqs(self.k)
        recs = recorder.group(self.protos, self.sites, seq0)
        return functools.partial(self.run, seq0, recs)

    def run(self, seq0: int, recs: tuple) -> None:
        first = self.first
        if not same_allocations(self.marks, self.objs):   # a buffer freed or moved since
            self.copies_in, self.copies_out = self._bind_copies()   # raises use after free
            self.marks = allocation_marks(self.objs)
        for dst, src, small in self.copies_in:
            if small:
                dst[:] = src
            else:
                np.copyto(dst, src)
        head = recs[0]
        head.state, head.t_started = "started", _time()     # recorder.start, inline
        timeout, by_comm = first.comm.timeout()   # once per group (Call.run inlines it)
        first.rec = head
        try:
            self.program.run(first.cid, seq0, self.wire_fp, timeout, first.on_wait)
        except executor.StepFailed as f:
            first.timeout_by_comm = by_comm
            raise first.failed(f, seq0, timeout, recs, self.fp) from f.error
        if self.program.provisional:        # its first run made the pairs: bind to them
            self.program = self._bind()
        recorder.complete_group(recs)
        for dst, src, small in self.copies_out:
            if small:
                dst[:] = src
            else:
                np.copyto(dst, src)
