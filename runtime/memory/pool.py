"""The per-device caching allocator: segments from a raw allocator, blocks handed to callers.

Design note
-----------
Layers, as in CuPy and torch's CUDACachingAllocator: ``CachingAllocator`` (this module: the
policy; pure, no device, no threads, the caller serializes calls) -> ``FrontCache`` (parked
blocks, ``front_cache.py``; optional) and ``FreeLists`` (best fit, ``free_lists.py``) ->
*segments* (one ``RawAllocator.reserve`` each) -> *blocks* (slices of a segment, split on malloc
and merged with free neighbours on free: ``blocks.py``), with ``Stat`` records for the
statistics (``stats.py``); argument checks and ``MemMallocPolicy`` are in ``pool_args.py``. The
raw allocator is injected, so the whole policy is tested without a device. Every call completes
before it returns: what a caller observes after a free is the pool with that memory merged back
into the free lists, or parked in the front cache (below).

Sizes. Requests are rounded up to 512 bytes. Requests of at most 1 MiB come from the *small pool*,
whose segments are 2 MiB of normal pages whatever the policy (a huge page per tiny tensor is the
waste the small pool exists to avoid). Larger requests come from the *large pool*; a new large
segment is the request rounded up to 2 MiB (huge pages) under HUGE_FIRST / HUGE_ONLY, or to 4 KiB
(normal pages) under NORMAL_ONLY. HUGE_FIRST falls back to a normal-page segment when the
2 MiB-rounded one does not fit under the limit; HUGE_ONLY never does. Cached huge and normal
blocks are kept apart so each policy only reuses the page kind it accepts (HUGE_FIRST: huge
first, then normal).

Reuse. malloc takes the best fit (smallest, then lowest address) and splits it when the rest is
worth keeping (small pool: at least 512 bytes; large pool: more than 1 MiB, as torch does, so
large blocks are not shredded). free merges the memory with its free neighbours at once.

Streams. ``free(block, ready)`` takes a *marker*: an object whose ``query()`` tells whether the
work the block's stream had enqueued at free time is done (an event recorded there; ``None``
means done now). Until then the block may be reused at once by a malloc on the same stream
(stream order makes that safe) but not by another stream; such *pending* blocks live in a
per-stream list. When a malloc finds no fit, the pool polls the markers, drops the completed ones
and moves those blocks to the shared list. Merging must stay sound: a freed block merges with a
free neighbour that is ready or pending on the freed block's own stream, and the result is
pending on that stream if either part was; never with memory pending on another stream. So a
pending block may sit next to a ready one. A block whose marker completes merges with its ready
neighbours only: merging it into a pending one would lock it away from the other stream that is
waiting for memory. Merged memory keeps the latest marker of its stream, which covers the earlier
ones (so a busy loop on one stream does not pile markers up). A block handed out from pending
memory carries its marker, so freeing it with ``ready=None`` keeps it pending. ``empty_cache``
releases only whole free segments with no pending marker.

Front cache. The runtime's pools (``front_cache=FRONT_CACHE_BLOCKS``; 0, the default here,
turns it off) park up to that many freed small-pool blocks, unmerged, under their stream and
size, for the next malloc of that stream and rounded size (``front_cache.py`` says why). The
rules: only small-pool blocks are parked (they never span their segment, so page kinds never
mix); a full cache lets a free merge as usual; a parked block keeps its stream and marker and
only that stream takes it; no merge absorbs a parked block; the cache is *flushed* (every parked
block merged as its free would have done) before a malloc reserves a segment, and by
``empty_cache``, ``set_memory_fraction`` and ``release_all``. A parked block is free memory in
every statistic and query (``inactive_split``; ``inactive`` with ``parked`` in the snapshot;
counted by ``largest_free_block``). A parked block carries what its user left with the memory
(``Block.reuse``) to the malloc that takes it back; a flush drops it.

Limits. ``reserved`` never exceeds ``limit`` = capacity * fraction. When a new segment does not
fit, the pool releases its cached whole free segments (counted in ``num_alloc_retries``) and
tries again, then raises ``OutOfMemoryError`` with the numbers and the fix. The raw allocator
may refuse a segment too: the runtime's charges the device's card, which other processes share
(runtime/memory/card.py), and its refusal (a ``MemoryError`` with ``holders``) puts the other
processes and their bytes in the message (oom.py builds it). The error is
``card.out_of_memory``'s: also a ``torch.OutOfMemoryError`` once torch is imported.

Shared frees. ``free(block, ready, shared=True)``: the marker covers the work of other streams
too (the runtime's ``record_stream``), so not even the block's own stream may reuse the memory
before it completes; the memory is pending on the marker itself (its key in the free lists, a
stream no malloc has), merges with ready neighbours only and is never parked.

Handles. malloc returns a ``Block``; free retires it (its memory lives on in a free neighbour or
a new free block): no handle is handed out twice, ``allocated`` catches a double free. Every
malloc stamps a new generation (``gen``, 0 once freed), which ``DevicePtr`` checks on every use.

Statistics follow torch.cuda.memory_stats (``Stat{current, peak, allocated, freed}``, flat dotted
keys) and are kept incrementally, O(1) per operation. ``active`` equals ``allocation`` here:
a block freed with a pending marker is already reusable by its stream, so it counts as cached.
``inactive_split`` (non-releasable: free blocks of partly used segments) moves by the net change
of each malloc, free or completed marker, as in torch: its allocated / freed totals count net
moves.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from typing import Protocol

from . import blocks
from .blocks import KIND_POOL, LARGE_HUGE, SMALL, Block, Segment
from ..errors import InvalidParamError, MemoryAccessError, OutOfMemoryError
from .free_lists import FreeLists
from .front_cache import FrontCache
from .oom import oom_error
from .pool_args import (LARGE_KINDS, SMALL_KINDS, KiB, MemMallocPolicy, MiB, check_nbytes,
                        format_size, policy_kinds)
from .stats import (MemoryStats, free_moved, malloc_moved, move, parked_freed, parked_taken,
                    summary_table)

__all__ = ["Block", "CachingAllocator", "MemMallocPolicy", "RawAllocator", "Segment",
           "format_size"]

ROUND = 512                    # every block size is a multiple of this
SMALL_SIZE = 1 * MiB           # largest request served by the small pool
SMALL_SEGMENT = 2 * MiB        # size of every small-pool segment
HUGE_PAGE = 2 * MiB
NORMAL_PAGE = 4 * KiB
LARGE_SPLIT_MIN = 1 * MiB      # a large block is split only if more than this remains
FRONT_CACHE_BLOCKS = 16        # blocks the runtime's pools may park (front_cache.py)
_ADDR_LIMIT = 1 << 64


_HUGE_FIRST = MemMallocPolicy.HUGE_FIRST


class RawAllocator(Protocol):
    """Where segments come from: a device address space (or a fake one in tests)."""

    def reserve(self, nbytes: int) -> int:
        """Return the address of ``nbytes`` fresh bytes; raise MemoryError if there is no room."""

    def release(self, addr: int, nbytes: int) -> None:
        """Give back a range returned by ``reserve`` (same address and size)."""


class CachingAllocator:
    """Caching pool of one device: malloc/free of blocks carved from raw segments.

    ``raw`` supplies segments, ``capacity`` is the device memory in bytes. Not thread-safe: the
    caller serializes calls (one lock per device). See the module design note for the policy.
    """

    __slots__ = ("_raw", "device_id", "_capacity", "_fraction", "_limit", "_lists", "_live",
                 "_seg_addrs", "_segs", "_seq", "_gen", "_raw_error", "_stats", "_kind_stats", "_front",
                 "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")

    def __init__(self, raw: RawAllocator, capacity: int, device_id: int = 0,
                 front_cache: int = 0):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise InvalidParamError(f"CachingAllocator: capacity={capacity!r} must be an int > 0")
        if isinstance(front_cache, bool) or not isinstance(front_cache, int) or front_cache < 0:
            raise InvalidParamError(
                f"CachingAllocator: front_cache={front_cache!r} must be an int >= 0 (blocks)")
        self._raw = raw
        self.device_id = device_id
        self._capacity = capacity
        self._fraction = 1.0
        self._limit = capacity
        self._lists = FreeLists()
        # parked small blocks (see front_cache.py); None: every free merges at once
        self._front = FrontCache(front_cache) if front_cache else None
        self._live: dict[int, Block] = {}       # addr -> allocated block
        self._seg_addrs: list[int] = []         # sorted segment addresses
        self._segs: dict[int, Segment] = {}
        self._seq = 0                           # markers attached so far (Block.seq)
        self._gen = 0                           # the last generation handed out (Block.gen)
        self._raw_error: tuple | None = None    # (segment size, MemoryError) of the last
        #                                         refused reserve, for the OOM
        self._stats = MemoryStats()
        self._kind_stats = tuple(self._stats.blocks[KIND_POOL[k]] for k in range(len(KIND_POOL)))
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.num_device_alloc = 0
        self.num_device_free = 0

    # ------------------------------------------------------------------ properties
    @property
    def capacity(self) -> int:
        """Device memory in bytes."""
        return self._capacity

    @property
    def fraction(self) -> float:
        return self._fraction

    @property
    def limit(self) -> int:
        """The most the pool may reserve: ``int(capacity * fraction)``."""
        return self._limit

    # torch's memory_allocated / memory_reserved and their peaks since reset_peak_stats
    allocated = property(lambda self: self._stats.allocated_bytes[0].current,
                         doc="Bytes in allocated blocks.")
    reserved = property(lambda self: self._stats.reserved_bytes[0].current,
                        doc="Bytes in segments.")
    max_allocated = property(lambda self: self._stats.allocated_bytes[0].peak,
                             doc="Peak of ``allocated`` since the last ``reset_peak_stats``.")
    max_reserved = property(lambda self: self._stats.reserved_bytes[0].peak,
                            doc="Peak of ``reserved`` since the last ``reset_peak_stats``.")

    def largest_free_block(self) -> int:
        """Size of the largest cached free block (ready, pending or parked), 0 if none."""
        if self._front is None:
            return self._lists.largest()
        return max(self._lists.largest(), self._front.largest())

    # ------------------------------------------------------------------ malloc / free
    def malloc(self, nbytes: int, stream, policy=MemMallocPolicy.HUGE_FIRST,
               site: str = "") -> Block:
        """Return a block of at least ``nbytes`` bytes for use on ``stream``.

        ``stream`` is any hashable object; ``site`` (file:line) is kept for leak reports and
        errors. Raises InvalidParamError for a bad size, policy or stream (nothing changed) and
        OutOfMemoryError when the limit or the address space leaves no room.
        """
        front = self._front
        if front is not None and type(nbytes) is int and 0 < nbytes <= SMALL_SIZE and \
                policy is _HUGE_FIRST:
            # the common case: a block this stream parked, of the same rounded size, its
            # statistics moved in one step (parked_taken: _hand_out's malloc_moved for it)
            try:
                b = front.take(stream, (nbytes + ROUND - 1) // ROUND * ROUND)
            except TypeError:                        # an unhashable stream: named below
                b = None
            if b is not None:
                self._own(b, nbytes, stream, site)
                parked_taken(self._kind_stats[SMALL], b.size, nbytes)
                return b
            front = None                             # asked already: not again below
        if type(nbytes) is not int or nbytes <= 0:
            nbytes = check_nbytes(nbytes)
        if policy is _HUGE_FIRST:                    # the default: no enum hash (a Python call)
            kinds = LARGE_KINDS[_HUGE_FIRST]
        else:
            kinds = policy_kinds(policy)
        try:
            hash(stream)
        except TypeError:
            raise InvalidParamError(f"malloc: stream={stream!r} must be hashable") from None
        size = (nbytes + ROUND - 1) // ROUND * ROUND
        if size <= SMALL_SIZE:
            kinds = SMALL_KINDS
            if front is not None:                    # a block this stream parked, same size
                b = front.take(stream, size)
                if b is not None:                    # it was non-releasable (never a whole
                    return self._hand_out(b, nbytes, stream, site, -size, -1)   # segment)
        b = self._lists.take(size, stream, kinds)
        if b is None:
            b = self._grow(size, nbytes, stream, kinds, policy)
        seg = b.segment
        whole = b.size == seg.size
        rest = b.size - size
        # how the non-releasable free memory (inactive_split) changes, by the net change
        if rest > LARGE_SPLIT_MIN or (rest and seg.kind == SMALL):
            if whole:                                # a whole segment got split: rest inactive
                idle = rest, 1
            else:                                    # an inactive block shrank
                idle = -size, 0
            h = blocks.split(b, size)
            self._lists.insert(b)
            b = h
        elif whole:
            idle = 0, 0
        else:                                        # an inactive block, taken whole
            idle = -b.size, -1
        return self._hand_out(b, nbytes, stream, site, *idle)

    def _hand_out(self, b: Block, nbytes: int, stream, site: str, idle_bytes: int,
                  idle_count: int) -> Block:
        """Make the unlisted free block ``b`` an allocation of ``nbytes`` on ``stream``, with a
        new generation; the non-releasable free memory changed by ``idle_bytes`` / ``idle_count``."""
        self._own(b, nbytes, stream, site)
        malloc_moved(self._kind_stats[b.segment.kind], b.size, nbytes, idle_bytes, idle_count)
        return b

    def _own(self, b: Block, nbytes: int, stream, site: str) -> None:
        """Make ``b`` the live allocation of ``nbytes`` on ``stream`` with a new generation."""
        b.requested = nbytes
        b.stream = stream
        b.site = site
        self._gen = b.gen = self._gen + 1
        self._live[b.addr] = b

    def free(self, block: Block, ready=None, gen: int | None = None,
             shared: bool = False) -> None:
        """Return ``block`` to the pool.

        ``ready`` is None (the block's memory is idle now) or a marker with ``query() -> bool``
        that turns True once the work enqueued on ``block.stream`` before this free is done;
        until then only that stream may reuse the memory. With ``shared`` the marker also
        covers other streams' work (torch's record_stream): no stream may reuse the memory
        before it completes (the memory is pending on the marker itself, a key no malloc's
        stream matches). ``gen``, the ``block.gen`` that malloc handed out, is checked when given.
        Raises MemoryAccessError for a double free or a block of another pool,
        InvalidParamError for a bad argument (nothing changed).
        """
        if type(block) is not Block or self._live.get(block.addr) is not block or (
                gen is not None and gen != block.gen):
            raise self._bad_free(block, gen)
        if ready is not None and not hasattr(ready, "query"):
            raise InvalidParamError(
                f"free: ready={ready!r} must be None or have a query() method (an event)")
        del self._live[block.addr]
        block.gen = 0
        block.until = ready                          # the retired handle remembers its free
        if ready is not None:
            self._seq += 1
            block.pending, block.seq = ready, self._seq
            if shared:
                block.stream = ready
        seg = block.segment
        front = self._front
        # the handle is retired: its memory goes on in a new parked block, or in a neighbour
        # or a new free block
        if front is not None and seg.kind == SMALL and front.count < front.limit and not (
                shared and ready is not None):
            front.park(blocks.replace(block))
            # a small block never spans its segment: parked, it is non-releasable free memory
            parked_freed(self._kind_stats[SMALL], block.size, block.requested)
            return
        _, nbytes, count = blocks.merge(block, block.stream, self._lists, True)
        free_moved(self._kind_stats[seg.kind], block.size, block.requested, nbytes, count)

    def _bad_free(self, block, gen=None) -> Exception:
        if not isinstance(block, Block):
            return InvalidParamError(
                f"free: expected a Block returned by malloc, got {type(block).__name__} {block!r}")
        where = block.site or "an unknown site"
        if not block.allocated or (gen is not None and gen != block.gen):
            return MemoryAccessError(
                f"free: the block at 0x{block.addr:x} ({block.requested} bytes) was already "
                f"freed (double free); it was allocated at {where}. Free each allocation once.")
        return MemoryAccessError(
            f"free: the block at 0x{block.addr:x} ({block.requested} bytes, allocated at {where}) "
            f"does not belong to the pool of device {self.device_id}; free it on its own device.")

    # ------------------------------------------------------------------ growth and release
    def _grow(self, size: int, nbytes: int, stream, kinds, policy) -> Block:
        """No cached fit: poll markers, reserve a segment, flush the cache and retry, or OOM."""
        self._raw_error = None
        if self._front is not None and self._front.count:
            self._flush_front()
            b = self._lists.take(size, stream, kinds)
            if b is not None:
                return b
        if self._lists.n_pending and self._poll():
            b = self._lists.take(size, stream, kinds)
            if b is not None:
                return b
        b = self._new_segment(size, stream, kinds)
        if b is not None:
            return b
        self.num_alloc_retries += 1
        self._release_cached()
        b = self._new_segment(size, stream, kinds)
        if b is not None:
            return b
        self.num_ooms += 1
        raise self._oom(size, nbytes, kinds, policy)

    def _new_segment(self, size: int, stream, kinds) -> Block | None:
        """Reserve a segment for ``size`` bytes (first kind that fits); its single free block."""
        for kind in kinds:
            if kind == SMALL:
                seg_size = SMALL_SEGMENT
            else:
                page = HUGE_PAGE if kind == LARGE_HUGE else NORMAL_PAGE
                seg_size = -(-size // page) * page
            if self.reserved + seg_size > self._limit:
                continue
            try:
                addr = self._raw.reserve(seg_size)
            except MemoryError as e:                 # address space full: a failed cudaMalloc
                self._raw_error = (seg_size, e)   # the card full (card.py), or no range
                continue
            if not 0 <= addr <= _ADDR_LIMIT - 1 - seg_size:
                raise ValueError(f"raw allocator returned address {addr!r} outside 0..2**64")
            seg = Segment(addr, seg_size, kind, stream)
            insort(self._seg_addrs, addr)
            self._segs[addr] = seg
            self.num_device_alloc += 1
            move(self._stats.segments[KIND_POOL[kind]], (seg_size, 1))
            return seg.head
        return None

    def _poll(self) -> int:
        """Drop completed markers; their blocks become usable by every stream. Returns a count."""
        done: dict[int, bool] = {}
        promoted = []
        for b in self._lists.pending():
            m = b.pending
            ok = done.get(id(m))
            if ok is None:
                ok = done[id(m)] = bool(m.query())
            if ok:
                promoted.append(b)
        for b in promoted:
            self._make_ready(b)
        return len(promoted)

    def _make_ready(self, b: Block) -> None:
        """Drop the pending free block ``b``'s marker; merge it with its ready free neighbours.

        A pending neighbour is left alone: merging would lock ready memory to its stream.
        """
        self._lists.remove(b)
        b.pending = None
        was = (0, 0) if b.size == b.segment.size else (b.size, 1)
        b, nbytes, count = blocks.merge(b, blocks.READY_ONLY, self._lists)
        move(self._kind_stats[b.segment.kind], (0, 0, 0, nbytes - was[0], count - was[1]))

    def _flush_front(self) -> None:
        """Merge every parked block into the free lists, as its free would have done."""
        for b in self._front.drain():
            b.parked = False                         # the rest stay parked until their turn
            size = b.size                            # counted as non-releasable: never a whole
            _, nbytes, count = blocks.merge(b, b.stream, self._lists)    # segment (small)
            move(self._kind_stats[SMALL], (0, 0, 0, nbytes - size, count - 1))

    def _release_cached(self) -> int:
        """Release every whole free segment without a pending marker; return the bytes freed."""
        if self._front is not None and self._front.count:
            self._flush_front()
        if self._lists.n_pending:
            self._poll()
        return sum(self._release_segment(b) for b in self._lists.whole_segments())

    def _releasable(self) -> int:
        """Bytes ``_release_cached`` would give back now (after flushing the front cache and
        polling markers)."""
        if self._front is not None and self._front.count:
            self._flush_front()
        if self._lists.n_pending:
            self._poll()
        return sum(b.size for b in self._lists.whole_segments())

    def _release_segment(self, b: Block) -> int:
        """Give the whole-segment free block ``b``'s segment back to the raw allocator."""
        seg = b.segment
        self._lists.remove(b)                        # a whole segment is never non-releasable
        del self._segs[seg.addr]
        del self._seg_addrs[bisect_left(self._seg_addrs, seg.addr)]
        seg.head = None
        self._raw.release(seg.addr, seg.size)
        self.num_device_free += 1
        move(self._stats.segments[KIND_POOL[seg.kind]], (-seg.size, -1))
        return seg.size

    def empty_cache(self) -> None:
        """Release every whole free segment whose markers have completed (torch empty_cache)."""
        self._release_cached()

    def release_all(self) -> list[Block]:
        """Free every live block, drop every marker and release every segment (reset_device).

        Call only once the device is idle. Returns the blocks that were still allocated (the
        leaks), in address order; their handles are retired like freed ones.
        """
        leaks = self.live_blocks()
        for b in leaks:
            self.free(b)
        if self._front is not None:
            self._flush_front()
        for b in self._lists.pending():
            self._make_ready(b)
        self._release_cached()
        return leaks

    def set_memory_fraction(self, fraction: float) -> None:
        """Limit the pool to ``capacity * fraction`` bytes (torch set_per_process_memory_fraction).

        ``0 < fraction <= 1``. Lowering the limit below what is reserved releases cached
        segments; if what cannot be released still exceeds the new limit, raises
        InvalidParamError and changes nothing (so ``reserved <= limit`` always holds).
        """
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (
                math.isfinite(fraction) and 0 < fraction <= 1):
            raise InvalidParamError(f"set_memory_fraction: fraction={fraction!r} must be a "
                                    f"number with 0 < fraction <= 1")
        limit = int(self._capacity * fraction)
        if self.reserved > limit:
            keep = self.reserved - self._releasable()
            if keep > limit:
                raise InvalidParamError(
                    f"set_memory_fraction: fraction={fraction} would limit device "
                    f"{self.device_id} to {format_size(limit)}, but {format_size(keep)} of the "
                    f"{format_size(self.reserved)} reserved cannot be released (segments with "
                    f"live allocations or unfinished stream work); free memory first or use a "
                    f"fraction >= {keep / self._capacity:.3f}")
            self._fraction = float(fraction)
            self._limit = limit
            self._release_cached()
        else:
            self._fraction = float(fraction)
            self._limit = limit

    def _oom(self, size: int, nbytes: int, kinds, policy) -> OutOfMemoryError:
        hint = ""
        if kinds == (LARGE_HUGE,) and size > SMALL_SIZE:
            hint = (f"; policy HUGE_ONLY needs a {format_size(-(-size // HUGE_PAGE) * HUGE_PAGE)} "
                    f"huge-page segment, HUGE_FIRST could fall back to normal pages")
        return oom_error(self.device_id, size, nbytes, policy, capacity=self._capacity,
                         allocated=self.allocated, reserved=self.reserved, limit=self._limit,
                         largest=self.largest_free_block(), raw_error=self._raw_error,
                         raw=self._raw, hint=hint)

    # ------------------------------------------------------------------ queries
    def find(self, addr: int) -> Block | None:
        """The allocated block containing ``addr`` (start or interior), or None."""
        b = self._live.get(addr)
        if b is not None:
            return b
        i = bisect_right(self._seg_addrs, addr) - 1
        if i < 0:
            return None
        seg = self._segs[self._seg_addrs[i]]
        if addr >= seg.addr + seg.size:
            return None
        b = seg.head
        while b is not None and b.addr + b.size <= addr:
            b = b.next
        return b if b is not None and b.allocated else None

    def live_blocks(self) -> list[Block]:
        """Every allocated block, in address order (the leak report of reset_device)."""
        return [self._live[a] for a in sorted(self._live)]

    def segments(self) -> list[Segment]:
        """Every segment, in address order."""
        return [self._segs[a] for a in self._seg_addrs]

    def snapshot(self) -> list[dict]:
        """One dict per segment, in address order (torch memory_snapshot)."""
        out = []
        for seg in self.segments():
            rows = []
            for b in seg.blocks():
                rows.append({
                    "address": b.addr,
                    "size": b.size,
                    "requested_size": b.requested if b.allocated else 0,
                    "state": "active_allocated" if b.allocated else "inactive",
                    "site": b.site if b.allocated else "",
                    "stream": b.stream if b.allocated or b.pending is not None else None,
                    "pending": b.pending is not None and not b.allocated,
                    "parked": b.parked,
                })
            out.append({
                "device": self.device_id,
                "address": seg.addr,
                "total_size": seg.size,
                "allocated_size": sum(b["size"] for b in rows if b["state"] != "inactive"),
                "requested_size": sum(b["requested_size"] for b in rows),
                "stream": seg.stream,
                "segment_type": "small" if seg.kind == SMALL else "large",
                "huge": seg.huge,
                "blocks": rows,
            })
        return out

    # ------------------------------------------------------------------ statistics
    def stats(self) -> dict:
        """torch.npu.memory_stats(): flat dotted keys, sorted (``allocated_bytes.all.current``)."""
        out = self._stats.as_dict()
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        return dict(sorted(out.items()))

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value (torch reset_peak_memory_stats)."""
        self._stats.reset_peak()

    def reset_accumulated_stats(self) -> None:
        """Zero the allocated / freed totals and the retry / OOM counters."""
        self._stats.reset_accumulated()
        self.num_alloc_retries = self.num_ooms = 0
        self.num_device_alloc = self.num_device_free = 0

    def summary(self, abbreviated: bool = False) -> str:
        """A torch.cuda.memory_summary()-style table of the statistics."""
        header = [
            " {:^76} ".format(f"npusim NPU memory summary, device ID {self.device_id}"),
            "-" * 78,
            " {:^37}|{:^38} ".format(f"NPU OOMs: {self.num_ooms}",
                                     f"device malloc retries: {self.num_alloc_retries}"),
            " {:^37}|{:^38} ".format(
                f"capacity: {format_size(self._capacity)}",
                f"limit: {format_size(self._limit)} (fraction {self._fraction:g})"),
        ]
        return summary_table(self.stats(), header, abbreviated)

    def __repr__(self):
        return (f"CachingAllocator(device={self.device_id}, "
                f"allocated={format_size(self.allocated)}, reserved={format_size(self.reserved)}, "
                f"limit={format_size(self._limit)})")
