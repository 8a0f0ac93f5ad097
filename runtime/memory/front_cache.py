"""The pool's front cache: recently freed small blocks, kept whole for the next malloc of the
same stream and size.

A freed block normally merges with its free neighbours at once, and the next malloc of the same
size splits it off again. A loop that allocates and frees the same sizes on one stream (the
common case: a training step) pays that split and merge every time. The front cache lets such a
free *park* the block instead, unmerged, and a malloc of the same stream and rounded size take
it back first. It is a plain container: the allocator decides what is parked, keeps the
statistics, and *flushes* the cache (merges every parked block back into the free lists) before
anything that must see all free memory: a malloc that finds no fit, ``empty_cache``, a new
memory fraction, ``reset_device``.

A parked block is free memory: not allocated in any statistic, ``inactive`` in the snapshot
(with ``parked`` set). It keeps the stream and the marker of its free, and only a malloc on that
same stream takes it, so stream order keeps the reuse safe even while the marker is pending.
"""
from __future__ import annotations

from .blocks import Block


class FrontCache:
    """At most ``limit`` parked blocks, by ``(stream, size)``; the last one parked goes out first.

    ``parked``: ``(stream, size)`` -> a non-empty list of blocks (tests read it)."""

    __slots__ = ("parked", "count", "limit")

    def __init__(self, limit: int):
        self.parked: dict[tuple, list[Block]] = {}
        self.count = 0
        self.limit = limit

    def park(self, b: Block) -> None:
        """Keep the free block ``b`` for its stream; the caller checks ``count < limit`` first."""
        key = (b.stream, b.size)
        lst = self.parked.get(key)
        if lst is None:
            self.parked[key] = [b]
        else:
            lst.append(b)
        b.parked = True
        self.count += 1

    def take(self, stream, size: int) -> Block | None:
        """Remove and return a block parked by ``stream`` of exactly ``size`` bytes, or None."""
        key = (stream, size)
        lst = self.parked.get(key)
        if lst is None:
            return None
        b = lst.pop()
        if not lst:
            del self.parked[key]
        b.parked = False
        self.count -= 1
        return b

    def drain(self) -> list[Block]:
        """Remove and return every parked block (still marked ``parked``: the caller merges them
        one by one, and a block still waiting its turn must not be absorbed by another's merge)."""
        out = [b for lst in self.parked.values() for b in lst]
        self.parked.clear()
        self.count = 0
        return out

    def largest(self) -> int:
        """Size of the largest parked block, 0 if none."""
        return max((size for _, size in self.parked), default=0)
