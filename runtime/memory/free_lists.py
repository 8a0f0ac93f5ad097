"""Free lists of the caching allocator: best fit by ``(size, addr)``, per kind and per stream.

Each kind (small, large huge-page, large normal-page) has one list of *ready* free blocks, usable
by every stream, and one list per stream of *pending* free blocks, which only that stream may
reuse until their marker completes. A list holds sorted int keys ``size << 64 | addr`` and a dict
maps a key to its block, so best fit is one ``bisect`` and no scan over blocks.
"""
from __future__ import annotations

from bisect import bisect_left, insort

from .blocks import Block

ADDR_BITS = 64


class FreeLists:
    """The free blocks of one allocator. A block must not change size or address while listed."""

    __slots__ = ("_ready", "_pending", "_blocks", "n_pending")

    def __init__(self, kinds: int = 3):
        self._ready: list[list[int]] = [[] for _ in range(kinds)]
        self._pending: list[dict] = [{} for _ in range(kinds)]   # kind -> {stream: keys}
        self._blocks: dict[int, Block] = {}
        self.n_pending = 0

    def insert(self, b: Block) -> None:
        """List the free block ``b`` (ready, or pending on ``b.stream``)."""
        key = (b.size << ADDR_BITS) | b.addr
        if b.pending is None:
            insort(self._ready[b.segment.kind], key)
        else:
            lists = self._pending[b.segment.kind]
            lst = lists.get(b.stream)
            if lst is None:
                lists[b.stream] = [key]
            else:
                insort(lst, key)
            self.n_pending += 1
        self._blocks[key] = b

    def remove(self, b: Block) -> None:
        """Take the listed block ``b`` off its list."""
        key = (b.size << ADDR_BITS) | b.addr
        if b.pending is None:
            lst = self._ready[b.segment.kind]
            del lst[bisect_left(lst, key)]
        else:
            lists = self._pending[b.segment.kind]
            lst = lists[b.stream]
            del lst[bisect_left(lst, key)]
            if not lst:
                del lists[b.stream]
            self.n_pending -= 1
        del self._blocks[key]

    def take(self, size: int, stream, kinds) -> Block | None:
        """Remove and return the best free block of at least ``size`` bytes for ``stream``.

        Earlier kinds win (huge before normal pages); within a kind, the smallest key among the
        ready blocks and the stream's own pending blocks. None when nothing fits.
        """
        key = size << ADDR_BITS
        for kind in kinds:
            ready = self._ready[kind]
            i = bisect_left(ready, key)
            own = self._pending[kind].get(stream)
            if own is not None:
                j = bisect_left(own, key)
                if j < len(own) and (i == len(ready) or own[j] < ready[i]):
                    b = self._blocks.pop(own.pop(j))
                    if not own:
                        del self._pending[kind][stream]
                    self.n_pending -= 1
                    return b
            if i < len(ready):
                return self._blocks.pop(ready.pop(i))
        return None

    def largest(self) -> int:
        """Size of the largest listed block (ready or pending), 0 if none."""
        best = 0
        for kind, lst in enumerate(self._ready):
            if lst:
                best = max(best, lst[-1] >> ADDR_BITS)
            for own in self._pending[kind].values():
                best = max(best, own[-1] >> ADDR_BITS)
        return best

    def pending(self) -> list[Block]:
        """Every pending block: by kind, then stream (in the order they got their first list)."""
        return [self._blocks[k] for lists in self._pending for lst in lists.values() for k in lst]

    def whole_segments(self) -> list[Block]:
        """The ready blocks that span their whole segment: what could go back to the device."""
        return [self._blocks[k] for lst in self._ready for k in lst
                if self._blocks[k].releasable]
