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

from typing import NamedTuple

import numpy as np

import runtime
from runtime.graph import Fusable

from . import comm as comms, plan, schedule   # comm imports this module too: use at call time
from .flight import recorder
from .types import OpType

_ORDERED = ("oneshot", "star")      # AllReduce algorithms that reduce each element in rank order


class Member(NamedTuple):
    """One captured AllReduce: what its part of a fused replay needs."""

    bufs: dict
    pl: plan.Plan
    count: int
    site: str
    regions: tuple          # ((device, start, end, writes), ...): its bytes in device memory
    inplace: bool           # send and recv are one buffer


def fusable(comm, bufs: dict, pl, count: int, dtype, redop, knobs: tuple, site: str,
            stream_name: str, cid: int, timeout, by_comm: bool, inplace: bool) -> Fusable | None:
    """The ``Fusable`` of a captured AllReduce, or None when it runs on its own."""
    algo, slice_bytes = knobs
    nbytes = count * dtype.itemsize
    if algo != "auto" or comm.size < 2 or count == 0:
        return None
    chosen = schedule.choose(OpType.ALLREDUCE, nbytes, comm.size)
    if chosen not in _ORDERED:
        return None
    regions = []
    for k, b in bufs.items():
        if b is not None:
            start = _address(b)
            regions.append((b.device_id if not isinstance(b, runtime.DeviceArray)
                            else b.ptr.device_id, start, start + pl.nbytes[k], k == "recv"))
    member = Member(bufs, pl, count, site, tuple(regions), inplace)
    key = ("allreduce", cid, int(dtype), int(redop), chosen)

    def fits(items: list, item: Member) -> bool:
        total = (sum(m.count for m in items) + item.count) * dtype.itemsize
        if schedule.choose(OpType.ALLREDUCE, total, comm.size) != chosen:
            return False
        return not any(_conflict(a, b) for m in items for a in m.regions for b in item.regions)

    def combine(items: list):
        return _fused(comm, items, dtype, redop, knobs, stream_name, cid, timeout, by_comm)

    return Fusable(key, member, fits, combine)


def _address(b) -> int:
    return b.ptr.addr if isinstance(b, runtime.DeviceArray) else b.addr


def _conflict(a, b) -> bool:
    """Two regions overlap and at least one of them is written."""
    return a[0] == b[0] and (a[3] or b[3]) and a[1] < b[2] and b[1] < a[2]


def _fused(comm, items: list, dtype, redop, knobs, stream_name, cid, timeout, by_comm):
    """The ``make()`` of a fused group: planned once here, built at every replay."""
    k = len(items)
    total = sum(m.count for m in items)
    pl = plan.collective(OpType.ALLREDUCE, comm.rank, comm.size, total, dtype, redop, None, None,
                         True, *knobs)
    fp = pl.fp._replace(root=k)         # root is unused by AllReduce: it carries the group size
    size = dtype.itemsize
    offsets, at = [], 0
    for m in items:
        offsets.append(at)
        at += m.count * size
    staging_bytes = max(pl.nbytes["recv"], at)

    def make():
        seq0 = comms.take_seqs(comm, k)
        recs = tuple(recorder.enqueue(comm, seq0 + i, m.pl.rec_fp, stream=stream_name,
                                      site=m.site, nbytes=m.count * size, names=m.pl.names)
                     for i, m in enumerate(items))

        def task():
            staging = np.empty(staging_bytes, np.uint8)
            outs = []
            for m, off in zip(items, offsets):
                n = m.count * size
                src = runtime.host_view(m.bufs["send"], n, name="send")
                staging[off:off + n] = src
                recv = m.bufs.get("recv")
                outs.append(src if recv is None or m.inplace else
                            runtime.host_view(recv, n, name="recv"))
            comms.execute(comm, OpType.ALLREDUCE, pl.steps, {"send": staging, "recv": staging},
                          redop, dtype, cid, seq0, fp, timeout, by_comm, recs)
            for out, off in zip(outs, offsets):
                out[:] = staging[off:off + out.size]
        return task
    return make
