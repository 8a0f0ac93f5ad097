"""Segments and blocks: a segment is one raw reservation, its blocks tile it in address order.

A block is split when malloc needs less than it holds (``split``) and a freed block merges with
its free neighbours (``merge``); those are the only two places that change the tiling. Which
neighbours may merge, and the free lists and statistics around it, are the allocator's business.
"""
from __future__ import annotations

# Free-list kinds; a segment has exactly one.
SMALL, LARGE_HUGE, LARGE_NORMAL = 0, 1, 2
KIND_POOL = (1, 2, 2)          # statistics pool of each kind: 1 small_pool, 2 large_pool
_KIND_HUGE = (False, True, False)
_POOL_NAMES = ("all", "small_pool", "large_pool")
READY_ONLY = object()          # merge(): a stream no pending block belongs to


class Segment:
    """One raw reservation; its blocks form a doubly linked list from ``head``, in address order."""

    __slots__ = ("addr", "size", "kind", "stream", "head")

    def __init__(self, addr: int, size: int, kind: int, stream):
        self.addr = addr
        self.size = size
        self.kind = kind
        self.stream = stream        # the stream whose malloc reserved it
        self.head = Block(addr, size, self, stream)

    @property
    def huge(self) -> bool:
        return _KIND_HUGE[self.kind]

    @property
    def pool(self) -> str:
        return _POOL_NAMES[KIND_POOL[self.kind]]

    def blocks(self):
        """Yield the segment's blocks in address order."""
        b = self.head
        while b is not None:
            yield b
            b = b.next

    @property
    def allocated(self) -> int:
        """Bytes of the segment's allocated blocks (walks the blocks)."""
        return sum(b.size for b in self.blocks() if b.allocated)

    def __repr__(self):
        return (f"Segment(addr=0x{self.addr:x}, size={self.size}, pool={self.pool}, "
                f"huge={self.huge})")


class Block:
    """A slice of a segment. ``malloc`` returns one; it is the caller's handle until ``free``.

    Fields: ``addr``, ``size`` (bytes of the block, a multiple of 512, at least the rounded
    request), ``requested`` (bytes asked for), ``stream`` (of the last malloc), ``segment``,
    ``site`` (file:line of the malloc), ``huge`` (huge pages), ``pending`` (the marker that must
    complete before another stream may reuse this memory, or None), ``parked`` (a free block
    kept whole in the front cache: no merge absorbs it), ``gen`` (the allocation's
    generation, unique per malloc, 0 when free: ``allocated`` is ``gen != 0``). A freed handle is retired:
    its memory goes on in a free neighbour or a new free block, so the handle keeps its address, size and site for
    error messages and never goes out again; ``until`` keeps the marker its free was given (None:
    nothing was pending), so the runtime can tell work queued before the free from misuse.
    ``reuse`` is what the allocation's user left with the memory at its free, for the next
    malloc of the same stream and size (the torch device's numpy view and CPU tensor of a
    result, runtime/torch/storage.py): the parked block that takes the memory over carries it,
    and it is dropped as soon as the memory merges (a flush, ``empty_cache``, a reset); the
    pool never reads it.
    """

    __slots__ = ("addr", "size", "requested", "stream", "segment", "site", "prev", "next",
                 "pending", "seq", "gen", "parked", "until", "uses", "reuse")

    def __init__(self, addr: int, size: int, segment: Segment, stream=None):
        self.addr = addr
        self.size = size
        self.segment = segment
        self.stream = stream
        self.requested = 0
        self.site = ""
        self.prev: Block | None = None
        self.next: Block | None = None
        self.pending = None         # marker object with .query(), None when ready
        self.seq = 0                # when the marker was attached; the later marker wins a merge
        self.gen = 0                # the allocation's generation; 0 when free
        self.parked = False         # in the front cache: free, but not to be merged
        self.until = None           # a freed handle: the marker its free was given (the work
        #                             of its stream enqueued before the free, which may still use it)
        self.uses = None            # an allocation: other streams that use it (record_stream)
        self.reuse = None           # left by the user for the next malloc of this memory

    @property
    def allocated(self) -> bool:
        return self.gen != 0

    @property
    def huge(self) -> bool:
        return _KIND_HUGE[self.segment.kind]

    @property
    def pool(self) -> str:
        return _POOL_NAMES[KIND_POOL[self.segment.kind]]

    @property
    def end(self) -> int:
        return self.addr + self.size

    @property
    def releasable(self) -> bool:
        """Whether the block spans its whole segment (free, it could go back to the device)."""
        return self.size == self.segment.size

    def __repr__(self):
        state = "allocated" if self.allocated else "free"
        return (f"Block(addr=0x{self.addr:x}, size={self.size}, requested={self.requested}, "
                f"{state}, huge={self.huge}, site={self.site!r})")


def _link(b: Block, p: Block | None, n: Block | None) -> None:
    """Put ``b`` between ``p`` and ``n`` (its neighbours by address) in its segment's list."""
    b.prev, b.next = p, n
    if p is None:
        b.segment.head = b
    else:
        p.next = b
    if n is not None:
        n.prev = b


def split(b: Block, size: int) -> Block:
    """Cut the first ``size`` bytes off the free block ``b`` as a new block (malloc's handle);
    ``b`` keeps the rest, so it must not be listed while this runs.

    Both parts keep ``b``'s stream and marker: memory pending on a stream stays pending.
    """
    h = Block(b.addr, size, b.segment, b.stream)
    h.pending, h.seq = b.pending, b.seq
    _link(h, b.prev, b)
    b.addr += size
    b.size -= size
    return h


def merge(b: Block, stream, free_lists, retire: bool = False) -> tuple[Block, int, int]:
    """Merge the unlisted free block ``b`` with its free neighbours on both sides, as far as
    they qualify, and list the result on ``free_lists``.

    Returns ``(merged block, bytes, count)``: how the non-releasable free memory (free blocks of
    partly used segments: torch's inactive_split) changed, ``b`` not counted as such before.

    A neighbour qualifies when it is free, not parked, and ready or pending on ``stream``
    (``READY_ONLY``: none is); each absorbed neighbour is taken off ``free_lists``. The merged memory keeps ``b``'s stream
    and the latest marker: a later marker of a stream covers that stream's earlier work.
    ``b`` is the merged block, except with ``retire``: ``b`` is then a freed handle that must not
    be handed out again, so a neighbour takes the memory over (a new block when none qualifies)
    and ``b`` is unlinked.
    """
    b.reuse = None                  # the memory merges: what its user left goes
    first = last = b
    nb = b.prev
    while nb is not None and not nb.gen and not nb.parked and (
            nb.pending is None or nb.stream == stream):
        first, nb = nb, nb.prev
    nb = b.next
    while nb is not None and not nb.gen and not nb.parked and (
            nb.pending is None or nb.stream == stream):
        last, nb = nb, nb.next
    if first is last:
        if retire:
            b = replace(b)
        free_lists.insert(b)
        return (b, 0, 0) if b.size == b.segment.size else (b, b.size, 1)
    keep = b if not retire else first if first is not b else b.next
    pending, seq = b.pending, b.seq
    absorbed = count = 0
    x = first
    while True:
        if x is not b:
            free_lists.remove(x)
            absorbed += x.size
            count += 1
            if x.pending is not None and (pending is None or x.seq > seq):
                pending, seq = x.pending, x.seq
        if x is last:
            break
        x = x.next
    keep.pending, keep.seq, keep.stream = pending, seq, b.stream
    end = last.addr + last.size
    keep.addr = first.addr
    keep.size = end - first.addr
    _link(keep, first.prev, last.next)
    if retire:
        b.prev = b.next = b.pending = None
    free_lists.insert(keep)
    if keep.size == keep.segment.size:          # the whole segment is free again
        return keep, -absorbed, -count
    return keep, keep.size - absorbed, 1 - count


def replace(old: Block) -> Block:
    """A new free block in ``old``'s place (same memory, stream, marker and ``reuse``); ``old``
    is unlinked (a freed handle is retired: it never goes out again)."""
    b = Block(old.addr, old.size, old.segment, old.stream)
    b.pending, b.seq, b.reuse = old.pending, old.seq, old.reuse
    _link(b, old.prev, old.next)
    old.prev = old.next = old.pending = old.reuse = None
    return b
