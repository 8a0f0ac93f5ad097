"""Collectives as pure schedules: lists of Send / Recv / Copy steps, no I/O, no devices.

Design note.

A builder takes ``(rank, size, count, itemsize, slice_bytes)`` (plus ``root`` / ``peer`` /
``inplace``) and returns what ONE rank does, in order. ``hccl.algo.executor`` binds and runs
the list:
a Send is posted and not waited for (zero-copy), a Recv blocks until the message arrives and then
reduces it into, or copies it to, its region; a Copy moves bytes between local buffers. Offsets
and sizes are bytes; buffers are named: ``"send"`` and ``"recv"`` (the user's), ``"scratch"``
(staging the executor allocates, sized by ``buffer_extents``) and ``"none"`` (zero-byte messages).

Chunks, slices and tags are defined in hccl/algo/steps.py; Broadcast and Reduce by chain, tree or
scatter live in hccl/algo/rooted.py. This module holds the rest and the registry (``ALGORITHMS``,
``choose``, ``build``).

Ring AllReduce on n ranks = ReduceScatter (n-1 steps) then AllGather (n-1 steps) on ``recv``.
In ReduceScatter step s rank r receives chunk (r-s-2) mod n from r-1, writes its own ``send``
chunk reduced with it into ``recv`` (each step a chunk not written before, so no copy of send
into recv is needed first) and, slice by slice, sends the partial result on to r+1 as step s+1. After n-1 steps rank r holds chunk r fully reduced; the reduction
of chunk c happened in one fixed order (c+1, c+2, ..., c) on one rank, and AllGather only copies
it around, so every rank ends with bitwise-identical bytes. Each rank sends and receives
2(n-1)/n * S bytes for S = count * itemsize.

Pipelining. Sends never block, so a sender has every slice of a step in flight while the receiver
reduces slice k; a slice received at step s is sent on as step s+1 right away, so a long ring
step streams instead of waiting for the whole chunk. A region is never overwritten while a
zero-copy Send still reads it: the executor waits that send first (write-after-send hazard), so
schedules may reuse memory (ReduceScatter's two scratch slots, Reduce's two slice slots).

In place. ``inplace=True`` means recv is the same memory as send. AllReduce's reduce then reads
and writes the same bytes; one-shot AllReduce (but on 2 ranks whose sends complete alone:
``one_shot_all_reduce``) and AllToAll stage send in scratch (its pairwise exchange overwrites
chunks not yet sent). The other schedules are correct for aliased buffers as they are (the
executor skips self-copies and tracks hazards by address, not by buffer name).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from hccl.errors import InvalidArgumentError
from hccl.algo.rooted import (chain_broadcast, chain_reduce, mesh_broadcast,
                              scatter_all_gather_broadcast, tree_broadcast, tree_reduce)
from hccl.algo.steps import (NONE, RECV, SCRATCH, SEND, Builder, Copy, Layout, LocalReduce, Recv,
                             Send, Step, add_copy, check_args, check_rank, pieces, ring_gather,
                             split)
from hccl.types import OpType

__all__ = [  # the steps and rooted builders are re-exported: callers import them from here
    "NONE", "RECV", "SCRATCH", "SEND", "Builder", "Copy", "LocalReduce", "Recv", "Send", "Step",
    "split", "chain_broadcast", "chain_reduce", "scatter_all_gather_broadcast", "tree_broadcast",
    "tree_reduce", "one_shot_all_reduce", "star_all_reduce", "star_all_gather", "mesh_all_reduce", "ring_all_reduce", "ring_reduce_scatter",
    "ring_all_gather", "rhd_all_reduce", "pairwise_all_to_all", "p2p_send", "p2p_recv",
    "dissemination_barrier", "ALGORITHMS", "ONE_SHOT_BYTES", "STAR_BYTES", "STAR_GATHER_BYTES", "TREE_BYTES",
    "MESH_MIN_RANKS", "mesh_all_gather", "mesh_broadcast", "choose",
    "algorithms", "Schedule", "build", "reduces",
    "buffer_extents"]

# --- one-shot AllReduce (small messages) -------------------------------------------------------

ONE_SHOT_BYTES = 64 << 10


def one_shot_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                        inplace=False, solo_bytes=0) -> list:
    """Every rank sends its whole buffer to every other rank, then reduces all n contributions
    in rank order 0, 1, ..., n-1: one message latency instead of 2(n-1) dependent ring steps,
    for (n-1) x S bytes sent per rank, so it only pays for small S. The reduction order is the
    same on every rank, so results are still bitwise identical. Buffers larger than
    ``slice_bytes`` fall back to the ring.

    In place, own data is staged in scratch first: from 3 ranks on, a receive overwrites recv
    before the rank's own turn in the order; on 2, the one receive reduces element by element
    into the buffer the send reads, which is safe once the send completed (the executor waits
    for it), but a send that completes only when the peer receives it would wait for a peer
    doing the same. So 2 ranks skip the staging copy when the transport completes a send of
    S bytes alone (``solo_bytes``: ``Transport.solo_bytes``, 0 when unknown).
    """
    check_args(rank, size, count, itemsize, slice_bytes)
    nb = count * itemsize
    if size == 1 or nb == 0 or nb > slice_bytes:
        return ring_all_reduce(rank, size, count, itemsize, slice_bytes, inplace=inplace)
    stage = inplace and (size > 2 or nb > solo_bytes)
    own = SCRATCH if stage else SEND
    steps: list = [Copy(SEND, 0, SCRATCH, 0, nb)] if stage else []
    for k in range(1, size):                     # stagger the peers so no rank is hit first by all
        steps.append(Send((rank + k) % size, own, 0, nb, 0))
    for p in range(size):                        # recv = r0 op r1 op ... in rank order
        if p == rank == 0 or (p == 1 and rank == 1):
            continue                             # the step before or after reads it from ``own``
        if p == rank:
            steps.append(LocalReduce(own, 0, RECV, 0, nb))
        elif p == 1 and rank == 0:
            steps.append(Recv(p, RECV, 0, nb, 0, True, own))
        elif p == 0 and rank == 1:               # r0 op r1 in one pass, as rank 0 computes it
            steps.append(Recv(p, RECV, 0, nb, 0, True, own, payload_first=True))
        else:
            steps.append(Recv(p, RECV, 0, nb, 0, p != 0))
    return steps


def star_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False, solo_bytes=0) -> list:
    """Every rank sends its buffer to rank 0, which reduces them in rank order and sends the
    result back: 2(n-1) messages in all instead of the one-shot's n(n-1), in two dependent
    hops. Rank 0 computes the only result, so every rank holds the same bytes. Buffers larger
    than ``slice_bytes`` fall back to the ring."""
    check_args(rank, size, count, itemsize, slice_bytes)
    nb = count * itemsize
    if size == 1 or nb == 0 or nb > slice_bytes:
        return ring_all_reduce(rank, size, count, itemsize, slice_bytes, inplace=inplace)
    if rank != 0:
        return [Send(0, SEND, 0, nb, 0), Recv(0, RECV, 0, nb, 1)]
    steps: list = [Recv(1, RECV, 0, nb, 0, True, SEND)]      # recv = r0 op r1 (in place too)
    steps += [Recv(p, RECV, 0, nb, 0, True) for p in range(2, size)]
    steps += [Send(p, RECV, 0, nb, 1) for p in range(1, size)]
    return steps


# --- ring collectives -------------------------------------------------------------------------

def _all_reduce_start(rank, size, count, itemsize, slice_bytes, inplace) -> list:
    """Check the arguments; out of place, AllReduce works on ``recv`` after one copy of ``send``."""
    check_args(rank, size, count, itemsize, slice_bytes)
    steps: list = []
    if not inplace:
        add_copy(steps, SEND, 0, RECV, 0, count * itemsize)
    return steps


def ring_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False, solo_bytes=0) -> list:
    """Ring AllReduce = ReduceScatter + AllGather on ``recv``: 2(n-1) ring steps.

    No copy of send into recv first: the first send reads chunk r-1 from ``send``, and each
    ReduceScatter step writes its chunk as ``send op payload`` (``Recv.src``), the chunk's first
    write on this rank (each step reduces another chunk); AllGather writes the others.
    """
    if size == 1:
        return _all_reduce_start(rank, size, count, itemsize, slice_bytes, inplace)
    check_args(rank, size, count, itemsize, slice_bytes)
    steps: list = []
    lay = Layout(split(count, size), itemsize, slice_bytes)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    total = 2 * (size - 1)
    for k, (off, nb) in enumerate(lay.slices[(rank - 1) % size]):
        steps.append(Send(nxt, SEND, off, nb, lay.tag(0, k)))
    for s in range(total):
        reduce = s < size - 1
        c = (rank - s - 2) % size if reduce else (rank - (s - size + 1) - 1) % size
        for k, (off, nb) in enumerate(lay.slices[c]):
            steps.append(Recv(prv, RECV, off, nb, lay.tag(s, k), reduce, SEND if reduce else ""))
            if s + 1 < total:
                steps.append(Send(nxt, RECV, off, nb, lay.tag(s + 1, k)))
    return steps


def mesh_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False, solo_bytes=0) -> list:
    """ReduceScatter then AllGather, both straight between every pair (HCCL's fullmesh): rank r
    sends chunk c of ``send`` to rank c, writes chunk r as its own data reduced with the n-1
    contributions (in rank order), then sends it to every rank and receives theirs. Two
    dependent rounds instead of the ring's 2(n-1) steps, the same bytes per rank; inside a node
    the chunks are read in place. Chunk c is reduced once, on rank c, so every rank ends with
    the same bytes; in place works as it is (a chunk this rank overwrites in the AllGather is
    one its peer reads first, and the executor waits for that read)."""
    if size == 1:
        return _all_reduce_start(rank, size, count, itemsize, slice_bytes, inplace)
    check_args(rank, size, count, itemsize, slice_bytes)
    lay = Layout(split(count, size), itemsize, slice_bytes)
    order = [(rank + i) % size for i in range(1, size)]   # staggered: no rank is hit by all first
    peers = sorted(order)
    steps: list = [Send(p, SEND, off, nb, lay.tag(0, k))
                   for p in order for k, (off, nb) in enumerate(lay.slices[p])]
    for k, (off, nb) in enumerate(lay.slices[rank]):
        steps.append(Recv(peers[0], RECV, off, nb, lay.tag(0, k), True, SEND))
        steps += [Recv(p, RECV, off, nb, lay.tag(0, k), True) for p in peers[1:]]
    steps += [Send(p, RECV, off, nb, lay.tag(1, k))
              for p in order for k, (off, nb) in enumerate(lay.slices[rank])]
    steps += [Recv(p, RECV, off, nb, lay.tag(1, k))
              for p in reversed(order) for k, (off, nb) in enumerate(lay.slices[p])]
    return steps


def ring_reduce_scatter(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                        inplace=False, solo_bytes=0) -> list:
    """Ring ReduceScatter: ``count`` is the per-rank (recv) count; n-1 ring steps.

    Partial sums live in two scratch slots of one chunk each (step s uses slot s % 2), so the
    user's send buffer is never written; the last step reduces straight into ``recv``.
    """
    check_args(rank, size, count, itemsize, slice_bytes)
    cb = count * itemsize
    steps: list = []
    if size == 1:
        if not inplace:
            add_copy(steps, SEND, 0, RECV, 0, cb)
        return steps
    lay = Layout([(c * count, count) for c in range(size)], itemsize, slice_bytes)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k, (off, nb) in enumerate(lay.slices[(rank - 1) % size]):
        steps.append(Send(nxt, SEND, off, nb, lay.tag(0, k)))
    for s in range(size - 1):
        c = (rank - s - 2) % size
        last = s == size - 2
        for k, (off, nb) in enumerate(lay.slices[c]):
            rel = off - c * cb
            dst, dst_off = (RECV, rel) if last else (SCRATCH, (s % 2) * cb + rel)
            add_copy(steps, SEND, off, dst, dst_off, nb)
            steps.append(Recv(prv, dst, dst_off, nb, lay.tag(s, k), True))
            if not last:
                steps.append(Send(nxt, dst, dst_off, nb, lay.tag(s + 1, k)))
    return steps


def _gather_start(rank, size, count, itemsize, slice_bytes):
    """AllGather's common start: the arguments checked; on one rank the whole schedule (a copy),
    else no steps yet and the blocks' ``Layout`` on ``recv``."""
    check_args(rank, size, count, itemsize, slice_bytes)
    steps: list = []
    if size == 1:
        add_copy(steps, SEND, 0, RECV, 0, count * itemsize)
        return steps, None
    return steps, Layout([(c * count, count) for c in range(size)], itemsize, slice_bytes)


def ring_all_gather(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False, solo_bytes=0) -> list:
    """Ring AllGather: ``count`` is the per-rank (send) count; n-1 ring steps on ``recv``, this
    rank's block sent from ``send`` and copied into ``recv`` behind its first sends."""
    steps, lay = _gather_start(rank, size, count, itemsize, slice_bytes)
    if lay is not None:
        ring_gather(steps, rank, size, lay, first=0, from_send=True)
    return steps


def mesh_all_gather(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False, solo_bytes=0) -> list:
    """Every rank sends its block to every other rank directly and receives theirs: one round
    instead of n-1 dependent ring steps, the same bytes per rank (HCCL's fullmesh). The block
    goes out from ``send``; its copy into ``recv`` follows the sends."""
    steps, lay = _gather_start(rank, size, count, itemsize, slice_bytes)
    if lay is None:
        return steps
    cb = count * itemsize
    for i in range(1, size):
        for k, (off, nb) in enumerate(lay.slices[rank]):
            steps.append(Send((rank + i) % size, SEND, off - rank * cb, nb, k))
    add_copy(steps, SEND, 0, RECV, rank * cb, cb)
    for i in range(1, size):
        frm = (rank - i) % size
        for k, (off, nb) in enumerate(lay.slices[frm]):
            steps.append(Recv(frm, RECV, off, nb, k))
    return steps


def star_all_gather(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False, solo_bytes=0) -> list:
    """Every rank sends its block to rank 0, which sends the gathered buffer back: 2(n-1)
    messages in all instead of the mesh's n(n-1), in two dependent hops (the star AllReduce's
    shape). Buffers whose gathered size exceeds ``slice_bytes`` take the mesh."""
    cb = count * itemsize
    if size == 1 or cb == 0 or size * cb > slice_bytes:
        return mesh_all_gather(rank, size, count, itemsize, slice_bytes)
    check_args(rank, size, count, itemsize, slice_bytes)
    if rank != 0:
        return [Send(0, SEND, 0, cb, 0), Recv(0, RECV, 0, size * cb, 1)]
    steps = [Recv(p, RECV, p * cb, cb, 0) for p in range(1, size)]
    add_copy(steps, SEND, 0, RECV, 0, cb)
    steps += [Send(p, RECV, 0, size * cb, 1) for p in range(1, size)]
    return steps


# --- recursive halving / doubling AllReduce (medium messages) -----------------------------------
def rhd_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                   inplace=False, solo_bytes=0) -> list:
    """Recursive halving (ReduceScatter) then recursive doubling (AllGather): 2 log2 p rounds.

    p is the largest power of two <= n. The n - p extra ranks first hand their whole buffer to
    rank r - p (which reduces it in) and get the result back at the end. Among the p ranks,
    round j pairs v with v ^ (p >> (j+1)): each keeps half of its current range of chunks,
    sends the other half and reduces the partner's copy of the kept half into its own; after
    log2 p rounds rank v holds chunk v fully reduced, and the doubling rounds copy the chunks
    back in the reverse order. Every chunk is reduced on one rank only, then copied: bitwise
    identical on every rank, like the ring. Each rank sends and receives about 2 (p-1)/p S
    bytes (plus S twice for a folded pair) in 2 log2 p rounds instead of 2 (n-1).
    """
    steps = _all_reduce_start(rank, size, count, itemsize, slice_bytes, inplace)
    if size == 1:
        return steps
    p = 1 << (size.bit_length() - 1)
    rounds = p.bit_length() - 1
    whole = pieces(0, count, itemsize, slice_bytes)
    chunks = split(count, p)
    width = max(len(whole), max(len(pieces(f, m, itemsize, slice_bytes)) for f, m in chunks))

    def span(lo, hi):                    # chunks [lo, hi) as one element range
        first = chunks[lo][0]
        last = chunks[hi - 1][0] + chunks[hi - 1][1]
        return pieces(first, last - first, itemsize, slice_bytes)

    def exchange(other, give, take, tag, reduce):
        for k, (off, nb) in enumerate(give):
            steps.append(Send(other, RECV, off, nb, tag * width + k))
        for k, (off, nb) in enumerate(take):
            steps.append(Recv(other, RECV, off, nb, tag * width + k, reduce))

    last_tag = 2 * rounds + 1
    if rank >= p:                        # an extra rank: fold in, get the result back
        for k, (off, nb) in enumerate(whole):
            steps.append(Send(rank - p, RECV, off, nb, k))
        for k, (off, nb) in enumerate(whole):
            steps.append(Recv(rank - p, RECV, off, nb, last_tag * width + k))
        return steps
    if rank + p < size:
        for k, (off, nb) in enumerate(whole):
            steps.append(Recv(rank + p, RECV, off, nb, k, True))
    lo, hi = 0, p
    for j in range(rounds):              # halving: keep the half that holds chunk `rank`
        d = p >> (j + 1)
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & d == 0 else ((mid, hi), (lo, mid))
        exchange(rank ^ d, span(*give), span(*keep), 1 + j, True)
        lo, hi = keep
    for j in range(rounds):              # doubling: the partner's half comes back
        d = 1 << j
        size_now = hi - lo
        other = (lo + size_now, hi + size_now) if rank & d == 0 else (lo - size_now, lo)
        exchange(rank ^ d, span(lo, hi), span(*other), 1 + rounds + j, False)
        lo, hi = min(lo, other[0]), max(hi, other[1])
    if rank + p < size:
        for k, (off, nb) in enumerate(whole):
            steps.append(Send(rank + p, RECV, off, nb, last_tag * width + k))
    return steps


# --- all-to-all, point-to-point, barrier ------------------------------------------------------

def pairwise_all_to_all(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                        inplace=False, solo_bytes=0) -> list:
    """Pairwise exchange: in step i rank r sends chunk r+i to r+i and receives chunk r-i from r-i.

    ``count`` is the per-peer count (send_count == recv_count). In place, ``send`` is staged in
    scratch first, because receiving chunk r-i would overwrite data not yet sent.
    """
    check_args(rank, size, count, itemsize, slice_bytes)
    cb = count * itemsize
    steps: list = []
    src = SEND
    if inplace and size > 1:
        add_copy(steps, SEND, 0, SCRATCH, 0, size * cb)
        src = SCRATCH
    add_copy(steps, src, rank * cb, RECV, rank * cb, cb)
    lay = Layout([(c * count, count) for c in range(size)], itemsize, slice_bytes)
    for i in range(1, size):
        to, frm = (rank + i) % size, (rank - i) % size
        for k, (off, nb) in enumerate(lay.slices[to]):
            steps.append(Send(to, src, off, nb, k))
        for k, (off, nb) in enumerate(lay.slices[frm]):
            steps.append(Recv(frm, RECV, off, nb, k))
    return steps


def _p2p_slices(rank, size, count, itemsize, slice_bytes, peer) -> list[tuple[int, int]]:
    check_args(rank, size, count, itemsize, slice_bytes)
    check_rank("peer", peer, size, rank)
    return pieces(0, count, itemsize, slice_bytes)


def p2p_send(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
             inplace=False, solo_bytes=0) -> list:
    """Point-to-point send of ``send[:count]`` to ``peer``, sliced; tags 0, 1, ..."""
    return [Send(peer, SEND, off, nb, k) for k, (off, nb) in
            enumerate(_p2p_slices(rank, size, count, itemsize, slice_bytes, peer))]


def p2p_recv(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
             inplace=False, solo_bytes=0) -> list:
    """Point-to-point receive of ``recv[:count]`` from ``peer``; mirror of ``p2p_send``."""
    return [Recv(peer, RECV, off, nb, k) for k, (off, nb) in
            enumerate(_p2p_slices(rank, size, count, itemsize, slice_bytes, peer))]


def dissemination_barrier(rank, size, count=0, itemsize=1, slice_bytes=1, *, root=None,
                          peer=None, inplace=False, solo_bytes=0) -> list:
    """Dissemination barrier: in round j send to r+2^j, receive from r-2^j; ceil(log2 n) rounds."""
    check_args(rank, size, 0, 1, 1)
    steps: list = []
    j, dist = 0, 1
    while dist < size:
        steps.append(Send((rank + dist) % size, NONE, 0, 0, j))
        steps.append(Recv((rank - dist) % size, NONE, 0, 0, j))
        j, dist = j + 1, dist * 2
    return steps


# --- registry ---------------------------------------------------------------------------------

_RING: dict[OpType, Builder] = {
    OpType.ALLREDUCE: ring_all_reduce,
    OpType.ALLGATHER: ring_all_gather,
    OpType.REDUCE_SCATTER: ring_reduce_scatter,
    OpType.BROADCAST: chain_broadcast,
    OpType.REDUCE: chain_reduce,
    OpType.ALLTOALL: pairwise_all_to_all,
    OpType.SEND: p2p_send,
    OpType.RECV: p2p_recv,
    OpType.BARRIER: dissemination_barrier,
}

ALGORITHMS: dict[str, dict[OpType, Builder]] = {
    "ring": _RING,
    # Binomial trees for the rooted collectives (log2 n hops: better for small messages).
    "tree": {**_RING, OpType.BROADCAST: tree_broadcast, OpType.REDUCE: tree_reduce},
    # One-shot AllReduce (falls back to the ring above slice_bytes).
    "oneshot": {**_RING, OpType.ALLREDUCE: one_shot_all_reduce},
    # Recursive halving / doubling AllReduce (HCCL's "H-D_R").
    "hd": {**_RING, OpType.ALLREDUCE: rhd_all_reduce},
    # Broadcast as scatter + ring AllGather.
    "scatter": {**_RING, OpType.BROADCAST: scatter_all_gather_broadcast},
    # Every rank straight to every other (HCCL's fullmesh): Broadcast, AllGather, and
    # AllReduce as mesh ReduceScatter + mesh AllGather.
    "mesh": {**_RING, OpType.BROADCAST: mesh_broadcast, OpType.ALLGATHER: mesh_all_gather,
             OpType.ALLREDUCE: mesh_all_reduce},
    # AllReduce through rank 0 (gather, reduce, send back): the fewest messages.
    "star": {**_RING, OpType.ALLREDUCE: star_all_reduce, OpType.ALLGATHER: star_all_gather},
}
_ALIASES = {"h-d_r": "hd", "hd_r": "hd", "fullmesh": "mesh"}

# Crossover points of ``choose``, measured on this machine (docs/algorithms.md, "Choosing").
STAR_BYTES = 4 << 20         # AllReduce from 3 ranks on: through rank 0 up to here, then mesh
TREE_BYTES = 64 << 10         # Reduce: binomial tree up to here
MESH_MIN_RANKS = 3            # AllGather: every rank to every rank from 3 ranks on (at 2, a ring)
STAR_GATHER_BYTES = 64 << 10  # AllGather from 3 ranks on: through rank 0 while the gathered
                              # buffer fits a ring slot of the intra-node channel, then mesh


def choose(op, nbytes: int, size: int) -> str:
    """The algorithm for collective ``op`` of ``nbytes`` per rank on ``size`` ranks when
    HCCL_ALGO is not set: latency-bound sizes take the fewest rounds, large ones the ring."""
    op = OpType.of(op)
    if size <= 1:
        return "ring"
    if op == OpType.ALLREDUCE:
        if size >= 3:
            return "star" if 0 < nbytes <= STAR_BYTES else "mesh"
        return "oneshot" if 0 < nbytes <= ONE_SHOT_BYTES else "ring"
    if op == OpType.ALLGATHER and size >= MESH_MIN_RANKS:
        return "star" if 0 < nbytes * size <= STAR_GATHER_BYTES else "mesh"
    if op == OpType.BROADCAST or (op == OpType.REDUCE and nbytes <= TREE_BYTES):
        return "tree"
    return "ring"


def algorithms(name: str) -> dict[OpType, Builder]:
    """The builders of algorithm ``name`` (HCCL_ALGO); raises InvalidArgumentError listing names."""
    try:
        key = name.strip().lower()
        return ALGORITHMS[_ALIASES.get(key, key)]
    except (KeyError, AttributeError):
        raise InvalidArgumentError(
            f"HCCL_ALGO={name!r} is not an algorithm of npusim; valid: "
            f"{', '.join(sorted(ALGORITHMS))} (or unset: chosen by size)") from None


@dataclass(frozen=True)
class Schedule:
    """One rank's steps with what the executor asks of them, computed when built: the bytes each
    named buffer must hold (``extents``) and whether a Recv reduces (``reduces``). Immutable, so
    one Schedule is shared by every call of the same shape (``hccl.algo.plan``)."""

    steps: tuple
    extents: Mapping[str, int]
    reduces: bool

    @classmethod
    def of(cls, steps) -> "Schedule":
        steps = tuple(steps)
        return cls(steps, MappingProxyType(buffer_extents(steps)), reduces(steps))

    def __iter__(self):
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i):
        return self.steps[i]


def build(op, rank: int, size: int, count: int, itemsize: int, slice_bytes: int, *,
          root: int | None = None, peer: int | None = None, inplace: bool = False,
          algo: str = "ring", solo_bytes: int = 0) -> Schedule:
    """The schedule of collective ``op`` (an OpType or its name) for ``rank`` of ``size``.

    ``count`` is the HCCL call's per-rank count (recv_count for ReduceScatter, send_count for
    AllGather, per-peer count for AllToAll). ``root`` is required for Broadcast/Reduce and
    ``peer`` (comm rank) for Send/Recv. ``algo="auto"`` picks by size (``choose``).
    ``solo_bytes``: the largest send the transport completes without its peer receiving it
    (``Transport.solo_bytes``); every builder takes it, as it takes ``root`` and ``peer``, and
    one-shot AllReduce uses it. Not cached
    here: ``hccl.algo.plan`` keeps the plans of the calls made. Raises InvalidArgumentError for bad
    arguments.
    """
    op = OpType.of(op)
    if algo == "auto":
        algo = choose(op, count * itemsize, size)
    return Schedule.of(algorithms(algo)[op](rank, size, count, itemsize, slice_bytes, root=root,
                                            peer=peer, inplace=bool(inplace),
                                            solo_bytes=solo_bytes))


def reduces(steps) -> bool:
    """True when a Recv of ``steps`` reduces into its region (needs op and dtype)."""
    if type(steps) is Schedule:
        return steps.reduces
    return any(type(s) is Recv and s.reduce for s in steps)


def buffer_extents(steps) -> dict[str, int]:
    """Bytes each named buffer must hold for ``steps`` (``"none"`` excluded)."""
    if type(steps) is Schedule:
        return steps.extents
    ext: dict[str, int] = {}

    def see(buf: str, end: int) -> None:
        if buf != NONE and end > ext.get(buf, 0):
            ext[buf] = end
        elif buf != NONE:
            ext.setdefault(buf, 0)

    for st in steps:
        if isinstance(st, (Copy, LocalReduce)):
            see(st.src_buf, st.src_off + st.nbytes)
            see(st.dst_buf, st.dst_off + st.nbytes)
        else:
            see(st.buf, st.offset + st.nbytes)
            if type(st) is Recv and st.src:
                see(st.src, st.offset + st.nbytes)
    return ext
