"""The vocabulary of schedules: the four steps, the named buffers, and how a buffer is cut.

A schedule (hccl/algo/schedule.py builds them) is a list of these steps for ONE rank. Offsets and
sizes are bytes; buffers are named: ``"send"`` and ``"recv"`` (the user's), ``"scratch"``
(staging the executor allocates) and ``"none"`` (zero-byte messages).

Chunks and slices: ``split`` cuts ``count`` elements into chunks that differ by at most one
element; a ``Layout`` cuts each chunk into slices of at most ``slice_bytes`` (HCCL_BUFFSIZE), one
message each. An empty chunk still has one zero-byte slice, so every rank exchanges a message
(and its fingerprint) with its peers whatever the count. ``Layout.tag`` numbers messages
``step * width + slice`` with ``width`` the most slices any chunk has: unique per (collective,
peer, direction) and computed identically by sender and receiver.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

from hccl.errors import InvalidArgumentError

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
    """Wait for tag ``step`` from ``peer``; reduce it into (``reduce``) or copy it to the region.

    With ``src`` (a buffer name), a reducing Recv writes ``src``'s bytes at the same offset,
    reduced with the payload, into the region (``region = src op payload``): the region's first
    write, so AllReduce needs no copy of send into recv first. When ``src`` is the same memory as
    ``buf`` (in place) that is the plain reduce. ``payload_first`` swaps the operands
    (``region = payload op src``): a rank after the sender in the reduction order writes the
    same bytes as the sender's ``src op payload`` in one pass.
    """

    peer: int
    buf: str
    offset: int
    nbytes: int
    step: int
    reduce: bool = False
    src: str = ""
    payload_first: bool = False


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


class Layout:
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


def check_args(rank: int, size: int, count: int, itemsize: int, slice_bytes: int) -> None:
    """Raise InvalidArgumentError unless the arguments every builder takes make sense."""
    if size < 1:
        raise InvalidArgumentError(f"world size must be >= 1, got {size}")
    if not 0 <= rank < size:
        raise InvalidArgumentError(f"rank {rank} is out of range for size {size}")
    if count < 0:
        raise InvalidArgumentError(f"count must be >= 0, got {count}")
    if itemsize < 1 or slice_bytes < 1:
        raise InvalidArgumentError(
            f"itemsize ({itemsize}) and slice_bytes ({slice_bytes}) must be positive")


def check_rank(name: str, value, size: int, rank: int | None = None) -> int:
    """``value`` (a root or peer called ``name``) if it is a rank of ``size`` other than ``rank``."""
    if value is None or not 0 <= value < size:
        raise InvalidArgumentError(f"{name} {value} is out of range for a communicator of {size}")
    if rank is not None and value == rank:
        raise InvalidArgumentError(f"{name} {value} is this rank itself; pick another rank")
    return value


def add_copy(steps: list, src: str, src_off: int, dst: str, dst_off: int, nbytes: int) -> None:
    """Append a Copy of ``nbytes`` (nothing for zero bytes)."""
    if nbytes:
        steps.append(Copy(src, src_off, dst, dst_off, nbytes))


def pieces(first: int, n: int, itemsize: int, slice_bytes: int) -> list[tuple[int, int]]:
    """Byte (offset, length) slices of elements [first, first+n); one empty piece if n is 0."""
    return Layout([(first, n)], itemsize, slice_bytes).slices[0]


def ring_gather(steps: list, rank: int, size: int, lay: Layout, first: int,
                from_send: bool = False) -> None:
    """Append a ring AllGather of ``lay``'s chunks on ``recv``: rank r starts with chunk r, sends
    it to r+1 and passes each chunk it receives on, n-1 ring steps tagged from ``first``.

    ``from_send``: chunk r is still in ``send`` (at 0): the first sends read it there, and its
    copy into ``recv`` follows them, so the next rank reads it while this one copies."""
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    start = lay.slices[rank][0][0]
    for k, (off, nb) in enumerate(lay.slices[rank]):
        buf, at = (SEND, off - start) if from_send else (RECV, off)
        steps.append(Send(nxt, buf, at, nb, lay.tag(first, k)))
    if from_send:
        end = lay.slices[rank][-1][0] + lay.slices[rank][-1][1]
        add_copy(steps, SEND, 0, RECV, start, end - start)
    for t in range(size - 1):
        c = (rank - t - 1) % size
        for k, (off, nb) in enumerate(lay.slices[c]):
            steps.append(Recv(prv, RECV, off, nb, lay.tag(first + t, k)))
            if t < size - 2:
                steps.append(Send(nxt, RECV, off, nb, lay.tag(first + t + 1, k)))
