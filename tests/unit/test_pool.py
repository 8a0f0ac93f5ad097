"""Unit tests of runtime.memory.pool.CachingAllocator with a fake raw allocator (pure, no device)."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.errors import InvalidParamError, MemoryAccessError, OutOfMemoryError
from runtime.memory.pool import (Block, CachingAllocator, MemMallocPolicy, format_size)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
HF, HO, NO = MemMallocPolicy.HUGE_FIRST, MemMallocPolicy.HUGE_ONLY, MemMallocPolicy.NORMAL_ONLY
S1, S2, S3 = "stream1", "stream2", "stream3"


class FakeRaw:
    """Address space that records reservations; ``fail`` makes the next reserves raise."""

    BASE = 1 << 40

    def __init__(self):
        self.next = self.BASE
        self.live: dict[int, int] = {}
        self.fail = 0
        self.reserves = 0
        self.releases = 0

    def reserve(self, nbytes: int) -> int:
        if self.fail:
            self.fail -= 1
            raise MemoryError("fake address space is full")
        addr = self.next
        self.next += nbytes + 2 * MiB          # a gap: segments are never adjacent
        self.live[addr] = nbytes
        self.reserves += 1
        return addr

    def release(self, addr: int, nbytes: int) -> None:
        assert self.live.pop(addr) == nbytes, "release does not match a reserve"
        self.releases += 1


class Marker:
    """A stream-ordered ready marker, like an event recorded at free time."""

    def __init__(self, done: bool = False):
        self.done = done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


def make(capacity: int = 64 * MiB, front_cache: int = 0) -> tuple[CachingAllocator, FakeRaw]:
    raw = FakeRaw()
    return CachingAllocator(raw, capacity, device_id=0, front_cache=front_cache), raw


def seg_of(pool: CachingAllocator, block: Block) -> dict:
    return next(s for s in pool.snapshot() if s["address"] == block.segment.addr)


# ---------------------------------------------------------------------- sizes and pools
def test_rounding_to_512_bytes():
    p, _ = make()
    got = [(b.size, b.requested) for b in (p.malloc(n, S1) for n in (1, 511, 512, 513, 1000))]
    assert got == [(512, 1), (512, 511), (512, 512), (1024, 513), (1024, 1000)]
    assert p.allocated == 512 * 3 + 1024 * 2
    assert p.stats()["requested_bytes.all.current"] == 1 + 511 + 512 + 513 + 1000


def test_small_requests_share_2mib_segments():
    p, raw = make()
    a = p.malloc(1000, S1)
    b = p.malloc(4096, S1)
    assert list(raw.live.values()) == [2 * MiB]
    assert b.addr == a.addr + 1024 and a.segment is b.segment
    assert (a.huge, a.pool, a.segment.size) == (False, "small_pool", 2 * MiB)
    c = p.malloc(1 * MiB, S1, HO)               # exactly 1 MiB is small, whatever the policy
    assert c.pool == "small_pool" and not c.huge and c.segment is a.segment
    d = p.malloc(1 * MiB, S1)                   # no room left in the first: a second segment
    assert d.segment is not a.segment and sorted(raw.live.values()) == [2 * MiB, 2 * MiB]
    assert p.reserved == 4 * MiB


def test_large_huge_segment_rounds_to_2mib_and_keeps_small_rests():
    p, raw = make()
    a = p.malloc(1 * MiB + 1, S1)               # large: 1 MiB + 512 -> 2 MiB segment, rest < 1 MiB
    assert (a.pool, a.huge, a.size, a.segment.size) == ("large_pool", True, 2 * MiB, 2 * MiB)
    b = p.malloc(3 * MiB, S1)                   # 4 MiB segment; a 1 MiB rest is not worth a split
    assert (b.size, b.requested, b.segment.size) == (4 * MiB, 3 * MiB, 4 * MiB)
    c = p.malloc(5 * MiB // 2, S1)              # 4 MiB segment, 1.5 MiB rest > 1 MiB: split
    assert (c.size, c.segment.size) == (5 * MiB // 2, 4 * MiB)
    assert [b["state"] for b in seg_of(p, c)["blocks"]] == ["active_allocated", "inactive"]
    assert sorted(raw.live.values()) == [2 * MiB, 4 * MiB, 4 * MiB]
    assert p.stats()["allocated_bytes.large_pool.current"] == 2 * MiB + 4 * MiB + 5 * MiB // 2


def test_normal_only_rounds_to_4kib():
    p, raw = make()
    a = p.malloc(3 * MiB + 100, S1, NO)
    assert (a.huge, a.size, a.segment.size) == (False, 3 * MiB + 4 * KiB, 3 * MiB + 4 * KiB)
    assert list(raw.live.values()) == [3 * MiB + 4 * KiB]


def test_policies_use_their_own_page_kind():
    p, raw = make()
    h = p.malloc(4 * MiB, S1, HO)
    p.free(h)
    n = p.malloc(4 * MiB, S1, NO)               # a cached huge block is not normal pages
    assert not n.huge and n.segment is not h.segment and len(raw.live) == 2
    p.free(n)
    h2 = p.malloc(4 * MiB, S1, HF)              # HUGE_FIRST prefers the cached huge block
    assert h2.huge and h2.addr == h.addr
    n2 = p.malloc(4 * MiB, S1, HF)              # ...and takes a cached normal one before growing
    assert not n2.huge and n2.addr == n.addr and len(raw.live) == 2


def test_huge_first_falls_back_to_normal_pages_huge_only_does_not():
    p, raw = make(capacity=16 * MiB)
    p.malloc(12 * MiB + 512 * KiB, S1, NO)      # 3.5 MiB left: a 4 MiB huge segment cannot fit
    with pytest.raises(OutOfMemoryError) as ei:
        p.malloc(3 * MiB, S1, HO)
    assert "HUGE_ONLY" in str(ei.value)
    b = p.malloc(3 * MiB, S1, HF)
    assert (b.huge, b.segment.size) == (False, 3 * MiB)
    assert p.reserved == 15 * MiB + 512 * KiB


def test_small_and_large_pools_are_separate():
    p, raw = make()
    big = p.malloc(4 * MiB, S1)
    p.free(big)
    small = p.malloc(4096, S1)
    assert small.segment is not big.segment and len(raw.live) == 2


# ---------------------------------------------------------------------- best fit, split, merge
def test_best_fit_picks_the_smallest_block_that_fits():
    p, _ = make()
    sizes = [8 * KiB, 512, 4 * KiB, 512, 16 * KiB, 512]
    blocks = [p.malloc(n, S1) for n in sizes]
    for b in blocks[0::2]:
        p.free(b)                               # holes of 8 KiB, 4 KiB, 16 KiB (+ the rest)
    assert p.malloc(4 * KiB, S1).addr == blocks[2].addr
    x = p.malloc(5000, S1)                      # 5 KiB goes into the 8 KiB hole, split
    assert (x.addr, x.size) == (blocks[0].addr, 5 * KiB)
    rest = [b for b in seg_of(p, x)["blocks"] if b["address"] == x.addr + 5 * KiB]
    assert rest == [{"address": x.addr + 5 * KiB, "size": 3 * KiB, "requested_size": 0,
                     "state": "inactive", "site": "", "stream": None, "pending": False,
                     "parked": False}]
    assert p.malloc(10 * KiB, S1).addr == blocks[4].addr


def test_large_split_only_when_more_than_1mib_remains():
    p, _ = make()
    a = p.malloc(5 * MiB // 2, S1)              # 4 MiB segment, split
    p.free(a)
    assert len(seg_of(p, a)["blocks"]) == 1     # merged back
    b = p.malloc(7 * MiB // 2, S1)              # 0.5 MiB rest: whole block
    assert (b.addr, b.size, b.requested) == (a.addr, 4 * MiB, 7 * MiB // 2)
    p.free(b)
    c = p.malloc(2 * MiB + 512, S1)             # rest 2 MiB - 512 > 1 MiB: split
    assert (c.addr, c.size) == (a.addr, 2 * MiB + 512)


def test_free_merges_both_neighbours():
    p, _ = make()
    a, b, c = (p.malloc(4096, S1) for _ in range(3))
    p.free(a)
    p.free(c)                                   # merges with the segment's rest
    assert [x["size"] for x in seg_of(p, b)["blocks"]] == [4096, 4096, 2 * MiB - 8192]
    assert p.stats()["inactive_split.all.current"] == 2
    p.free(b)                                   # joins both: one block = the whole segment
    blocks = seg_of(p, b)["blocks"]
    assert [(x["address"], x["size"], x["state"]) for x in blocks] == [(a.addr, 2 * MiB, "inactive")]
    st_ = p.stats()
    assert st_["inactive_split.all.current"] == 0 and st_["inactive_split_bytes.all.current"] == 0


def test_every_malloc_returns_a_fresh_handle():
    p, _ = make()
    a = p.malloc(4096, S1)
    p.free(a)
    b = p.malloc(4096, S1)
    assert b.addr == a.addr and b is not a and b.allocated and not a.allocated
    with pytest.raises(MemoryAccessError):
        p.free(a)                               # the stale handle never frees the new block
    assert b.allocated and p.find(b.addr) is b


# ---------------------------------------------------------------------- streams
def test_same_stream_reuses_pending_block_at_once():
    p, _ = make()
    a = p.malloc(4096, S1)
    m = Marker()
    p.free(a, m)
    b = p.malloc(4096, S1)
    assert b.addr == a.addr and m.queries == 0   # no need to ask the marker


def test_other_stream_waits_for_the_marker():
    p, raw = make(capacity=2 * MiB)             # room for one small segment only
    a = p.malloc(4096, S1)
    m = Marker()
    p.free(a, m)                                # the whole segment is pending on S1
    before = p.stats()
    with pytest.raises(OutOfMemoryError):
        p.malloc(4096, S2)
    assert m.queries >= 1
    after = p.stats()
    assert after["num_ooms"] == 1 and after["num_alloc_retries"] == 1
    assert {k: v for k, v in after.items() if not k.startswith("num_")} == \
        {k: v for k, v in before.items() if not k.startswith("num_")}
    m.done = True
    b = p.malloc(4096, S2)
    assert b.addr == a.addr and len(raw.live) == 1


def test_other_stream_gets_other_memory_while_pending():
    p, _ = make()
    a = p.malloc(4096, S1)
    p.free(a, Marker())
    b = p.malloc(4096, S2)
    assert b.segment is not a.segment


@pytest.mark.parametrize("front_cache", [0, 16])
def test_a_retired_handle_keeps_the_marker_of_its_free(front_cache):
    """What the runtime reads to let work queued before the free use the memory (stream-ordered
    frees, docs/memory.md); the memory itself goes on in another block."""
    p, _ = make(front_cache=front_cache)
    a, b = p.malloc(4096, S1), p.malloc(4 * MiB, S1)
    m = Marker()
    p.free(a, m)
    p.free(b)
    assert (a.until, a.allocated, b.until, b.allocated) == (m, False, None, False)
    c = p.malloc(4096, S1)                      # the same memory, a new handle
    assert c.addr == a.addr and c is not a and c.until is None and a.until is m
    with pytest.raises(MemoryAccessError, match="double free"):
        p.free(a, Marker())
    assert a.until is m


def test_memory_carved_from_pending_keeps_its_marker():
    p, _ = make(capacity=2 * MiB)
    a = p.malloc(4096, S1)
    m = Marker()
    p.free(a, m)
    b = p.malloc(4096, S1)                      # from pending memory
    p.free(b)                                   # ready=None: S1's old work may still run
    with pytest.raises(OutOfMemoryError):
        p.malloc(4096, S2)
    m.done = True
    assert p.malloc(4096, S2).addr == a.addr


def test_later_marker_of_a_stream_supersedes_earlier():
    p, _ = make(capacity=2 * MiB)
    a = p.malloc(4096, S1)
    m1, m2 = Marker(), Marker()
    p.free(a, m1)
    b = p.malloc(4096, S1)
    p.free(b, m2)                               # recorded later on S1: covers m1's work
    m2.done = True
    assert p.malloc(4096, S2).addr == a.addr


def test_pending_blocks_of_different_streams_do_not_merge():
    p, raw = make()
    a = p.malloc(4096, S1)
    b = p.malloc(4096, S2)
    m1, m2 = Marker(), Marker()
    p.free(a, m1)
    p.free(b, m2)                               # merges with the ready rest, not with a
    blocks = seg_of(p, a)["blocks"]
    assert [(x["size"], x["stream"], x["pending"]) for x in blocks] == \
        [(4096, S1, True), (2 * MiB - 4096, S2, True)]
    assert p.malloc(4096, S1).addr == a.addr    # each stream reuses its own
    c = p.malloc(8192, S2)
    assert c.addr == b.addr
    p.free(c, m2)
    p.free(p.find(a.addr), m1)
    p.empty_cache()
    assert len(raw.live) == 1                   # markers pending: nothing released
    m1.done = m2.done = True
    p.empty_cache()                             # polls, merges, releases the whole segment
    assert raw.live == {} and p.reserved == 0


def test_empty_cache_keeps_pending_and_used_segments():
    p, raw = make()
    used = p.malloc(4096, S1)
    pend = p.malloc(3 * MiB, S1)
    idle = p.malloc(5 * MiB, S1)
    m = Marker()
    p.free(pend, m)
    p.free(idle)
    assert p.reserved == 2 * MiB + 4 * MiB + 6 * MiB
    p.empty_cache()
    assert sorted(raw.live.values()) == [2 * MiB, 4 * MiB] and p.reserved == 6 * MiB
    assert p.stats()["num_device_free"] == 1
    m.done = True
    p.empty_cache()
    assert list(raw.live.values()) == [2 * MiB]
    assert p.find(used.addr) is used


# ---------------------------------------------------------------------- limits and OOM
def test_oom_message_then_success_after_free():
    p, _ = make(capacity=16 * MiB)
    x = p.malloc(12 * MiB, S1)
    p.malloc(512 * KiB, S1)
    with pytest.raises(OutOfMemoryError) as ei:
        p.malloc(3 * MiB, S1)
    msg = str(ei.value)
    assert msg.startswith(
        "NPU out of memory. Tried to allocate 3.00 MiB (device 0; 16.00 MiB total capacity; "
        "12.50 MiB already allocated; 14.00 MiB reserved in total by the pool; 2.00 MiB free; "
        "limit 16.00 MiB; largest free block 1.50 MiB). Free tensors you no longer need, call "
        "runtime.empty_cache(), reduce the batch size, or raise NPUSIM_HBM_BYTES")
    err = ei.value
    assert isinstance(err, MemoryError) and err.code == 207001
    assert (err.requested, err.capacity, err.reserved, err.largest_free_block) == \
        (3 * MiB, 16 * MiB, 14 * MiB, 3 * MiB // 2)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == msg and again.reserved == 14 * MiB
    st_ = p.stats()
    assert (st_["num_ooms"], st_["num_alloc_retries"]) == (1, 1)
    assert p.allocated == 12 * MiB + 512 * KiB and p.reserved == 14 * MiB
    p.free(x)
    y = p.malloc(3 * MiB, S1)
    assert y.addr == x.addr and p.reserved == 14 * MiB


def test_retry_releases_cached_segments():
    p, raw = make(capacity=16 * MiB)
    x = p.malloc(12 * MiB, S1, HO)
    p.free(x)                                   # 12 MiB cached
    y = p.malloc(6 * MiB, S1, NO)               # does not fit beside it: flush and retry
    assert not y.huge and list(raw.live.values()) == [6 * MiB]
    st_ = p.stats()
    assert (st_["num_alloc_retries"], st_["num_ooms"]) == (1, 0)
    assert (st_["num_device_alloc"], st_["num_device_free"]) == (2, 1)


def test_raw_allocator_failure_is_an_oom_and_changes_nothing():
    p, raw = make()
    a = p.malloc(4096, S1)
    before = p.stats()
    raw.fail = 4                                # huge, normal; then both again after the flush
    with pytest.raises(OutOfMemoryError, match="capacity") as ei:
        p.malloc(4 * MiB, S1)
    assert "address space refused a segment of 4.00 MiB (fake address space is full)" in str(ei.value)
    after = p.stats()
    assert after["num_ooms"] == 1 and after["reserved_bytes.all.current"] == 2 * MiB
    assert after["allocated_bytes.all.allocated"] == before["allocated_bytes.all.allocated"]
    assert p.malloc(4 * MiB, S1).size == 4 * MiB and p.find(a.addr) is a


def test_memory_fraction_limits_reserved():
    p, _ = make(capacity=16 * MiB)
    p.set_memory_fraction(0.5)
    assert (p.limit, p.capacity, p.fraction) == (8 * MiB, 16 * MiB, 0.5)
    p.malloc(6 * MiB, S1)
    with pytest.raises(OutOfMemoryError) as ei:
        p.malloc(3 * MiB, S1, NO)
    assert "limit 8.00 MiB" in str(ei.value)
    assert "set_per_process_memory_fraction" in str(ei.value)
    assert p.reserved == 6 * MiB
    p.set_memory_fraction(1)
    assert p.malloc(3 * MiB, S1).size == 4 * MiB


def test_lowering_the_fraction_releases_cache_or_refuses():
    p, raw = make(capacity=16 * MiB)
    p.malloc(6 * MiB, S1)
    p.free(p.malloc(4 * MiB, S1))
    assert p.reserved == 10 * MiB
    p.set_memory_fraction(0.5)                  # 8 MiB: the cached 4 MiB segment goes
    assert p.reserved == 6 * MiB and p.limit == 8 * MiB
    before = p.stats()
    with pytest.raises(InvalidParamError, match="live allocations"):
        p.set_memory_fraction(0.25)             # 4 MiB < 6 MiB in use
    assert p.limit == 8 * MiB and p.stats() == before


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, 2, True, float("nan"), float("inf"), "0.5", None])
def test_bad_fraction(bad):
    p, _ = make()
    with pytest.raises(InvalidParamError, match="fraction"):
        p.set_memory_fraction(bad)
    assert p.limit == p.capacity


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [0, -1, -4096, True, False, 1.5, 4096.0, "4096", None, [1]])
def test_bad_size_changes_nothing(bad):
    p, raw = make()
    keep = p.malloc(4096, S1)
    before = p.stats()
    with pytest.raises(InvalidParamError) as ei:
        p.malloc(bad, S1)
    msg = str(ei.value)
    assert "nbytes" in msg and (repr(bad) in msg or str(bad) in msg)
    assert p.stats() == before and len(raw.live) == 1 and p.live_blocks() == [keep]


def test_numpy_integer_size_is_accepted():
    p, _ = make()
    assert p.malloc(np.int64(1000), S1).size == 1024


@pytest.mark.parametrize("bad", [3, -1, True, "HUGE_FIRST", None, 1.0])
def test_bad_policy_changes_nothing(bad):
    p, _ = make()
    before = p.stats()
    with pytest.raises(InvalidParamError) as ei:
        p.malloc(4096, S1, bad)
    msg = str(ei.value)
    assert "policy" in msg and all(n in msg for n in ("HUGE_FIRST", "HUGE_ONLY", "NORMAL_ONLY"))
    assert p.stats() == before


def test_policy_as_plain_acl_int():
    p, _ = make()
    assert not p.malloc(3 * MiB, S1, 2).huge and p.malloc(3 * MiB, S1, 1).huge


def test_unhashable_stream_is_rejected():
    p, _ = make()
    before = p.stats()
    with pytest.raises(InvalidParamError, match="stream"):
        p.malloc(4096, [])
    assert p.stats() == before


def test_double_free_says_where_it_was_allocated():
    p, _ = make()
    a = p.malloc(4096, S1, site="train.py:42")
    p.free(a)
    before = p.stats()
    with pytest.raises(MemoryAccessError) as ei:
        p.free(a)
    msg = str(ei.value)
    assert "already freed" in msg and "train.py:42" in msg and f"0x{a.addr:x}" in msg
    assert p.stats() == before


def test_free_of_foreign_or_bad_objects():
    p, _ = make()
    q, _ = make()
    b = q.malloc(4096, S1)
    before = p.stats()
    with pytest.raises(MemoryAccessError, match="does not belong"):
        p.free(b)
    with pytest.raises(InvalidParamError):
        p.free(None)
    with pytest.raises(InvalidParamError):
        p.free(b.addr)
    a = p.malloc(4096, S1)
    with pytest.raises(InvalidParamError, match="query"):
        p.free(a, ready=42)
    assert a.allocated and p.find(a.addr) is a
    p.free(a)
    assert p.stats()["allocation.all.current"] == before["allocation.all.current"]


# ---------------------------------------------------------------------- queries and stats
def test_find_live_block_by_start_or_interior():
    p, _ = make()
    a = p.malloc(4096, S1)
    b = p.malloc(1000, S1)
    assert p.find(a.addr) is a and p.find(a.addr + 4095) is a and p.find(a.addr + 4096) is b
    assert p.find(b.addr + 1023) is b
    assert p.find(b.addr + 1024) is None          # the free rest of the segment
    assert p.find(a.addr - 1) is None and p.find(0) is None
    assert p.find(a.addr + 64 * MiB) is None
    p.free(a)
    assert p.find(a.addr) is None and p.find(a.addr + 10) is None


def test_stats_after_a_scripted_sequence():
    p, _ = make()
    a = p.malloc(1000, S1)                      # small: 1024 of a new 2 MiB segment
    b = p.malloc(3 * MiB, S1)                   # large: whole 4 MiB segment
    c = p.malloc(5 * MiB // 2, S1)              # large: 2.5 MiB of a 4 MiB segment
    p.free(a)
    p.free(b)
    s = p.stats()
    want = {
        "allocated_bytes.all": (5 * MiB // 2, 1024 + 13 * MiB // 2, 1024 + 13 * MiB // 2, 1024 + 4 * MiB),
        "allocated_bytes.small_pool": (0, 1024, 1024, 1024),
        "allocated_bytes.large_pool": (5 * MiB // 2, 13 * MiB // 2, 13 * MiB // 2, 4 * MiB),
        "active_bytes.all": (5 * MiB // 2, 1024 + 13 * MiB // 2, 1024 + 13 * MiB // 2, 1024 + 4 * MiB),
        "requested_bytes.all": (5 * MiB // 2, 1000 + 11 * MiB // 2, 1000 + 11 * MiB // 2, 1000 + 3 * MiB),
        "reserved_bytes.all": (10 * MiB, 10 * MiB, 10 * MiB, 0),
        "reserved_bytes.small_pool": (2 * MiB, 2 * MiB, 2 * MiB, 0),
        "reserved_bytes.large_pool": (8 * MiB, 8 * MiB, 8 * MiB, 0),
        "allocation.all": (1, 3, 3, 2),
        "allocation.small_pool": (0, 1, 1, 1),
        "active.large_pool": (1, 2, 2, 1),
        "segment.all": (3, 3, 3, 0),
        "segment.large_pool": (2, 2, 2, 0),
        "inactive_split.all": (1, 2, 2, 1),
        "inactive_split_bytes.all": (3 * MiB // 2, 7 * MiB // 2 - 1024, 7 * MiB // 2 - 1024,
                                     2 * MiB - 1024),
        "inactive_split_bytes.small_pool": (0, 2 * MiB - 1024, 2 * MiB - 1024, 2 * MiB - 1024),
        "inactive_split_bytes.large_pool": (3 * MiB // 2, 3 * MiB // 2, 3 * MiB // 2, 0),
    }
    for key, vals in want.items():
        got = tuple(s[f"{key}.{f}"] for f in ("current", "peak", "allocated", "freed"))
        assert got == vals, key
    assert (s["num_device_alloc"], s["num_device_free"], s["num_ooms"], s["num_alloc_retries"]) == \
        (3, 0, 0, 0)
    assert len(s) == 9 * 3 * 4 + 4
    p.empty_cache()                             # the small segment and b's segment go
    s = p.stats()
    assert (s["reserved_bytes.all.current"], s["reserved_bytes.all.freed"]) == (4 * MiB, 6 * MiB)
    assert (s["segment.all.current"], s["segment.all.freed"], s["num_device_free"]) == (1, 2, 2)
    assert (p.allocated, p.reserved, p.max_allocated, p.max_reserved) == \
        (5 * MiB // 2, 4 * MiB, 1024 + 13 * MiB // 2, 10 * MiB)
    p.free(c)


def test_reset_peak_and_accumulated_stats():
    p, _ = make()
    a = p.malloc(8 * MiB, S1)
    p.free(a)
    p.malloc(4096, S1)
    assert p.stats()["allocated_bytes.all.peak"] == 8 * MiB
    p.reset_peak_stats()
    s = p.stats()
    assert s["allocated_bytes.all.peak"] == 4096 and s["reserved_bytes.all.peak"] == 10 * MiB
    assert s["allocated_bytes.large_pool.peak"] == 0 and s["allocated_bytes.all.allocated"] == 8 * MiB + 4096
    p.reset_accumulated_stats()
    p.malloc(512, S1)
    s = p.stats()
    assert (s["allocated_bytes.all.allocated"], s["allocated_bytes.all.freed"]) == (512, 0)
    assert s["allocated_bytes.all.current"] == 4096 + 512 and s["num_device_alloc"] == 0


def test_snapshot_structure():
    p, _ = make()
    a = p.malloc(1000, S1, site="a.py:1")
    b = p.malloc(3 * MiB, S2, site="b.py:2")
    snap = p.snapshot()
    assert [s["address"] for s in snap] == sorted([a.segment.addr, b.segment.addr])
    small = seg_of(p, a)
    assert small == {
        "device": 0, "address": a.addr, "total_size": 2 * MiB, "allocated_size": 1024,
        "requested_size": 1000, "stream": S1, "segment_type": "small", "huge": False,
        "blocks": [
            {"address": a.addr, "size": 1024, "requested_size": 1000, "state": "active_allocated",
             "site": "a.py:1", "stream": S1, "pending": False, "parked": False},
            {"address": a.addr + 1024, "size": 2 * MiB - 1024, "requested_size": 0,
             "state": "inactive", "site": "", "stream": None, "pending": False,
             "parked": False}]}
    large = seg_of(p, b)
    assert (large["segment_type"], large["huge"], large["total_size"], large["stream"]) == \
        ("large", True, 4 * MiB, S2)
    assert p.live_blocks() == sorted([a, b], key=lambda x: x.addr)


def test_summary_table():
    p, _ = make()
    p.malloc(3 * MiB, S1)
    p.malloc(1000, S1)
    text = p.summary()
    for row in ("Allocated memory", "Active memory", "Requested memory", "Device reserved memory",
                "Non-releasable memory", "Allocations", "Active allocs",
                "Device reserved segments", "from large pool", "from small pool",
                "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed", "device ID 0", "NPU OOMs: 0"):
        assert row in text, row
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1          # a rectangular table
    reserved = next(line for line in lines if "Device reserved memory" in line)
    assert reserved.count("6144 KiB") == 3                  # torch units: current, peak, total
    allocs = next(line for line in lines if "| Allocations" in line)
    assert allocs.split("|")[2].strip() == "2"


def test_format_size():
    assert [format_size(n) for n in (0, 512, 1536, 3 * GiB, 12 * MiB + 512 * KiB)] == \
        ["0 B", "512 B", "1.50 KiB", "3.00 GiB", "12.50 MiB"]


def test_release_all_reports_leaks_and_returns_everything():
    p, raw = make()
    a = p.malloc(4096, S1, site="leak.py:3")
    b = p.malloc(3 * MiB, S2)
    p.free(p.malloc(8192, S1), Marker())
    leaks = p.release_all()
    assert [x.site for x in leaks] == ["leak.py:3", ""] and leaks == [a, b]
    assert raw.live == {} and p.reserved == 0 and p.allocated == 0 and not a.allocated
    assert p.stats()["inactive_split.all.current"] == 0


# ---------------------------------------------------------------------- cached malloc + free
def _block(b: Block):
    return (b.addr, b.size, b.requested, b.stream, b.site, b.allocated, b.pending, b.huge,
            b.segment.addr, b.gen)


@pytest.mark.parametrize("first, then", [
    (MiB, MiB),                         # small: split off a whole segment, merged back
    (4096, 4096),
    (1000, 1024),                       # same block, more bytes requested (a new peak)
    (3 * MiB, 3 * MiB),                 # large: a whole 4 MiB segment
    (3 * MiB, 3 * MiB + 5000),          # large: another size takes the unsplit block back
    (5 * MiB // 2, 5 * MiB // 2),       # large: split, the 1.5 MiB rest merged and split again
])
@pytest.mark.parametrize("around", ["nothing", "before", "after"])
def test_cached_malloc_free_takes_the_memory_back(first, then, around):
    p, raw = make()
    if around == "before":
        p.malloc(4096, S1)
    a = p.malloc(first, S1, site="first")
    if around == "after":                       # the next block is in use: nothing to merge
        p.malloc(first, S1)
    before = (p.snapshot(), p.reserved, raw.reserves)
    gens = [a.gen]
    for i in range(4):
        p.free(a)
        assert a.gen == 0 and not a.allocated
        b = p.malloc(then, S2 if i == 2 else S1, site=f"then{i}")   # any stream: it is ready
        assert b.allocated and b.gen > max(gens) and b is not a and b.addr == a.addr
        with pytest.raises(MemoryAccessError, match="double free"):
            p.free(a)                                   # the old handle is retired for good
        gens.append(b.gen)
        a = b
    layout = [[(x["address"], x["size"], x["state"]) for x in seg["blocks"]] for seg in p.snapshot()]
    assert layout == [[(x["address"], x["size"], x["state"]) for x in seg["blocks"]]
                      for seg in before[0]]             # the same tiling as after the first malloc
    assert (p.reserved, raw.reserves) == before[1:]
    st_ = p.stats()
    assert (st_["allocation.all.allocated"], st_["allocation.all.freed"]) == \
        (5 + (around != "nothing"), 4)


def test_a_free_block_of_the_same_size_and_lower_address_wins():
    p, _ = make()
    lo, _g1, hi, _g2 = (p.malloc(n, S1) for n in (4096, 512, 4096, 512))
    p.free(lo)
    p.free(hi)                                  # two free 4 KiB blocks
    assert p.malloc(4096, S1).addr == lo.addr   # best fit: same size, lower address
    assert p.malloc(4096, S1).addr == hi.addr


def test_the_streams_pending_block_is_a_fit_like_a_ready_one():
    p, _ = make()
    a, _g1, b, _g2 = (p.malloc(n, S1) for n in (4096, 512, 4096, 512))
    p.free(a, Marker())                         # pending on S1, lower address
    p.free(b)                                   # ready
    assert p.malloc(4096, S1).addr == a.addr    # S1 may reuse its pending block, a better fit
    assert p.malloc(4096, S2).addr == b.addr


def test_peaks_across_a_cached_malloc_free():
    p, _ = make()
    a = p.malloc(8 * MiB, S1)
    p.free(a)
    p.reset_peak_stats()                        # the peaks drop to 0
    assert p.max_allocated == 0 and p.stats()["requested_bytes.all.peak"] == 0
    b = p.malloc(8 * MiB, S1)
    assert b.addr == a.addr and p.max_allocated == 8 * MiB
    p.free(b)
    c = p.malloc(8 * MiB - 512, S1)             # the same block back, fewer bytes requested
    st_ = p.stats()
    assert c.addr == a.addr and (st_["requested_bytes.all.current"],
                                 st_["requested_bytes.all.peak"]) == (8 * MiB - 512, 8 * MiB)
    assert st_["allocation.all.allocated"] == 3 and st_["allocation.all.freed"] == 2


# ---------------------------------------------------------------------- property test
class _StreamState:
    """Stream-ordered markers: marker i is done once the stream has completed i tasks."""

    def __init__(self):
        self.issued = 0
        self.done = 0


class _OrderedMarker:
    def __init__(self, s: _StreamState, value: int):
        self.s, self.value = s, value

    def query(self) -> bool:
        return self.s.done >= self.value


def _check(p: CachingAllocator, raw: FakeRaw, guards: list) -> None:
    snap = p.snapshot()
    stats = p.stats()
    assert {s["address"]: s["total_size"] for s in snap} == raw.live
    per = {pool: dict.fromkeys(("alloc", "req", "n", "res", "segs", "inact", "inact_n"), 0)
           for pool in ("small_pool", "large_pool")}
    live = []
    free_bytes = 0
    for seg in snap:
        acc = per["small_pool" if seg["segment_type"] == "small" else "large_pool"]
        acc["res"] += seg["total_size"]
        acc["segs"] += 1
        addr = seg["address"]
        blocks = seg["blocks"]
        for i, b in enumerate(blocks):               # blocks tile the segment exactly
            assert b["address"] == addr and b["size"] > 0 and b["size"] % 512 == 0
            addr += b["size"]
            if b["state"] == "active_allocated":
                assert not b["parked"]
                live.append((b["address"], b["size"]))
                acc["alloc"] += b["size"]
                acc["req"] += b["requested_size"]
                acc["n"] += 1
            else:
                free_bytes += b["size"]
                if len(blocks) > 1:
                    acc["inact"] += b["size"]
                    acc["inact_n"] += 1
                parked = b["parked"] or i and blocks[i - 1]["parked"]
                if i and blocks[i - 1]["state"] == "inactive" and not parked:
                    prev = blocks[i - 1]                    # merging is complete (but parked)
                    assert prev["pending"] or b["pending"], "two ready free neighbours"
                    assert not (prev["pending"] and b["pending"] and prev["stream"] == b["stream"])
        assert addr == seg["address"] + seg["total_size"]
    parked = [b for seg in snap for b in seg["blocks"] if b["parked"]]
    assert all(b["state"] == "inactive" and b["size"] <= MiB for b in parked)
    assert len(parked) <= (p._front.limit if p._front is not None else 0)
    live.sort()
    for (a0, n0), (a1, _) in zip(live, live[1:]):
        assert a0 + n0 <= a1, "live blocks overlap"
    total = {k: sum(per[pool][k] for pool in per) for k in per["small_pool"]}
    assert total["alloc"] + free_bytes == total["res"] == p.reserved
    assert p.reserved <= p.limit <= p.capacity
    for pool, acc in list(per.items()) + [("all", total)]:
        for key, val in (("allocated_bytes", acc["alloc"]), ("active_bytes", acc["alloc"]),
                         ("requested_bytes", acc["req"]), ("allocation", acc["n"]),
                         ("active", acc["n"]), ("reserved_bytes", acc["res"]),
                         ("segment", acc["segs"]), ("inactive_split_bytes", acc["inact"]),
                         ("inactive_split", acc["inact_n"])):
            cur = stats[f"{key}.{pool}.current"]
            assert cur == val, (key, pool)
            assert stats[f"{key}.{pool}.peak"] >= cur
            assert stats[f"{key}.{pool}.allocated"] - stats[f"{key}.{pool}.freed"] == cur
    assert len(p.live_blocks()) == total["n"]
    for lo, n in live:
        assert p.find(lo) is p.find(lo + n - 1) is not None
    # No memory freed under a pending marker went to another stream before the marker was done.
    guards[:] = [g for g in guards if not g[3].query()]


_sizes = st.one_of(st.integers(1, 8 * KiB), st.integers(1, 1 * MiB), st.integers(1, 8 * MiB))
_ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), _sizes, st.integers(0, 2), st.sampled_from(list(MemMallocPolicy))),
    st.tuples(st.just("alloc"), _sizes, st.integers(0, 2), st.sampled_from(list(MemMallocPolicy))),
    # a free: idle (False), pending on its stream (True), or shared (record_stream: pending for
    # every stream, its own included)
    st.tuples(st.just("free"), st.integers(0, 10 ** 6), st.sampled_from([False, True, "shared"])),
    st.tuples(st.just("free"), st.integers(0, 10 ** 6), st.sampled_from([False, True, "shared"])),
    st.tuples(st.just("progress"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("empty_cache")),
    st.tuples(st.just("fraction"), st.sampled_from([0.25, 0.5, 0.75, 1.0])),
    # free, then about the same size again on the same stream (what the front cache serves)
    st.tuples(st.just("again"), st.integers(0, 10 ** 6), st.booleans(), st.integers(-600, 600)),
), max_size=50)


@pytest.mark.parametrize("front_cache", [0, 2, 16])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_random_sequences_keep_invariants(front_cache, ops):
    """Also with a front cache: parked blocks are free memory in every statistic."""
    p, raw = make(capacity=40 * MiB, front_cache=front_cache)
    streams = [_StreamState() for _ in range(3)]
    live: list[tuple[Block, int]] = []
    guards: list[tuple[int, int, int, _OrderedMarker]] = []   # (lo, hi, stream, marker)
    def alloc(n, si, policy):
        try:
            b = p.malloc(n, si, policy)
        except OutOfMemoryError as e:
            assert "capacity" in str(e)
        else:
            assert b.requested == n and b.size >= n and b.stream == si
            for lo, hi, gs, m in guards:        # gs -1: a shared free, no stream may reuse
                if gs != si and lo < b.addr + b.size and b.addr < hi:
                    assert m.query(), "pending memory handed to another stream"
            live.append((b, si))

    for op in ops:
        if op[0] == "alloc":
            alloc(*op[1:])
        elif op[0] in ("free", "again") and live:
            b, si = live.pop(op[1] % len(live))
            if op[2]:
                s = streams[si]
                s.issued += 1
                m = _OrderedMarker(s, s.issued)
                shared = op[2] == "shared"
                guards.append((b.addr, b.addr + b.size, -1 if shared else si, m))
                p.free(b, m, shared=shared)
                assert b.until is m
            else:
                p.free(b)
            if op[0] == "again":
                _check(p, raw, guards)
                alloc(max(1, b.requested + op[3]), si, MemMallocPolicy.HUGE_FIRST)
        elif op[0] == "progress":
            s = streams[op[1]]
            s.done = min(s.issued, s.done + op[2])
        elif op[0] == "empty_cache":
            p.empty_cache()
        elif op[0] == "fraction":
            limit = p.limit
            try:
                p.set_memory_fraction(op[1])
            except InvalidParamError:
                assert p.limit == limit and p.reserved > int(p.capacity * op[1])
            else:
                assert p.limit == int(p.capacity * op[1])
        _check(p, raw, guards)
    for b, _ in live:
        p.free(b)
    for s in streams:
        s.done = s.issued
    p.empty_cache()
    assert raw.live == {} and p.reserved == 0 and p.allocated == 0
    _check(p, raw, guards)



# ---------------------------------------------------------------------- reference model
class _RefBlock:
    def __init__(self, addr, size, seg, stream, pending=None, seq=0):
        self.addr, self.size, self.seg, self.stream = addr, size, seg, stream
        self.pending, self.seq, self.allocated, self.requested = pending, seq, False, 0


class RefPool:
    """The pool's policy written naively: every block in a per-segment list, every fit a scan.

    Segments are ``[kind, addr, size, blocks]``; kinds 0 small, 1 large huge, 2 large normal.
    """

    KINDS = {HF: (1, 2), HO: (1,), NO: (2,)}

    def __init__(self, capacity: int):
        self.raw, self.capacity, self.limit, self.segs, self.seq = FakeRaw(), capacity, capacity, [], 0
        self.peaks = [0, 0]                                   # allocated, reserved

    reserved = property(lambda self: sum(s[2] for s in self.segs))
    allocated = property(lambda self: sum(b.size for s in self.segs for b in s[3] if b.allocated))

    def _fit(self, size, stream, kinds):
        for kind in kinds:
            fits = [b for s in self.segs if s[0] == kind for b in s[3] if not b.allocated and
                    b.size >= size and (b.pending is None or b.stream == stream)]
            if fits:
                return min(fits, key=lambda b: (b.size, b.addr))
        return None

    def _merge(self, b, stream):
        blocks = b.seg[3]
        i = blocks.index(b)
        lo = hi = i
        ok = lambda x: not x.allocated and (x.pending is None or x.stream == stream)  # noqa: E731
        while lo > 0 and ok(blocks[lo - 1]):
            lo -= 1
        while hi + 1 < len(blocks) and ok(blocks[hi + 1]):
            hi += 1
        for x in blocks[lo:hi + 1]:
            if x.pending is not None and (b.pending is None or x.seq > b.seq):
                b.pending, b.seq = x.pending, x.seq
        b.addr, b.size = blocks[lo].addr, sum(x.size for x in blocks[lo:hi + 1])
        blocks[lo:hi + 1] = [b]

    def _poll(self):
        done = [b for s in self.segs for b in s[3]
                if not b.allocated and b.pending is not None and b.pending.query()]
        for b in done:
            b.pending = None
            self._merge(b, object())
        return done

    def _new_segment(self, size, stream, kinds):
        for kind in kinds:
            page = 2 * MiB if kind == 1 else 4096
            seg_size = 2 * MiB if kind == 0 else -(-size // page) * page
            if self.reserved + seg_size <= self.limit:
                seg = [kind, self.raw.reserve(seg_size), seg_size, []]
                seg[3].append(_RefBlock(seg[1], seg_size, seg, stream))
                self.segs.append(seg)
                return seg[3][0]
        return None

    def _release_cached(self):
        self._poll()
        keep = []
        for s in self.segs:
            if len(s[3]) == 1 and not s[3][0].allocated and s[3][0].pending is None:
                self.raw.release(s[1], s[2])
            else:
                keep.append(s)
        self.segs = keep

    def malloc(self, n, stream, policy):
        size = -(-n // 512) * 512
        kinds = (0,) if size <= MiB else self.KINDS[policy]
        b = self._fit(size, stream, kinds)
        if b is None and self._poll():
            b = self._fit(size, stream, kinds)
        b = b or self._new_segment(size, stream, kinds)
        if b is None:
            self._release_cached()
            b = self._new_segment(size, stream, kinds)
            if b is None:
                raise OutOfMemoryError("capacity")
        rest = b.size - size
        if rest > MiB or (rest and b.seg[0] == 0):
            blocks = b.seg[3]
            blocks.insert(blocks.index(b) + 1, _RefBlock(b.addr + size, rest, b.seg, b.stream,
                                                         b.pending, b.seq))
            b.size = size
        b.allocated, b.requested, b.stream = True, n, stream
        self._peaks()
        return b

    def free(self, b, ready):
        b.allocated = False
        if ready is not None:
            self.seq += 1
            b.pending, b.seq = ready, self.seq
        self._merge(b, b.stream)

    def set_memory_fraction(self, fraction):
        limit = int(self.capacity * fraction)
        if self.reserved > limit:
            self._poll()
            whole = sum(s[2] for s in self.segs if len(s[3]) == 1 and not s[3][0].allocated and
                        s[3][0].pending is None)
            if self.reserved - whole > limit:
                raise InvalidParamError("fraction")
            self._release_cached()
        self.limit = limit

    def _peaks(self):
        self.peaks = [max(self.peaks[0], self.allocated), max(self.peaks[1], self.reserved)]

    def layout(self):
        return [(s[1], s[2], s[0], [(b.addr, b.size, b.allocated, b.requested if b.allocated else 0,
                                     b.pending is not None and not b.allocated,
                                     b.stream if b.allocated or b.pending is not None else None)
                                    for b in s[3]]) for s in sorted(self.segs, key=lambda s: s[1])]


def _layout(p: CachingAllocator):
    kinds = {(True, False): 0, (False, True): 1, (False, False): 2}
    return [(s.addr, s.size, kinds[s.kind == 0, s.huge],
             [(b.addr, b.size, b.allocated, b.requested if b.allocated else 0,
               b.pending is not None and not b.allocated,
               b.stream if b.allocated or b.pending is not None else None) for b in s.blocks()])
            for s in p.segments()]


_ref_sizes = st.one_of(st.sampled_from([512, 4096, MiB, MiB - 100, 2 * MiB, 5 * MiB // 2,
                                        3 * MiB, 4 * MiB]),
                       st.integers(1, 8 * KiB), st.integers(1, 8 * MiB))
_ref_ops = st.lists(st.one_of(
    st.tuples(st.just("alloc"), _ref_sizes, st.integers(0, 2), st.sampled_from([HF, HF, HO, NO])),
    st.tuples(st.just("free"), st.integers(0, 10 ** 6),
              st.sampled_from([None, None, "new", "done"])),
    st.tuples(st.just("again"), st.integers(0, 10 ** 6), st.integers(-600, 600), st.integers(0, 3)),
    st.tuples(st.just("progress"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("empty_cache"),),
    st.tuples(st.just("fraction"), st.sampled_from([0.5, 1.0])),
    st.tuples(st.just("reset_peak"),),
), max_size=60)


def _malloc_both(p, ref, live, n, stream, policy):
    got = []
    for pool in (p, ref):
        try:
            got.append(pool.malloc(n, stream, policy))
        except OutOfMemoryError:
            got.append(None)
    assert (got[0] is None) == (got[1] is None), (n, stream, policy)
    if got[0] is not None:
        assert (got[0].addr, got[0].size) == (got[1].addr, got[1].size), (n, stream, policy)
        live.append(tuple(got))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ref_ops)
def test_random_sequences_match_the_reference_model(ops):
    """The pool against ``RefPool``: every malloc's memory, the block layout, the peaks."""
    p, ref = CachingAllocator(FakeRaw(), 40 * MiB), RefPool(40 * MiB)
    live: list[tuple[Block, _RefBlock]] = []
    streams = [_StreamState() for _ in range(3)]
    for op in ops:
        if op[0] == "progress":
            s = streams[op[1]]
            s.done = min(s.issued, s.done + op[2])
        elif op[0] in ("free", "again") and live:
            b, r = live.pop(op[1] % len(live))
            how, m = (op[2] if op[0] == "free" else None), None
            if how is not None:                       # one marker, shared by both pools
                s = streams[b.stream]
                s.issued += how == "new"
                m = _OrderedMarker(s, s.issued if how == "new" else s.done)
            p.free(b, m)
            ref.free(r, m)
            if op[0] == "again":                      # a cached malloc + free, roughly
                _malloc_both(p, ref, live, max(1, b.requested + op[2]),
                             b.stream if op[3] == 3 else op[3], HF)
        elif op[0] == "alloc":
            _malloc_both(p, ref, live, *op[1:])
        elif op[0] == "empty_cache":
            p.empty_cache()
            ref._release_cached()
        elif op[0] == "fraction":
            refused = []
            for pool in (p, ref):
                try:
                    pool.set_memory_fraction(op[1])
                except InvalidParamError:
                    refused.append(pool)
            assert len(refused) in (0, 2), op
        elif op[0] == "reset_peak":
            p.reset_peak_stats()
            ref.peaks = [ref.allocated, ref.reserved]
        ref._peaks()
        assert _layout(p) == ref.layout(), op
        assert (p.allocated, p.reserved, p.max_allocated, p.max_reserved) == (
            ref.allocated, ref.reserved, *ref.peaks), op
