"""The per-device caching allocator: segments from a raw allocator, blocks handed to callers.

Design note
-----------
Layers, as in CuPy and torch's CUDACachingAllocator: ``CachingAllocator`` (this module, pure: no
device, no threads; the caller serializes calls, queries included: see *Held frees*) -> *segments*
(one ``RawAllocator.reserve`` each)
-> *blocks* (slices of a segment, split on malloc and merged with free neighbours on free). The
raw allocator is injected, so the whole policy is tested without a device.

Sizes. Requests are rounded up to 512 bytes. Requests of at most 1 MiB come from the *small pool*,
whose segments are 2 MiB of normal pages whatever the policy (a huge page per tiny tensor is the
waste the small pool exists to avoid). Larger requests come from the *large pool*; a new large
segment is the request rounded up to 2 MiB (huge pages) under HUGE_FIRST / HUGE_ONLY, or to 4 KiB
(normal pages) under NORMAL_ONLY. HUGE_FIRST falls back to a normal-page segment when the
2 MiB-rounded one does not fit under the limit; HUGE_ONLY never does. Cached huge and normal
blocks are kept apart so each policy only reuses the page kind it accepts (HUGE_FIRST: huge
first, then normal).

Reuse. Free blocks sit in lists sorted by ``(size, addr)`` (one int key, ``size << 64 | addr``; a
dict maps the key to the block), so best fit is one ``bisect``, with no scan over blocks. A block
is split when the rest is worth keeping (small pool: at least 512 bytes; large pool: more than 1
MiB, as torch does, so large blocks are not shredded) and merged with its free neighbours when
freed (see *Held frees* for when that happens). ``find`` of an interior address bisects the
segments, then walks that segment's blocks.

Streams. ``free(block, ready)`` takes a *marker*: an object whose ``query()`` tells whether the
work the block's stream had enqueued at free time is done (an event recorded there; ``None``
means done now). Until then the block may be reused at once by a malloc on the same stream
(stream order makes that safe) but not by another stream; such *pending* blocks live in a
per-stream list. When a malloc finds no fit, the pool polls the markers, drops the completed ones
and moves those blocks to the shared list. Merging must stay sound: a freed block merges with a
free neighbour that is ready or pending on the freed block's own stream, and the result is
pending on that stream if either part was; never with memory pending on another stream. So a
pending block may sit next to a ready one, and a free keeps merging while neighbours qualify.
A block whose marker completes merges with its ready neighbours only: merging it into a pending
one would lock it away from the other stream that is waiting for memory.
Merging keeps the union of the markers; since a marker covers all the work of its stream up to
its free, the later marker of a stream implies the earlier ones, so a block keeps just the latest
(this keeps a busy loop on one stream from piling up markers). A block handed out from pending
memory carries its marker, so freeing it with ``ready=None`` keeps it pending. ``empty_cache``
releases only whole free segments with no pending marker.

Held frees (the fast path of a cached malloc + free). A free of ready memory (``ready=None``, not
carved from pending memory) whose previous block cannot merge with it is *held*: the handle is
retired at once (out of the live blocks, ``allocated`` False, counted off the pool's
``allocated``), and the rest of the free (merging, the free list, the other statistics) waits for
the next call. When that call is a malloc that would get exactly this memory back, it hands out a
fresh handle in its place: the completed free would give a block F (the memory alone, or merged
with its ready next block), F must be the best fit (nothing with a smaller key fits in the earlier
kinds, the ready list or the stream's pending list), and its split must restore the blocks as they
are (F not split at all; or, merged, split back at the end of the held memory). The statistics then
move by the net of the free and the malloc: totals, plus the peaks of the values the pair passes
through. Any other call first completes the held free (``_flush``; every method that reads or
changes blocks, lists or statistics does, and so does ``Segment.blocks``), so what a caller can
observe is the result of eager frees. A steady malloc / free loop thus does no split, merge or
free-list work.

Remembered round trips. Whether a malloc may take the held memory back depends only on the
pool's state, and such a round trip leaves that state as it found it. So the pool remembers the
last verified one (``_rt``: handle, size, stream, policy); while nothing but the free of that
handle runs in between, the next malloc of the same size class, stream and policy skips the
check and hands the same Block out again under a new generation. The totals that repeat adds
are counted in ``_rt`` and added to the statistics when the memory is forgotten (``_drop_rt``,
by any other call: ``_flush``, ``_retire`` and every other malloc), so no query sees the
difference. The properties (``allocated``, ``reserved``, their peaks), ``find`` and
``live_blocks`` are pure reads; every other method may complete a held free, so ``stats``,
``snapshot``, ``summary`` and the resets are serialized with malloc / free like any other call.

Limits. ``reserved`` never exceeds ``limit`` = capacity * fraction. When a new segment does not
fit, the pool releases its cached whole free segments (counted in ``num_alloc_retries``) and
tries again, then raises ``OutOfMemoryError`` with the numbers and the fix.

Handles. A handle is the pair ``(block, block.gen)``: every malloc hands out a generation never
used before, and free sets it to 0. A retired Block never returns to the free lists, but a
remembered round trip hands the same Block object out again, so a caller that must catch stale
handles keeps the generation: ``free(block, gen=...)`` then raises for a double free even if the
Block is live again, and the runtime's ``DevicePtr`` checks it on every use.

Statistics follow torch.cuda.memory_stats (``Stat{current, peak, allocated, freed}``, flat dotted
keys) and are kept incrementally, O(1) per operation. ``active`` equals ``allocation`` here:
a block freed with a pending marker is already reusable by its stream, so it counts as cached.
``inactive_split`` (non-releasable: free blocks of partly used segments) moves by the net change
of each malloc / free, so its peak is exact and its allocated / freed totals count net moves.
"""
from __future__ import annotations

import enum
import math
import operator
from bisect import bisect_left, bisect_right, insort
from typing import Protocol

from runtime.errors import InvalidParamError, MemoryAccessError, OutOfMemoryError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

ROUND = 512                    # every block size is a multiple of this
SMALL_SIZE = 1 * MiB           # largest request served by the small pool
SMALL_SEGMENT = 2 * MiB        # size of every small-pool segment
HUGE_PAGE = 2 * MiB
NORMAL_PAGE = 4 * KiB
LARGE_SPLIT_MIN = 1 * MiB      # a large block is split only if more than this remains

_ROUND_UP = ROUND - 1
_ROUND_MASK = ~_ROUND_UP
_ADDR_BITS = 64
_ADDR_MASK = (1 << _ADDR_BITS) - 1

# Free-list kinds; a segment has exactly one.
_SMALL, _LARGE_HUGE, _LARGE_NORMAL = 0, 1, 2
_KIND_POOL = (1, 2, 2)         # stats pool slot of each kind: 0 all, 1 small_pool, 2 large_pool
_KIND_HUGE = (False, True, False)
_POOL_NAMES = ("all", "small_pool", "large_pool")

# Stats: one list per pool (all, small, large); index = stat * 4 + field. The "all" list keeps
# only current and peak; its totals are the sums of the pools'. The hot paths inline the updates
# with these offsets (a method call per stat would double the cost of a cached malloc).
_ALLOC_BYTES, _RESERVED_BYTES, _INACTIVE_BYTES, _REQUESTED_BYTES = 0, 4, 8, 12
_ALLOCATION, _SEGMENT, _INACTIVE = 16, 20, 24
_N_STATS = 28
_STAT_NAMES = ("allocated_bytes", "reserved_bytes", "inactive_split_bytes", "requested_bytes",
               "allocation", "segment", "inactive_split")
_MIRRORS = {"active_bytes": _ALLOC_BYTES, "active": _ALLOCATION}  # see the design note
_CUR, _PEAK, _TOT, _BASE = 0, 1, 2, 3   # freed = base + allocated - current (see _stat_fields)
_STAT_TYPES = tuple(zip(range(0, _N_STATS, 4), _STAT_NAMES)) + tuple(
    (t, name) for name, t in _MIRRORS.items())


class MemMallocPolicy(enum.IntEnum):
    """Page policy of ``malloc``; the values are ACL's ``aclrtMemMallocPolicy``."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2


_LARGE_KINDS = {
    MemMallocPolicy.HUGE_FIRST: (_LARGE_HUGE, _LARGE_NORMAL),
    MemMallocPolicy.HUGE_ONLY: (_LARGE_HUGE,),
    MemMallocPolicy.NORMAL_ONLY: (_LARGE_NORMAL,),
}
_SMALL_KINDS = (_SMALL,)
_HUGE_FIRST = MemMallocPolicy.HUGE_FIRST        # the default policy: malloc checks it by identity
_HUGE_FIRST_KINDS = _LARGE_KINDS[_HUGE_FIRST]
_HUGE_FIRST_INT = int(_HUGE_FIRST)     # ACL's 0: CPython shares small ints, others take the lookup
_POLICY_TYPES = (MemMallocPolicy, int)   # fast path; others (numpy ints) go through operator.index
_new_object = object.__new__             # hot paths build blocks without a call to __init__


class RawAllocator(Protocol):
    """Where segments come from: a device address space (or a fake one in tests)."""

    def reserve(self, nbytes: int) -> int:
        """Return the address of ``nbytes`` fresh bytes; raise MemoryError if there is no room."""

    def release(self, addr: int, nbytes: int) -> None:
        """Give back a range returned by ``reserve`` (same address and size)."""


class Segment:
    """One raw reservation; its blocks form a doubly linked list from ``head``, in address order."""

    __slots__ = ("addr", "size", "kind", "stream", "head", "_stats", "_owner")

    def __init__(self, addr: int, size: int, kind: int, stream, stats: list | None = None,
                 owner: CachingAllocator | None = None):
        self.addr = addr
        self.size = size
        self.kind = kind
        self.stream = stream        # the stream whose malloc reserved it
        self.head: Block | None = None
        self._stats = stats         # the owning pool's stats list of this kind (small / large)
        self._owner = owner         # the pool, whose held free blocks() completes first

    @property
    def huge(self) -> bool:
        return _KIND_HUGE[self.kind]

    @property
    def pool(self) -> str:
        return _POOL_NAMES[_KIND_POOL[self.kind]]

    def blocks(self):
        """Yield the segment's blocks in address order."""
        if self._owner is not None:
            self._owner._flush()
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
    ``allocated``, ``site`` (file:line of the malloc), ``huge`` (huge pages), ``pending`` (the
    marker that must complete before another stream may reuse this memory, or None), ``gen``
    (the allocation's generation, unique per malloc, 0 once freed: a handle is the pair
    ``(block, gen)``, see the module design note).
    """

    __slots__ = ("addr", "size", "requested", "stream", "segment", "allocated", "site",
                 "prev", "next", "pending", "seq", "gen")

    def __init__(self, addr: int, size: int, segment: Segment, stream=None):
        self.addr = addr
        self.size = size
        self.segment = segment
        self.stream = stream
        self.requested = 0
        self.allocated = False
        self.site = ""
        self.prev: Block | None = None
        self.next: Block | None = None
        self.pending = None         # marker object with .query(), None when ready
        self.seq = 0                # when the marker was attached; the later marker wins a merge
        self.gen = 0                # the allocation's generation; 0 when free

    @property
    def huge(self) -> bool:
        return _KIND_HUGE[self.segment.kind]

    @property
    def pool(self) -> str:
        return _POOL_NAMES[_KIND_POOL[self.segment.kind]]

    @property
    def end(self) -> int:
        return self.addr + self.size

    def __repr__(self):
        state = "allocated" if self.allocated else "free"
        return (f"Block(addr=0x{self.addr:x}, size={self.size}, requested={self.requested}, "
                f"{state}, huge={self.huge}, site={self.site!r})")


def format_size(nbytes: int) -> str:
    """Human-readable size with two decimals: ``512 B``, ``1.50 KiB``, ``3.00 GiB``."""
    if nbytes < KiB:
        return f"{nbytes} B"
    for unit, scale in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"  # unreachable


def _check_nbytes(nbytes) -> int:
    """Return ``nbytes`` as an int > 0 or raise InvalidParamError (slow path of malloc)."""
    if isinstance(nbytes, bool) or isinstance(nbytes, float):
        raise InvalidParamError(
            f"malloc: nbytes={nbytes!r} must be an int > 0 (got {type(nbytes).__name__})")
    try:
        n = operator.index(nbytes)
    except TypeError:
        raise InvalidParamError(
            f"malloc: nbytes={nbytes!r} must be an int > 0 (got {type(nbytes).__name__})") from None
    if n <= 0:
        raise InvalidParamError(
            f"malloc: nbytes={n} must be > 0; zero-size and negative allocations are not allowed "
            f"(zero-size arrays take no device memory: do not malloc them)")
    return n


def _policy_kinds(policy) -> tuple:
    """Large-pool kinds of a policy given as a plain ACL int (slow path), or InvalidParamError."""
    kinds = None
    if not isinstance(policy, (bool, float)):
        try:
            kinds = _LARGE_KINDS.get(operator.index(policy))
        except TypeError:
            pass
    if kinds is None:
        valid = ", ".join(f"MemMallocPolicy.{p.name} ({p.value})" for p in MemMallocPolicy)
        raise InvalidParamError(f"malloc: unknown policy={policy!r}; valid policies: {valid}")
    return kinds


class _RoundTrip:
    """A verified held round trip the pool may repeat without checking (design note)."""

    __slots__ = ("handle", "size", "lo", "stream", "policy", "inactive", "splits", "stats",
                 "repeats", "requested")

    def __init__(self, handle: Block, size: int, stream, policy, inactive: int, splits: int,
                 stats: list):
        self.handle, self.size, self.lo = handle, size, size - _ROUND_UP   # one size class
        self.stream, self.policy = stream, policy
        self.inactive, self.splits = inactive, splits   # what a repeat adds to those totals
        self.stats = stats                              # the segment's pool's statistics
        self.repeats = self.requested = 0               # totals not yet in the statistics


class CachingAllocator:
    """Caching pool of one device: malloc/free of blocks carved from raw segments.

    ``raw`` supplies segments, ``capacity`` is the device memory in bytes. Not thread-safe: the
    caller serializes calls (one lock per device), queries such as ``stats`` and ``snapshot``
    included; only the properties, ``find`` and ``live_blocks`` are pure reads. See the module
    design note for the policy.
    """

    def __init__(self, raw: RawAllocator, capacity: int, device_id: int = 0):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise InvalidParamError(f"CachingAllocator: capacity={capacity!r} must be an int > 0")
        self._raw = raw
        self.device_id = device_id
        self._capacity = capacity
        self._fraction = 1.0
        self._limit = capacity
        # free blocks: kind -> sorted keys (ready); kind -> {stream: sorted keys} (pending)
        self._ready: list[list[int]] = [[], [], []]
        self._pend: list[dict] = [{}, {}, {}]
        self._n_pending = 0
        self._free: dict[int, Block] = {}       # list key -> free block
        self._live: dict[int, Block] = {}       # addr -> allocated block
        self._seg_addrs: list[int] = []         # sorted segment addresses
        self._segs: dict[int, Segment] = {}
        self._seq = 0
        self._gen = 0                           # the last generation handed out (Block.gen)
        self._held: Block | None = None         # a free waiting to be completed (design note)
        self._rt: _RoundTrip | None = None     # the last verified round trip (design note)
        self._raw_error: str | None = None          # why the last reserve failed, for the OOM
        self._sa = [0] * _N_STATS                   # stats of all pools (current, peak only)
        self._pools = (self._sa, [0] * _N_STATS, [0] * _N_STATS)   # indexed by _KIND_POOL
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

    @property
    def allocated(self) -> int:
        """Bytes in allocated blocks (torch ``memory_allocated``)."""
        return self._sa[_ALLOC_BYTES]

    @property
    def reserved(self) -> int:
        """Bytes in segments (torch ``memory_reserved``)."""
        return self._sa[_RESERVED_BYTES]

    @property
    def max_allocated(self) -> int:
        """Peak of ``allocated`` since the last ``reset_peak_stats``."""
        return self._sa[_ALLOC_BYTES + _PEAK]

    @property
    def max_reserved(self) -> int:
        """Peak of ``reserved`` since the last ``reset_peak_stats``."""
        return self._sa[_RESERVED_BYTES + _PEAK]

    def largest_free_block(self) -> int:
        """Size of the largest cached free block (ready or pending), 0 if none."""
        self._flush()
        best = 0
        for kind in range(3):
            if self._ready[kind]:
                best = max(best, self._ready[kind][-1] >> _ADDR_BITS)
            for lst in self._pend[kind].values():
                best = max(best, lst[-1] >> _ADDR_BITS)
        return best

    # ------------------------------------------------------------------ malloc / free
    # The hot paths are written out flat: the free-list work of the common case (a ready block)
    # and every statistic are inline (offsets in the stats lists, see _N_STATS), and blocks are
    # built without a call to Block.__init__; the helpers (_insert, _remove, _inc, _take_cached)
    # serve the pending and cold paths. A free of ready memory is *held* (see the design note):
    # malloc either takes the held memory back (the "cached" fast path: no split, no merge, no
    # free-list work, statistics netted) or completes the held free first (_retire).
    def malloc(self, nbytes: int, stream, policy=MemMallocPolicy.HUGE_FIRST,
               site: str = "") -> Block:
        """Return a block of at least ``nbytes`` bytes for use on ``stream``.

        ``stream`` is any hashable object; ``site`` (file:line) is kept for leak reports and
        errors. Raises InvalidParamError for a bad size, policy or stream (nothing changed) and
        OutOfMemoryError when the limit or the address space leaves no room.
        """
        h = self._held
        if h is not None:
            rt = self._rt
            if rt is not None and rt.handle is h and stream is rt.stream and \
                    policy is rt.policy and type(nbytes) is int and rt.lo <= nbytes <= rt.size:
                # The round trip verified below, again: nothing but free(h) ran since it
                # handed h out, so its verdict holds: h goes out again under a new generation,
                # allocated_bytes returns; requested_bytes moves by the difference, the totals
                # are counted in rt (see _drop_rt).
                self._held = None
                self._gen = g = self._gen + 1
                h.gen = g
                dn = nbytes - h.requested
                h.requested = nbytes
                h.site = site
                h.allocated = True
                self._live[h.addr] = h
                rt.repeats += 1
                rt.requested += nbytes
                self._sa[0] += h.size
                if dn:
                    self._move_requested(h.segment._stats, dn)
                return h
        if type(nbytes) is not int or nbytes <= 0:
            nbytes = _check_nbytes(nbytes)
        if policy is _HUGE_FIRST or policy is _HUGE_FIRST_INT:    # the default: no lookup
            kinds = _HUGE_FIRST_KINDS
        elif type(policy) in _POLICY_TYPES and policy in _LARGE_KINDS:
            kinds = _LARGE_KINDS[policy]
        else:
            kinds = _policy_kinds(policy)            # numpy ints, or InvalidParamError
        try:
            hash(stream)
        except TypeError:
            raise InvalidParamError(f"malloc: stream={stream!r} must be hashable") from None
        size = (nbytes + _ROUND_UP) & _ROUND_MASK
        if size <= SMALL_SIZE:
            kinds = _SMALL_KINDS
        key = size << _ADDR_BITS
        if self._rt is not None:
            self._drop_rt()

        h = self._held
        if h is not None:
            # Would completing h's free, then this malloc, hand out exactly h's memory and leave
            # every other block as it is? Then do just that. The completed free would hold h's
            # memory in F: h alone (case A), or h merged with its next block nx (case B; h's
            # previous block never merges, see free). This malloc would take F if it is the best
            # fit, and split it back to h + nx (B), or not split it at all (A).
            self._held = None
            hs = h.size
            seg = h.segment
            kind = seg.kind
            if size <= hs and (kind == kinds[0] or (
                    kind in kinds and not self._has_fit(kinds[0], key, stream))):
                hstream = h.stream
                nx = h.next
                fsize = 0
                if nx is None or nx.allocated or (
                        nx.pending is not None and nx.stream != hstream):
                    rest = hs - size                 # case A: F is h; its rest must stay
                    if not (rest > LARGE_SPLIT_MIN or (rest and kind == _SMALL)):
                        fsize = hs
                        skip = 0
                elif nx.pending is None and size == hs and (
                        kind == _SMALL or nx.size > LARGE_SPLIT_MIN):
                    nn = nx.next                     # case B: F is h + nx, split at h's end
                    if nn is None or nn.allocated or (
                            nn.pending is not None and nn.stream != hstream):
                        fsize = hs + nx.size
                        skip = (nx.size << _ADDR_BITS) | nx.addr    # merged into F
                if fsize:
                    addr = h.addr
                    fkey = (fsize << _ADDR_BITS) | addr
                    lst = self._ready[kind]          # best fit: no smaller key than F's fits
                    i = bisect_left(lst, key)
                    n = len(lst)
                    if i < n and lst[i] == skip:
                        i += 1
                    if i < n and lst[i] < fkey:
                        fsize = 0
                    else:
                        d = self._pend[kind]
                        if d:
                            pl = d.get(stream)
                            if pl is not None:
                                j = bisect_left(pl, key)
                                if j < len(pl) and pl[j] < fkey:
                                    fsize = 0
                if fsize:
                    b = _new_object(Block)           # a fresh handle in h's place
                    self._gen = b.gen = self._gen + 1
                    b.addr = addr
                    b.size = hs
                    b.requested = nbytes
                    b.stream = stream
                    b.segment = seg
                    b.allocated = True
                    b.site = site
                    b.prev = prev = h.prev
                    b.next = nx
                    b.pending = None
                    b.seq = h.seq
                    if prev is None:
                        seg.head = b
                    else:
                        prev.next = b
                    if nx is not None:
                        nx.prev = b
                    h.prev = h.next = None
                    self._live[addr] = b
                    # Statistics of the free, then the malloc, netted: allocated_bytes and
                    # allocation return to their current values (so no new peak), only their
                    # totals move; requested_bytes moves by the difference.
                    sp = seg._stats
                    sa = self._sa
                    sa[0] += hs                      # back to the value before the free
                    sp[2] += hs
                    sp[18] += 1
                    sp[14] += nbytes
                    dn = nbytes - h.requested
                    if dn:
                        self._move_requested(sp, dn)
                    inactive = splits = 0            # totals a repeat adds (see _rt)
                    if fsize != seg.size:            # F was non-releasable for a moment
                        inactive = hs
                        sp[10] += hs
                        c = sp[8] + hs
                        if c > sp[9]:
                            sp[9] = c
                        c = sa[8] + hs
                        if c > sa[9]:
                            sa[9] = c
                        if not skip:                 # ... and one more inactive block (A)
                            splits = 1
                            sp[26] += 1
                            c = sp[24] + 1
                            if c > sp[25]:
                                sp[25] = c
                            c = sa[24] + 1
                            if c > sa[25]:
                                sa[25] = c
                    elif skip:                       # B, whole segment: nx merged, split off
                        inactive = nx.size
                        splits = 1
                        sp[10] += inactive
                        sp[26] += 1
                    if skip:
                        nx.stream = hstream          # as the rest split off F would be
                        nx.seq = h.seq
                    self._rt = _RoundTrip(b, size, stream, policy, inactive, splits, sp)
                    return b
            self._retire(h, None, h.seq)

        # Best fit (see _take_cached, written out here): earlier kinds win; within a kind the
        # smallest key among the ready blocks and the stream's own pending blocks.
        free = self._free
        for kind in kinds:
            lst = self._ready[kind]
            i = bisect_left(lst, key)
            d = self._pend[kind]
            if d:
                pl = d.get(stream)
                if pl is not None:
                    j = bisect_left(pl, key)
                    if j < len(pl) and (i == len(lst) or pl[j] < lst[i]):
                        b = free.pop(pl.pop(j))
                        if not pl:
                            del d[stream]
                        self._n_pending -= 1
                        break
            if i < len(lst):
                b = free.pop(lst.pop(i))
                break
        else:
            b = self._grow(size, nbytes, stream, kinds, policy)

        # b is free and in no list: hand out its first `size` bytes, keep the rest if worth it.
        seg = b.segment
        kind = seg.kind
        sp = seg._stats
        sa = self._sa
        n = b.size
        rest = n - size
        if rest > LARGE_SPLIT_MIN or (rest and kind == _SMALL):
            r = _new_object(Block)
            r.addr = raddr = b.addr + size
            r.size = rest
            r.requested = 0
            r.stream = b.stream
            r.segment = seg
            r.allocated = False
            r.gen = 0
            r.site = ""
            r.prev = b
            r.next = nxt = b.next
            r.pending = pend = b.pending
            r.seq = b.seq
            if nxt is not None:
                nxt.prev = r
            b.next = r
            b.size = size
            if pend is None:
                rkey = (rest << _ADDR_BITS) | raddr
                insort(self._ready[kind], rkey)
                free[rkey] = r
            else:
                self._insert(r)
            if n == seg.size:                        # a whole segment got split
                c = sp[8] + rest                     # inactive_split_bytes
                sp[8] = c
                sp[10] += rest
                if c > sp[9]:
                    sp[9] = c
                c = sa[8] + rest
                sa[8] = c
                if c > sa[9]:
                    sa[9] = c
                c = sp[24] + 1                       # inactive_split
                sp[24] = c
                sp[26] += 1
                if c > sp[25]:
                    sp[25] = c
                c = sa[24] + 1
                sa[24] = c
                if c > sa[25]:
                    sa[25] = c
            else:
                sp[8] -= size
                sa[8] -= size
        else:
            size = n
            if n != seg.size:                        # a non-releasable block, taken whole
                sp[8] -= n
                sa[8] -= n
                sp[24] -= 1
                sa[24] -= 1
        b.allocated = True
        b.requested = nbytes
        b.stream = stream
        b.site = site
        self._gen = b.gen = self._gen + 1
        self._live[b.addr] = b
        c = sp[0] + size                             # allocated_bytes
        sp[0] = c
        sp[2] += size
        if c > sp[1]:
            sp[1] = c
        c = sa[0] + size
        sa[0] = c
        if c > sa[1]:
            sa[1] = c
        c = sp[12] + nbytes                          # requested_bytes
        sp[12] = c
        sp[14] += nbytes
        if c > sp[13]:
            sp[13] = c
        c = sa[12] + nbytes
        sa[12] = c
        if c > sa[13]:
            sa[13] = c
        c = sp[16] + 1                               # allocation
        sp[16] = c
        sp[18] += 1
        if c > sp[17]:
            sp[17] = c
        c = sa[16] + 1
        sa[16] = c
        if c > sa[17]:
            sa[17] = c
        return b

    def free(self, block: Block, ready=None, gen: int | None = None) -> None:
        """Return ``block`` to the pool.

        ``ready`` is None (the block's memory is idle now) or a marker with ``query() -> bool``
        that turns True once the work enqueued on ``block.stream`` before this free is done;
        until then only that stream may reuse the memory. ``gen``, the ``block.gen`` that malloc
        handed out, catches a stale handle whose Block went out again (see the design note).
        Raises MemoryAccessError for a double free or a block of another pool,
        InvalidParamError for a bad argument (nothing changed).
        """
        if type(block) is not Block or self._live.get(block.addr) is not block or (
                gen is not None and gen != block.gen):
            raise self._bad_free(block, gen)
        if ready is not None and not hasattr(ready, "query"):
            raise InvalidParamError(
                f"free: ready={ready!r} must be None or have a query() method (an event)")
        self._free_checked(block, ready)

    def _free_checked(self, block: Block, ready) -> None:
        """``free`` for a caller that has checked its arguments (``block.allocated`` and from
        this pool; ``ready`` None or a marker): the runtime's free validates the pointer."""
        live = self._live
        h = self._held
        if h is not None:
            self._held = None
            self._retire(h, None, h.seq)
        del live[block.addr]
        block.allocated = False
        block.gen = 0
        self._sa[0] -= block.size                    # all pools' allocated_bytes at once: the
                                                     # property stays a pure read (design note)
        if ready is None:
            if block.pending is None:
                # Ready memory that cannot merge backwards is held: the handle is retired now,
                # the rest of the free waits for the next pool call (see the design note).
                prev = block.prev
                if prev is None or prev.allocated or (
                        prev.pending is not None and prev.stream != block.stream):
                    self._held = block
                    return
            self._retire(block, block.pending, block.seq)   # carved from pending: stays so
        else:
            self._seq += 1
            self._retire(block, ready, self._seq)

    def _flush(self) -> None:
        """Complete a held free, so that blocks, free lists and statistics are all up to date."""
        if self._rt is not None:
            self._drop_rt()
        h = self._held
        if h is not None:
            self._held = None
            self._retire(h, None, h.seq)

    def _move_requested(self, sp: list, dn: int) -> None:
        """requested_bytes (current, peak) of the pool ``sp`` and of all pools move by ``dn``:
        a held memory taken back for another request size."""
        sa = self._sa
        c = sp[12] + dn
        sp[12] = c
        if c > sp[13]:
            sp[13] = c
        c = sa[12] + dn
        sa[12] = c
        if c > sa[13]:
            sa[13] = c

    def _drop_rt(self) -> None:
        """Forget the remembered round trip, adding the totals its repeats counted."""
        rt, self._rt = self._rt, None
        n, sp = rt.repeats, rt.stats
        if n:
            sp[2] += n * rt.handle.size              # allocated_bytes.allocated
            sp[18] += n                              # allocation.allocated
            sp[14] += rt.requested                   # requested_bytes.allocated
            sp[10] += n * rt.inactive                # inactive_split_bytes.allocated
            sp[26] += n * rt.splits                  # inactive_split.allocated

    def _retire(self, block: Block, pend, seq: int) -> None:
        """The rest of ``free(block)``: statistics, merging, and the free list.

        ``free`` has taken ``block`` out of ``_live`` and counted it off the all-pools
        allocated_bytes; ``pend`` / ``seq`` are the marker its memory keeps (None when ready).
        """
        if self._rt is not None:
            self._drop_rt()
        seg = block.segment
        size = block.size
        sp = seg._stats
        sa = self._sa
        n = block.requested
        sp[0] -= size                                # allocated_bytes (free did all pools' value),
        sp[12] -= n                                  # requested_bytes, allocation
        sa[12] -= n
        sp[16] -= 1
        sa[16] -= 1
        stream = block.stream
        prev, nxt = block.prev, block.next
        block.prev = block.next = block.pending = None
        # The handle is retired: its memory joins its free neighbours that it may merge with
        # (ready ones, or pending on this stream), held by one of them or by a new block. Merge
        # runs while neighbours qualify: a pending block and a ready one may sit side by side.
        rl = self._ready[seg.kind]
        free = self._free
        lo = block.addr
        absorbed = k = 0                             # bytes and count of merged neighbours
        s = None
        while prev is not None and not prev.allocated and (
                prev.pending is None or prev.stream == stream):
            if prev.pending is None:
                key = (prev.size << _ADDR_BITS) | prev.addr
                del rl[bisect_left(rl, key)]
                del free[key]
            else:
                self._remove(prev)
                if pend is None or prev.seq > seq:
                    pend, seq = prev.pending, prev.seq
            absorbed += prev.size
            k += 1
            s = prev
            lo = prev.addr
            prev = prev.prev
        while nxt is not None and not nxt.allocated and (
                nxt.pending is None or nxt.stream == stream):
            if nxt.pending is None:
                key = (nxt.size << _ADDR_BITS) | nxt.addr
                del rl[bisect_left(rl, key)]
                del free[key]
            else:
                self._remove(nxt)
                if pend is None or nxt.seq > seq:
                    pend, seq = nxt.pending, nxt.seq
            absorbed += nxt.size
            k += 1
            s = nxt
            nxt = nxt.next
        total = size + absorbed
        if s is None:
            s = _new_object(Block)
            s.segment = seg
            s.requested = 0
            s.allocated = False
            s.gen = 0
            s.site = ""
        s.addr = lo
        s.size = total
        s.prev = prev
        if prev is None:
            seg.head = s
        else:
            prev.next = s
        s.next = nxt
        if nxt is not None:
            nxt.prev = s
        s.stream = stream
        s.pending = pend
        s.seq = seq
        if pend is None:
            key = (total << _ADDR_BITS) | lo
            insort(rl, key)
            free[key] = s
        else:
            self._insert(s)
        # Non-releasable: the merged neighbours were (a neighbour is never a whole segment);
        # s is unless it now spans its segment.
        if total != seg.size:
            c = sp[8] + size                         # inactive_split_bytes
            sp[8] = c
            sp[10] += size
            if c > sp[9]:
                sp[9] = c
            c = sa[8] + size
            sa[8] = c
            if c > sa[9]:
                sa[9] = c
            if k == 0:                               # inactive_split
                c = sp[24] + 1
                sp[24] = c
                sp[26] += 1
                if c > sp[25]:
                    sp[25] = c
                c = sa[24] + 1
                sa[24] = c
                if c > sa[25]:
                    sa[25] = c
            elif k != 1:
                sp[24] -= k - 1
                sa[24] -= k - 1
        elif k:
            sp[8] -= absorbed
            sa[8] -= absorbed
            sp[24] -= k
            sa[24] -= k

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

    # ------------------------------------------------------------------ free lists
    # _insert / _remove keep the lists only; callers account inactive_split (_insert_counted).
    # ``_free`` maps a free block's list key to the block, so taking the best fit is one
    # ``pop`` from the sorted list and one from the dict.
    def _insert(self, b: Block) -> None:
        """Put the free block ``b`` into its free list."""
        key = (b.size << _ADDR_BITS) | b.addr
        if b.pending is None:
            insort(self._ready[b.segment.kind], key)
        else:
            d = self._pend[b.segment.kind]
            lst = d.get(b.stream)
            if lst is None:
                d[b.stream] = [key]
            else:
                insort(lst, key)
            self._n_pending += 1
        self._free[key] = b

    def _remove(self, b: Block) -> None:
        """Take the free block ``b`` out of its free list."""
        key = (b.size << _ADDR_BITS) | b.addr
        if b.pending is None:
            lst = self._ready[b.segment.kind]
            del lst[bisect_left(lst, key)]
        else:
            d = self._pend[b.segment.kind]
            lst = d[b.stream]
            del lst[bisect_left(lst, key)]
            if not lst:
                del d[b.stream]
            self._n_pending -= 1
        del self._free[key]

    def _insert_counted(self, b: Block) -> None:
        self._insert(b)
        if b.size != b.segment.size:
            self._inc(_INACTIVE_BYTES, b.segment.kind, b.size)
            self._inc(_INACTIVE, b.segment.kind, 1)

    def _remove_counted(self, b: Block) -> None:
        self._remove(b)
        if b.size != b.segment.size:
            self._dec(_INACTIVE_BYTES, b.segment.kind, b.size)
            self._dec(_INACTIVE, b.segment.kind, 1)

    def _has_fit(self, kind: int, key: int, stream) -> bool:
        """Whether a free block of ``kind`` usable by ``stream`` fits ``key`` (= size << 64)."""
        lst = self._ready[kind]
        if bisect_left(lst, key) < len(lst):
            return True
        pl = self._pend[kind].get(stream)
        return pl is not None and bisect_left(pl, key) < len(pl)

    def _take_cached(self, size: int, stream, kinds) -> Block | None:
        """Remove and return the best-fitting free block usable by ``stream``, or None.

        Earlier kinds win (huge before normal pages); within a kind, the smallest fit among the
        ready blocks and the stream's own pending blocks. Stats are the caller's. (``malloc``
        has this loop written out.)
        """
        key = size << _ADDR_BITS
        free = self._free
        for kind in kinds:
            lst = self._ready[kind]
            i = bisect_left(lst, key)
            d = self._pend[kind]
            if d:
                pl = d.get(stream)
                if pl is not None:
                    j = bisect_left(pl, key)
                    if j < len(pl) and (i == len(lst) or pl[j] < lst[i]):
                        b = free.pop(pl.pop(j))
                        if not pl:
                            del d[stream]
                        self._n_pending -= 1
                        return b
            if i < len(lst):
                return free.pop(lst.pop(i))
        return None

    # ------------------------------------------------------------------ growth and release
    def _grow(self, size: int, nbytes: int, stream, kinds, policy) -> Block:
        """No cached fit: poll markers, reserve a segment, flush the cache and retry, or OOM."""
        self._raw_error = None
        if self._n_pending and self._poll():
            b = self._take_cached(size, stream, kinds)
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
            if kind == _SMALL:
                seg_size = SMALL_SEGMENT
            else:
                page = HUGE_PAGE if kind == _LARGE_HUGE else NORMAL_PAGE
                seg_size = -(-size // page) * page
            if self.reserved + seg_size > self._limit:
                continue
            try:
                addr = self._raw.reserve(seg_size)
            except MemoryError as e:                 # address space full: a failed cudaMalloc
                self._raw_error = format_size(seg_size) + (f" ({e})" if str(e) else "")
                continue
            if not 0 <= addr <= _ADDR_MASK - seg_size:
                raise ValueError(f"raw allocator returned address {addr!r} outside 0..2**64")
            seg = Segment(addr, seg_size, kind, stream, self._pools[_KIND_POOL[kind]], self)
            b = Block(addr, seg_size, seg, stream)
            seg.head = b
            insort(self._seg_addrs, addr)
            self._segs[addr] = seg
            self.num_device_alloc += 1
            self._inc(_RESERVED_BYTES, kind, seg_size)
            self._inc(_SEGMENT, kind, 1)
            return b
        return None

    def _poll(self) -> int:
        """Drop completed markers; their blocks become usable by every stream. Returns a count."""
        done: dict[int, bool] = {}
        promoted = []
        for d in self._pend:
            for lst in d.values():
                for key in lst:
                    b = self._free[key]
                    m = b.pending
                    ok = done.get(id(m))
                    if ok is None:
                        ok = done[id(m)] = bool(m.query())
                    if ok:
                        promoted.append(b)
        for b in promoted:
            self._remove_counted(b)
            b.pending = None
            self._merge_ready(b)
        return len(promoted)

    def _merge_ready(self, s: Block) -> None:
        """Insert the ready free block ``s``, merged with its ready free neighbours.

        A pending neighbour is left alone: merging would lock ready memory to its stream.
        """
        prev = s.prev
        if prev is not None and not prev.allocated and prev.pending is None:
            self._remove_counted(prev)
            s.addr = prev.addr
            s.size += prev.size
            s.prev = pp = prev.prev
            if pp is None:
                s.segment.head = s
            else:
                pp.next = s
        nxt = s.next
        if nxt is not None and not nxt.allocated and nxt.pending is None:
            self._remove_counted(nxt)
            s.size += nxt.size
            s.next = nn = nxt.next
            if nn is not None:
                nn.prev = s
        self._insert_counted(s)

    def _release_cached(self) -> int:
        """Release every whole free segment without a pending marker; return the bytes freed."""
        self._flush()
        if self._n_pending:
            self._poll()
        freed = 0
        for kind in range(3):
            lst = self._ready[kind]
            whole = [self._free[k] for k in lst
                     if self._free[k].segment.size == k >> _ADDR_BITS]
            for b in whole:
                freed += self._release_segment(b)
        return freed

    def _releasable(self) -> int:
        """Bytes ``_release_cached`` would give back now (after polling markers)."""
        self._flush()
        if self._n_pending:
            self._poll()
        total = 0
        for lst in self._ready:
            for k in lst:
                if self._free[k].segment.size == k >> _ADDR_BITS:
                    total += k >> _ADDR_BITS
        return total

    def _release_segment(self, b: Block) -> int:
        """Give the whole-segment free block ``b``'s segment back to the raw allocator."""
        seg = b.segment
        self._remove(b)                              # a whole segment is never non-releasable
        del self._segs[seg.addr]
        del self._seg_addrs[bisect_left(self._seg_addrs, seg.addr)]
        seg.head = None
        self._raw.release(seg.addr, seg.size)
        self.num_device_free += 1
        self._dec(_RESERVED_BYTES, seg.kind, seg.size)
        self._dec(_SEGMENT, seg.kind, 1)
        return seg.size

    def empty_cache(self) -> None:
        """Release every whole free segment whose markers have completed (torch empty_cache)."""
        self._flush()
        self._release_cached()

    def release_all(self) -> list[Block]:
        """Free every live block, drop every marker and release every segment (reset_device).

        Call only once the device is idle. Returns the blocks that were still allocated (the
        leaks), in address order; their handles are retired like freed ones.
        """
        self._flush()
        leaks = self.live_blocks()
        for b in leaks:
            self.free(b)
        self._flush()
        for d in self._pend:
            for lst in list(d.values()):
                for key in list(lst):
                    b = self._free[key]
                    self._remove_counted(b)
                    b.pending = None
                    self._merge_ready(b)
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
        self._flush()
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
        cap, alloc, res, limit = self._capacity, self.allocated, self.reserved, self._limit
        largest = self.largest_free_block()
        facts = (f"device {self.device_id}; {format_size(cap)} total capacity; "
                 f"{format_size(alloc)} already allocated; {format_size(res)} reserved in total "
                 f"by the pool; {format_size(cap - res)} free; limit {format_size(limit)}; "
                 f"largest free block {format_size(largest)}")
        if self._raw_error:
            facts += f"; the device address space refused a segment of {self._raw_error}"
        fix = ("Free tensors you no longer need, call runtime.empty_cache(), reduce the batch "
               "size, or raise NPUSIM_HBM_BYTES")
        if limit < cap:
            fix += " or the fraction given to runtime.set_per_process_memory_fraction()"
        if kinds == (_LARGE_HUGE,) and size > SMALL_SIZE:
            fix += (f"; policy HUGE_ONLY needs a {format_size(-(-size // HUGE_PAGE) * HUGE_PAGE)} "
                    f"huge-page segment, HUGE_FIRST could fall back to normal pages")
        msg = f"NPU out of memory. Tried to allocate {format_size(size)} ({facts}). {fix}."
        err = OutOfMemoryError(msg)
        err.device_id = self.device_id
        err.requested = nbytes
        err.size = size
        err.capacity = cap
        err.allocated = alloc
        err.reserved = res
        err.limit = limit
        err.largest_free_block = largest
        err.policy = int(policy)
        return err

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
        self._flush()
        return [self._segs[a] for a in self._seg_addrs]

    def snapshot(self) -> list[dict]:
        """One dict per segment, in address order (torch memory_snapshot)."""
        self._flush()
        out = []
        for seg in self.segments():
            blocks = []
            for b in seg.blocks():
                blocks.append({
                    "address": b.addr,
                    "size": b.size,
                    "requested_size": b.requested if b.allocated else 0,
                    "state": "active_allocated" if b.allocated else "inactive",
                    "site": b.site if b.allocated else "",
                    "stream": b.stream if b.allocated or b.pending is not None else None,
                    "pending": b.pending is not None and not b.allocated,
                })
            out.append({
                "device": self.device_id,
                "address": seg.addr,
                "total_size": seg.size,
                "allocated_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                "requested_size": sum(b["requested_size"] for b in blocks),
                "stream": seg.stream,
                "segment_type": "small" if seg.kind == _SMALL else "large",
                "huge": seg.huge,
                "blocks": blocks,
            })
        return out

    # ------------------------------------------------------------------ statistics
    def _inc(self, t: int, kind: int, n: int) -> None:
        """Add ``n`` to stat ``t`` of ``kind``'s pool and of all (cold paths)."""
        sp = self._pools[_KIND_POOL[kind]]
        sa = self._sa
        c = sp[t] + n
        sp[t] = c
        sp[t + 2] += n
        if c > sp[t + 1]:
            sp[t + 1] = c
        c = sa[t] + n
        sa[t] = c
        if c > sa[t + 1]:
            sa[t + 1] = c

    def _dec(self, t: int, kind: int, n: int) -> None:
        self._pools[_KIND_POOL[kind]][t] -= n
        self._sa[t] -= n

    def _stat_fields(self, t: int, pool: int):
        """(current, peak, allocated, freed) of stat ``t`` in ``pool`` (0 all, 1 small, 2 large)."""
        if pool:
            cur, peak, tot, base = self._pools[pool][t:t + 4]
            return cur, peak, tot, base + tot - cur
        cur, peak = self._sa[t:t + 2]
        tot = self._pools[1][t + 2] + self._pools[2][t + 2]
        freed = sum(p[t + 3] + p[t + 2] - p[t] for p in self._pools[1:])
        return cur, peak, tot, freed

    def stats(self) -> dict:
        """torch.npu.memory_stats(): flat dotted keys, sorted (``allocated_bytes.all.current``)."""
        self._flush()
        out = {}
        for t, name in _STAT_TYPES:
            for pool, pname in enumerate(_POOL_NAMES):
                cur, peak, tot, freed = self._stat_fields(t, pool)
                prefix = f"{name}.{pname}."
                out[prefix + "current"] = cur
                out[prefix + "peak"] = peak
                out[prefix + "allocated"] = tot
                out[prefix + "freed"] = freed
        out["num_alloc_retries"] = self.num_alloc_retries
        out["num_ooms"] = self.num_ooms
        out["num_device_alloc"] = self.num_device_alloc
        out["num_device_free"] = self.num_device_free
        return dict(sorted(out.items()))

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value (torch reset_peak_memory_stats)."""
        self._flush()
        for st in self._pools:
            for i in range(0, _N_STATS, 4):
                st[i + _PEAK] = st[i + _CUR]

    def reset_accumulated_stats(self) -> None:
        """Zero the allocated / freed totals and the retry / OOM counters."""
        self._flush()
        for st in self._pools[1:]:
            for i in range(0, _N_STATS, 4):
                st[i + _TOT] = 0
                st[i + _BASE] = st[i + _CUR]
        self.num_alloc_retries = self.num_ooms = 0
        self.num_device_alloc = self.num_device_free = 0

    def summary(self, abbreviated: bool = False) -> str:
        """A torch.cuda.memory_summary()-style table of the statistics."""
        stats = self.stats()
        rule = "=" * 78
        lines = [rule, " {:^76} ".format(f"npusim NPU memory summary, device ID {self.device_id}"),
                 "-" * 78,
                 " {:^37}|{:^38} ".format(f"NPU OOMs: {self.num_ooms}",
                                          f"device malloc retries: {self.num_alloc_retries}"),
                 " {:^37}|{:^38} ".format(
                     f"capacity: {format_size(self._capacity)}",
                     f"limit: {format_size(self._limit)} (fraction {self._fraction:g})"),
                 rule,
                 "          Metric          | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
        metrics = [
            ("allocated_bytes", "Allocated memory", _fmt_size),
            ("active_bytes", "Active memory", _fmt_size),
            ("requested_bytes", "Requested memory", _fmt_size),
            ("reserved_bytes", "Device reserved memory", _fmt_size),
            ("inactive_split_bytes", "Non-releasable memory", _fmt_size),
            ("allocation", "Allocations", _fmt_count),
            ("active", "Active allocs", _fmt_count),
            ("segment", "Device reserved segments", _fmt_count),
            ("inactive_split", "Non-releasable allocs", _fmt_count),
        ]
        for key, name, fmt in metrics:
            lines.append("-" * 78)
            subs = [("all", name)]
            if not abbreviated:
                subs += [("large_pool", "      from large pool"),
                         ("small_pool", "      from small pool")]
            pref = None
            for pool, label in subs:
                cur, peak, tot, freed = (stats[f"{key}.{pool}.{f}"]
                                         for f in ("current", "peak", "allocated", "freed"))
                if pref is None:
                    pref = (cur, peak, tot, freed)
                lines.append(" {:<24} | {} | {} | {} | {} ".format(
                    label, fmt(cur, pref[0]), fmt(peak, pref[1]), fmt(tot, pref[2]),
                    fmt(freed, pref[3])))
        lines.append(rule)
        return "|" + "|\n|".join(lines) + "|\n"

    def __repr__(self):
        return (f"CachingAllocator(device={self.device_id}, "
                f"allocated={format_size(self.allocated)}, reserved={format_size(self.reserved)}, "
                f"limit={format_size(self._limit)})")


def _fmt_size(n: int, pref: int) -> str:
    """Fixed-width size for the summary table; the unit follows ``pref`` (torch's rule)."""
    unit = "B  "
    for new in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if pref < 768 * 1024:
            break
        unit = new
        n //= 1024
        pref /= 1024
    return f"{n:6d} {unit}"


def _fmt_count(n: int, pref: int) -> str:
    unit = " "
    for new in ("K", "M"):
        if pref < 750 * 1000:
            break
        unit = new
        n //= 1000
        pref /= 1000
    return f"{n:7d} {unit} "
