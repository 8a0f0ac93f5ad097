"""Collectives as pure schedules: lists of Send / Recv / Copy steps, no I/O, no devices.

Design note.

A builder takes ``(rank, size, count, itemsize, slice_bytes)`` (plus ``root`` / ``peer`` /
``inplace``) and returns what ONE rank does, in order. ``hccl.executor.run`` interprets the list:
a Send is posted and not waited for (zero-copy), a Recv blocks until the message arrives and then
reduces it into, or copies it to, its region; a Copy moves bytes between local buffers. Offsets
and sizes are bytes; buffers are named: ``"send"`` and ``"recv"`` (the user's), ``"scratch"``
(staging the executor allocates, sized by ``buffer_extents``) and ``"none"`` (zero-byte messages).

Chunks and slices. The buffer of a ring collective is cut into ``size`` chunks (rank r owns
chunk r); chunks differ by at most one element when ``count`` is not divisible by ``size``. A
chunk larger than ``slice_bytes`` (HCCL_BUFFSIZE) travels as slices of at most that many bytes,
and each slice is a message. An empty chunk still sends one zero-byte message, so every rank
exchanges messages (and fingerprints) with its ring neighbours whatever the count: a rank that
called a different collective is detected on the first message instead of by a timeout.

Ring AllReduce on n ranks = ReduceScatter (n-1 steps) then AllGather (n-1 steps) on ``recv``
(after one ``send -> recv`` copy when out of place). In ReduceScatter step s rank r receives
chunk (r-s-2) mod n from r-1, reduces it into its own copy and, slice by slice, sends the partial
result on to r+1 as step s+1. After n-1 steps rank r holds chunk r fully reduced; the reduction
of chunk c happened in one fixed order (c+1, c+2, ..., c) on one rank, and AllGather only copies
it around, so every rank ends with bitwise-identical bytes. Each rank sends and receives
2(n-1)/n * S bytes for S = count * itemsize.

Pipelining. Sends never block, so a sender has every slice of a step in flight while the receiver
reduces slice k; a slice received at step s is sent on as step s+1 right away, so a long ring
step streams instead of waiting for the whole chunk. A region is never overwritten while a
zero-copy Send still reads it: the executor waits that send first (write-after-send hazard), so
schedules may reuse memory (ReduceScatter's two scratch slots, Reduce's two slice slots).

Tags. ``step`` of Send/Recv is the message tag: ``ring_step * width + slice`` with ``width`` the
most slices any chunk has, unique per (collective, peer, direction) and computed identically by
sender and receiver.

In place. ``inplace=True`` means recv is the same memory as send. AllReduce then skips its first
copy; AllToAll stages send in scratch (its pairwise exchange overwrites chunks not yet sent). The
other schedules are correct for aliased buffers as they are (the executor skips self-copies and
tracks hazards by address, not by buffer name).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Union

from hccl.errors import InvalidArgumentError
from hccl.types import OpType

SEND = "send"
RECV = "recv"
SCRATCH = "scratch"
NONE = "none"


@dataclass(frozen=True, slots=True)
class Send:
    """Post ``buf[offset:offset+nbytes]`` to comm rank ``peer`` with tag ``step`` (non-blocking)."""

    peer: int
    buf: str
    offset: int
    nbytes: int
    step: int


@dataclass(frozen=True, slots=True)
class Recv:
    """Wait for tag ``step`` from ``peer``; reduce it into (``reduce``) or copy it to the region."""

    peer: int
    buf: str
    offset: int
    nbytes: int
    step: int
    reduce: bool = False


@dataclass(frozen=True, slots=True)
class Copy:
    """Local copy ``dst_buf[dst_off:+nbytes] = src_buf[src_off:+nbytes]``."""

    src_buf: str
    src_off: int
    dst_buf: str
    dst_off: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class LocalReduce:
    """Local reduction ``dst_buf[dst_off:+nbytes] op= src_buf[src_off:+nbytes]``."""

    src_buf: str
    src_off: int
    dst_buf: str
    dst_off: int
    nbytes: int


Step = Union[Send, Recv, Copy, LocalReduce]
Builder = Callable[..., list]


# --- layout helpers ---------------------------------------------------------------------------

def split(count: int, parts: int) -> list[tuple[int, int]]:
    """``(first element, elements)`` of each of ``parts`` chunks; sizes differ by at most one."""
    base, extra = divmod(count, parts)
    return [(i * base + min(i, extra), base + (1 if i < extra else 0)) for i in range(parts)]


class _Layout:
    """Byte slices of each chunk, and the tag stride that keeps tags unique."""

    def __init__(self, chunks: list[tuple[int, int]], itemsize: int, slice_bytes: int):
        per = max(1, slice_bytes // itemsize)
        self.slices = []
        for first, n in chunks:
            pieces = [(first, 0)] if n == 0 else [
                (first + o, min(per, n - o)) for o in range(0, n, per)]
            self.slices.append([(f * itemsize, m * itemsize) for f, m in pieces])
        self.width = max(len(s) for s in self.slices)

    def tag(self, step: int, k: int) -> int:
        return step * self.width + k


def _check(rank: int, size: int, count: int, itemsize: int, slice_bytes: int) -> None:
    if size < 1:
        raise InvalidArgumentError(f"world size must be >= 1, got {size}")
    if not 0 <= rank < size:
        raise InvalidArgumentError(f"rank {rank} is out of range for size {size}")
    if count < 0:
        raise InvalidArgumentError(f"count must be >= 0, got {count}")
    if itemsize < 1 or slice_bytes < 1:
        raise InvalidArgumentError(
            f"itemsize ({itemsize}) and slice_bytes ({slice_bytes}) must be positive")


def _check_rank(name: str, value, size: int, rank: int | None = None) -> int:
    if value is None or not 0 <= value < size:
        raise InvalidArgumentError(f"{name} {value} is out of range for a communicator of {size}")
    if rank is not None and value == rank:
        raise InvalidArgumentError(f"{name} {value} is this rank itself; pick another rank")
    return value


def _copy(steps: list, src: str, src_off: int, dst: str, dst_off: int, nbytes: int) -> None:
    if nbytes:
        steps.append(Copy(src, src_off, dst, dst_off, nbytes))


# --- one-shot AllReduce (small messages) -------------------------------------------------------

ONE_SHOT_BYTES = 64 << 10


def one_shot_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                        inplace=False) -> list:
    """Every rank sends its whole buffer to every other rank, then reduces all n contributions
    in rank order 0, 1, ..., n-1: one message latency instead of 2(n-1) dependent ring steps,
    for (n-1) x S bytes sent per rank, so it only pays for small S. The reduction order is the
    same on every rank, so results are still bitwise identical. Own data is staged in scratch
    first, so in place is safe. Buffers larger than ``slice_bytes`` fall back to the ring.
    """
    _check(rank, size, count, itemsize, slice_bytes)
    nb = count * itemsize
    if size == 1 or nb == 0 or nb > slice_bytes:
        return ring_all_reduce(rank, size, count, itemsize, slice_bytes, inplace=inplace)
    steps: list = [Copy(SEND, 0, SCRATCH, 0, nb)]
    for k in range(1, size):                     # stagger the peers so no rank is hit first by all
        steps.append(Send((rank + k) % size, SCRATCH, 0, nb, 0))
    for p in range(size):
        if p == rank:
            steps.append(Copy(SCRATCH, 0, RECV, 0, nb) if p == 0 else
                         LocalReduce(SCRATCH, 0, RECV, 0, nb))
        else:
            steps.append(Recv(p, RECV, 0, nb, 0, p != 0))
    return steps


# --- ring collectives -------------------------------------------------------------------------

def ring_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False) -> list:
    """Ring AllReduce = ReduceScatter + AllGather on ``recv``: 2(n-1) ring steps."""
    _check(rank, size, count, itemsize, slice_bytes)
    steps: list = []
    if not inplace:
        _copy(steps, SEND, 0, RECV, 0, count * itemsize)
    if size == 1:
        return steps
    lay = _Layout(split(count, size), itemsize, slice_bytes)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    total = 2 * (size - 1)
    for k, (off, nb) in enumerate(lay.slices[(rank - 1) % size]):
        steps.append(Send(nxt, RECV, off, nb, lay.tag(0, k)))
    for s in range(total):
        reduce = s < size - 1
        c = (rank - s - 2) % size if reduce else (rank - (s - size + 1) - 1) % size
        for k, (off, nb) in enumerate(lay.slices[c]):
            steps.append(Recv(prv, RECV, off, nb, lay.tag(s, k), reduce))
            if s + 1 < total:
                steps.append(Send(nxt, RECV, off, nb, lay.tag(s + 1, k)))
    return steps


def ring_reduce_scatter(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                        inplace=False) -> list:
    """Ring ReduceScatter: ``count`` is the per-rank (recv) count; n-1 ring steps.

    Partial sums live in two scratch slots of one chunk each (step s uses slot s % 2), so the
    user's send buffer is never written; the last step reduces straight into ``recv``.
    """
    _check(rank, size, count, itemsize, slice_bytes)
    cb = count * itemsize
    steps: list = []
    if size == 1:
        if not inplace:
            _copy(steps, SEND, 0, RECV, 0, cb)
        return steps
    lay = _Layout([(c * count, count) for c in range(size)], itemsize, slice_bytes)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k, (off, nb) in enumerate(lay.slices[(rank - 1) % size]):
        steps.append(Send(nxt, SEND, off, nb, lay.tag(0, k)))
    for s in range(size - 1):
        c = (rank - s - 2) % size
        last = s == size - 2
        for k, (off, nb) in enumerate(lay.slices[c]):
            rel = off - c * cb
            dst, dst_off = (RECV, rel) if last else (SCRATCH, (s % 2) * cb + rel)
            _copy(steps, SEND, off, dst, dst_off, nb)
            steps.append(Recv(prv, dst, dst_off, nb, lay.tag(s, k), True))
            if not last:
                steps.append(Send(nxt, dst, dst_off, nb, lay.tag(s + 1, k)))
    return steps


def ring_all_gather(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                    inplace=False) -> list:
    """Ring AllGather: ``count`` is the per-rank (send) count; n-1 ring steps on ``recv``."""
    _check(rank, size, count, itemsize, slice_bytes)
    cb = count * itemsize
    steps: list = []
    _copy(steps, SEND, 0, RECV, rank * cb, cb)
    if size == 1:
        return steps
    lay = _Layout([(c * count, count) for c in range(size)], itemsize, slice_bytes)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k, (off, nb) in enumerate(lay.slices[rank]):
        steps.append(Send(nxt, RECV, off, nb, lay.tag(0, k)))
    for t in range(size - 1):
        c = (rank - t - 1) % size
        for k, (off, nb) in enumerate(lay.slices[c]):
            steps.append(Recv(prv, RECV, off, nb, lay.tag(t, k)))
            if t < size - 2:
                steps.append(Send(nxt, RECV, off, nb, lay.tag(t + 1, k)))
    return steps


# --- recursive halving / doubling AllReduce (medium messages) -----------------------------------

def _pieces(first: int, n: int, itemsize: int, slice_bytes: int) -> list[tuple[int, int]]:
    """Byte (offset, length) slices of elements [first, first+n); one empty piece if n is 0."""
    return _Layout([(first, n)], itemsize, slice_bytes).slices[0]


def rhd_all_reduce(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                   inplace=False) -> list:
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
    _check(rank, size, count, itemsize, slice_bytes)
    steps: list = []
    if not inplace:
        _copy(steps, SEND, 0, RECV, 0, count * itemsize)
    if size == 1:
        return steps
    p = 1 << (size.bit_length() - 1)
    rounds = p.bit_length() - 1
    whole = _pieces(0, count, itemsize, slice_bytes)
    chunks = split(count, p)
    width = max(len(whole), max(len(_pieces(f, m, itemsize, slice_bytes)) for f, m in chunks))

    def span(lo, hi):                    # chunks [lo, hi) as one element range
        first = chunks[lo][0]
        last = chunks[hi - 1][0] + chunks[hi - 1][1]
        return _pieces(first, last - first, itemsize, slice_bytes)

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


# --- rooted collectives -----------------------------------------------------------------------

def chain_broadcast(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                    inplace=False) -> list:
    """Pipelined chain root -> root+1 -> ... -> root-1 on ``recv``: n-1+slices-1 slice times."""
    _check(rank, size, count, itemsize, slice_bytes)
    _check_rank("root", root, size)
    if size == 1:
        return []
    pos = (rank - root) % size
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    steps: list = []
    for k, (off, nb) in enumerate(_Layout([(0, count)], itemsize, slice_bytes).slices[0]):
        if pos > 0:
            steps.append(Recv(prv, RECV, off, nb, k))
        if pos < size - 1:
            steps.append(Send(nxt, RECV, off, nb, k))
    return steps


def chain_reduce(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                 inplace=False) -> list:
    """Pipelined chain root+1 -> root+2 -> ... -> root, reducing on the way.

    Intermediate ranks accumulate in two scratch slots of one slice each (slice k uses slot
    k % 2); only the root writes ``recv``.
    """
    _check(rank, size, count, itemsize, slice_bytes)
    _check_rank("root", root, size)
    steps: list = []
    if rank == root:
        _copy(steps, SEND, 0, RECV, 0, count * itemsize)
    if size == 1:
        return steps
    pos = (rank - root - 1) % size          # 0 = head of the chain, size-1 = root
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    pieces = _Layout([(0, count)], itemsize, slice_bytes).slices[0]
    slot = pieces[0][1]
    for k, (off, nb) in enumerate(pieces):
        if pos == 0:
            steps.append(Send(nxt, SEND, off, nb, k))
        elif rank == root:
            steps.append(Recv(prv, RECV, off, nb, k, True))
        else:
            acc = (k % 2) * slot
            _copy(steps, SEND, off, SCRATCH, acc, nb)
            steps.append(Recv(prv, SCRATCH, acc, nb, k, True))
            steps.append(Send(nxt, SCRATCH, acc, nb, k))
    return steps


def scatter_all_gather_broadcast(rank, size, count, itemsize, slice_bytes, *, root=0,
                                 peer=None, inplace=False) -> list:
    """Broadcast as a scatter (the root sends chunk c to rank c) then a ring AllGather of the
    chunks on ``recv``: the root sends (n-1)/n S instead of S, and every link carries S/n at a
    time, so large buffers finish in about 2 S/n per link time instead of one rank's S."""
    _check(rank, size, count, itemsize, slice_bytes)
    _check_rank("root", root, size)
    if size == 1:
        return []
    lay = _Layout(split(count, size), itemsize, slice_bytes)
    steps: list = []
    if rank == root:
        for c in range(1, size):
            dst = (root + c) % size
            for k, (off, nb) in enumerate(lay.slices[dst]):
                steps.append(Send(dst, RECV, off, nb, lay.tag(0, k)))
    else:
        for k, (off, nb) in enumerate(lay.slices[rank]):
            steps.append(Recv(root, RECV, off, nb, lay.tag(0, k)))
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k, (off, nb) in enumerate(lay.slices[rank]):
        steps.append(Send(nxt, RECV, off, nb, lay.tag(1, k)))
    for t in range(size - 1):
        c = (rank - t - 1) % size
        for k, (off, nb) in enumerate(lay.slices[c]):
            steps.append(Recv(prv, RECV, off, nb, lay.tag(1 + t, k)))
            if t < size - 2:
                steps.append(Send(nxt, RECV, off, nb, lay.tag(2 + t, k)))
    return steps


def _binomial(v: int, size: int) -> tuple[int | None, list[int]]:
    """Parent and children (largest subtree first) of relative rank ``v`` in a binomial tree."""
    parent, mask = None, 1
    while mask < size:
        if v & mask:
            parent = v - mask
            break
        mask <<= 1
    children = []
    mask >>= 1
    while mask > 0:
        if v + mask < size:
            children.append(v + mask)
        mask >>= 1
    return parent, children


def tree_broadcast(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                   inplace=False) -> list:
    """Pipelined binomial-tree Broadcast on ``recv``: ceil(log2 n) hops."""
    _check(rank, size, count, itemsize, slice_bytes)
    _check_rank("root", root, size)
    if size == 1:
        return []
    parent, children = _binomial((rank - root) % size, size)
    real = lambda v: (v + root) % size  # noqa: E731
    steps: list = []
    for k, (off, nb) in enumerate(_Layout([(0, count)], itemsize, slice_bytes).slices[0]):
        if parent is not None:
            steps.append(Recv(real(parent), RECV, off, nb, k))
        for child in children:
            steps.append(Send(real(child), RECV, off, nb, k))
    return steps


def tree_reduce(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                inplace=False) -> list:
    """Pipelined binomial-tree Reduce: children (smallest subtree first) reduce into a parent."""
    _check(rank, size, count, itemsize, slice_bytes)
    _check_rank("root", root, size)
    steps: list = []
    if rank == root:
        _copy(steps, SEND, 0, RECV, 0, count * itemsize)
    if size == 1:
        return steps
    parent, children = _binomial((rank - root) % size, size)
    real = lambda v: (v + root) % size  # noqa: E731
    pieces = _Layout([(0, count)], itemsize, slice_bytes).slices[0]
    slot = pieces[0][1]
    for k, (off, nb) in enumerate(pieces):
        if parent is None:
            buf, at = RECV, off
        elif not children:
            steps.append(Send(real(parent), SEND, off, nb, k))
            continue
        else:
            buf, at = SCRATCH, (k % 2) * slot
            _copy(steps, SEND, off, buf, at, nb)
        for child in reversed(children):
            steps.append(Recv(real(child), buf, at, nb, k, True))
        if parent is not None:
            steps.append(Send(real(parent), buf, at, nb, k))
    return steps


# --- all-to-all, point-to-point, barrier ------------------------------------------------------

def pairwise_all_to_all(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
                        inplace=False) -> list:
    """Pairwise exchange: in step i rank r sends chunk r+i to r+i and receives chunk r-i from r-i.

    ``count`` is the per-peer count (send_count == recv_count). In place, ``send`` is staged in
    scratch first, because receiving chunk r-i would overwrite data not yet sent.
    """
    _check(rank, size, count, itemsize, slice_bytes)
    cb = count * itemsize
    steps: list = []
    src = SEND
    if inplace and size > 1:
        _copy(steps, SEND, 0, SCRATCH, 0, size * cb)
        src = SCRATCH
    _copy(steps, src, rank * cb, RECV, rank * cb, cb)
    lay = _Layout([(c * count, count) for c in range(size)], itemsize, slice_bytes)
    for i in range(1, size):
        to, frm = (rank + i) % size, (rank - i) % size
        for k, (off, nb) in enumerate(lay.slices[to]):
            steps.append(Send(to, src, off, nb, k))
        for k, (off, nb) in enumerate(lay.slices[frm]):
            steps.append(Recv(frm, RECV, off, nb, k))
    return steps


def p2p_send(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
             inplace=False) -> list:
    """Point-to-point send of ``send[:count]`` to ``peer``, sliced; tags 0, 1, ..."""
    _check(rank, size, count, itemsize, slice_bytes)
    _check_rank("peer", peer, size, rank)
    pieces = _Layout([(0, count)], itemsize, slice_bytes).slices[0]
    return [Send(peer, SEND, off, nb, k) for k, (off, nb) in enumerate(pieces)]


def p2p_recv(rank, size, count, itemsize, slice_bytes, *, root=None, peer=None,
             inplace=False) -> list:
    """Point-to-point receive of ``recv[:count]`` from ``peer``; mirror of ``p2p_send``."""
    _check(rank, size, count, itemsize, slice_bytes)
    _check_rank("peer", peer, size, rank)
    pieces = _Layout([(0, count)], itemsize, slice_bytes).slices[0]
    return [Recv(peer, RECV, off, nb, k) for k, (off, nb) in enumerate(pieces)]


def dissemination_barrier(rank, size, count=0, itemsize=1, slice_bytes=1, *, root=None,
                          peer=None, inplace=False) -> list:
    """Dissemination barrier: in round j send to r+2^j, receive from r-2^j; ceil(log2 n) rounds."""
    _check(rank, size, 0, 1, 1)
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
}
_ALIASES = {"h-d_r": "hd", "hd_r": "hd"}

# Crossover points of ``choose``, measured on this machine (docs/algorithms.md, "Choosing").
HD_BYTES = 1 << 20            # AllReduce: recursive halving / doubling up to here, then ring
TREE_BYTES = 64 << 10         # Broadcast / Reduce: binomial tree up to here
SCATTER_MIN_RANKS = 3         # Broadcast above TREE_BYTES: scatter + AllGather from 3 ranks on


def choose(op, nbytes: int, size: int) -> str:
    """The algorithm for collective ``op`` of ``nbytes`` per rank on ``size`` ranks when
    HCCL_ALGO is not set: latency-bound sizes take the fewest rounds, large ones the ring."""
    op = OpType.of(op)
    if size <= 1:
        return "ring"
    if op == OpType.ALLREDUCE:
        if 0 < nbytes <= ONE_SHOT_BYTES:
            return "oneshot"
        return "hd" if nbytes <= HD_BYTES and size > 2 else "ring"
    if op in (OpType.BROADCAST, OpType.REDUCE) and nbytes <= TREE_BYTES:
        return "tree"
    if op == OpType.BROADCAST and size >= SCATTER_MIN_RANKS:
        return "scatter"
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


class Schedule(list):
    """One rank's steps, shared by every call with the same arguments (never modify it);
    remembers its ``buffer_extents`` and whether it ``reduces``."""

    extents: dict | None = None
    reduces: bool | None = None


def build(op, rank: int, size: int, count: int, itemsize: int, slice_bytes: int, *,
          root: int | None = None, peer: int | None = None, inplace: bool = False,
          algo: str = "ring") -> Schedule:
    """The schedule of collective ``op`` (an OpType or its name) for ``rank`` of ``size``.

    ``count`` is the HCCL call's per-rank count (recv_count for ReduceScatter, send_count for
    AllGather, per-peer count for AllToAll). ``root`` is required for Broadcast/Reduce and
    ``peer`` (comm rank) for Send/Recv. ``algo="auto"`` picks by size (``choose``). Results are
    cached: a repeated call returns the same Schedule (read-only by contract). Raises InvalidArgumentError for
    bad arguments.
    """
    op = OpType.of(op)
    if algo == "auto":
        algo = choose(op, count * itemsize, size)
    return _build(op, rank, size, count, itemsize, slice_bytes, root, peer, bool(inplace), algo)


@functools.lru_cache(maxsize=512)
def _build(op, rank, size, count, itemsize, slice_bytes, root, peer, inplace, algo) -> Schedule:
    return Schedule(algorithms(algo)[op](rank, size, count, itemsize, slice_bytes, root=root,
                                         peer=peer, inplace=inplace))


def reduces(steps) -> bool:
    """True when a Recv of ``steps`` reduces into its region (needs op and dtype); remembered
    by a ``Schedule``."""
    cached = getattr(steps, "reduces", None)
    if cached is not None:
        return cached
    out = any(type(s) is Recv and s.reduce for s in steps)
    if isinstance(steps, Schedule):
        steps.reduces = out
    return out


def buffer_extents(steps) -> dict[str, int]:
    """Bytes each named buffer must hold for ``steps`` (``"none"`` excluded); remembered by a
    ``Schedule`` (do not modify the dict)."""
    cached = getattr(steps, "extents", None)
    if cached is not None:
        return cached
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
    if isinstance(steps, Schedule):
        steps.extents = ext
    return ext
