"""Rooted collectives as pure schedules: Broadcast and Reduce by chain, binomial tree, or
scatter + AllGather (hccl/algo/schedule.py picks one by size and world; hccl/algo/steps.py
has the steps).

A chain pipelines slices root -> root+1 -> ... (n-1 + slices-1 slice times: best for large
buffers on few ranks); a binomial tree takes ceil(log2 n) hops (best for small buffers); scatter
+ AllGather makes the root send (n-1)/n S instead of S per child. Reductions happen in one fixed
order per slice, so Reduce's result is the same whichever rank computes it.
"""
from __future__ import annotations

from hccl.algo.steps import (RECV, SCRATCH, SEND, Layout, Recv, Send, add_copy, check_args,
                             check_rank, pieces, ring_gather, split)


def _start(rank, size, count, itemsize, slice_bytes, root, *, reduce: bool) -> list:
    """Check the arguments; the steps every rooted schedule starts with (for Reduce, the root
    copies its own contribution to ``recv`` first). On one rank the chain and tree loops below
    produce nothing more, so only the schedules that would message themselves test size 1."""
    check_args(rank, size, count, itemsize, slice_bytes)
    check_rank("root", root, size)
    steps: list = []
    if reduce and rank == root:
        add_copy(steps, SEND, 0, RECV, 0, count * itemsize)
    return steps


def chain_broadcast(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                    inplace=False, solo_bytes=0) -> list:
    """Pipelined chain root -> root+1 -> ... -> root-1 on ``recv``: n-1+slices-1 slice times."""
    steps = _start(rank, size, count, itemsize, slice_bytes, root, reduce=False)
    pos = (rank - root) % size
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    for k, (off, nb) in enumerate(pieces(0, count, itemsize, slice_bytes)):
        if pos > 0:
            steps.append(Recv(prv, RECV, off, nb, k))
        if pos < size - 1:
            steps.append(Send(nxt, RECV, off, nb, k))
    return steps


def mesh_broadcast(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                   inplace=False, solo_bytes=0) -> list:
    """The root sends every slice to every other rank directly: one hop. Inside a node a
    receiver reads the root's memory in place, so the root copies nothing and the n-1 reads run
    at once (HCCL's fullmesh); across nodes the root's link carries (n-1) S."""
    steps = _start(rank, size, count, itemsize, slice_bytes, root, reduce=False)
    parts = pieces(0, count, itemsize, slice_bytes)
    for k, (off, nb) in enumerate(parts):
        if rank == root:
            for i in range(1, size):             # staggered, as the one-shot AllReduce
                steps.append(Send((root + i) % size, RECV, off, nb, k))
        else:
            steps.append(Recv(root, RECV, off, nb, k))
    return steps


def chain_reduce(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                 inplace=False, solo_bytes=0) -> list:
    """Pipelined chain root+1 -> root+2 -> ... -> root, reducing on the way.

    Intermediate ranks accumulate in two scratch slots of one slice each (slice k uses slot
    k % 2); only the root writes ``recv``.
    """
    steps = _start(rank, size, count, itemsize, slice_bytes, root, reduce=True)
    if size == 1:
        return steps
    pos = (rank - root - 1) % size          # 0 = head of the chain, size-1 = root
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    parts = pieces(0, count, itemsize, slice_bytes)
    slot = parts[0][1]
    for k, (off, nb) in enumerate(parts):
        if pos == 0:
            steps.append(Send(nxt, SEND, off, nb, k))
        elif rank == root:
            steps.append(Recv(prv, RECV, off, nb, k, True))
        else:
            acc = (k % 2) * slot
            add_copy(steps, SEND, off, SCRATCH, acc, nb)
            steps.append(Recv(prv, SCRATCH, acc, nb, k, True))
            steps.append(Send(nxt, SCRATCH, acc, nb, k))
    return steps


def scatter_all_gather_broadcast(rank, size, count, itemsize, slice_bytes, *, root=0,
                                 peer=None, inplace=False, solo_bytes=0) -> list:
    """Broadcast as a scatter (the root sends chunk c to rank c) then a ring AllGather of the
    chunks on ``recv``: the root sends (n-1)/n S instead of S, and every link carries S/n at a
    time, so large buffers finish in about 2 S/n per link time instead of one rank's S."""
    steps = _start(rank, size, count, itemsize, slice_bytes, root, reduce=False)
    if size == 1:
        return steps
    lay = Layout(split(count, size), itemsize, slice_bytes)
    if rank == root:
        for c in range(1, size):
            dst = (root + c) % size
            for k, (off, nb) in enumerate(lay.slices[dst]):
                steps.append(Send(dst, RECV, off, nb, lay.tag(0, k)))
    else:
        for k, (off, nb) in enumerate(lay.slices[rank]):
            steps.append(Recv(root, RECV, off, nb, lay.tag(0, k)))
    ring_gather(steps, rank, size, lay, first=1)
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
                   inplace=False, solo_bytes=0) -> list:
    """Pipelined binomial-tree Broadcast on ``recv``: ceil(log2 n) hops."""
    steps = _start(rank, size, count, itemsize, slice_bytes, root, reduce=False)
    parent, children = _binomial((rank - root) % size, size)
    real = lambda v: (v + root) % size  # noqa: E731
    for k, (off, nb) in enumerate(pieces(0, count, itemsize, slice_bytes)):
        if parent is not None:
            steps.append(Recv(real(parent), RECV, off, nb, k))
        for child in children:
            steps.append(Send(real(child), RECV, off, nb, k))
    return steps


def tree_reduce(rank, size, count, itemsize, slice_bytes, *, root=0, peer=None,
                inplace=False, solo_bytes=0) -> list:
    """Pipelined binomial-tree Reduce: children (smallest subtree first) reduce into a parent."""
    steps = _start(rank, size, count, itemsize, slice_bytes, root, reduce=True)
    parent, children = _binomial((rank - root) % size, size)
    real = lambda v: (v + root) % size  # noqa: E731
    parts = pieces(0, count, itemsize, slice_bytes)
    slot = parts[0][1]
    for k, (off, nb) in enumerate(parts):
        if parent is None:
            buf, at = RECV, off
        elif not children:
            steps.append(Send(real(parent), SEND, off, nb, k))
            continue
        else:
            buf, at = SCRATCH, (k % 2) * slot
            add_copy(steps, SEND, off, buf, at, nb)
        for child in reversed(children):
            steps.append(Recv(real(child), buf, at, nb, k, True))
        if parent is not None:
            steps.append(Send(real(parent), buf, at, nb, k))
    return steps
