"""The pool's front cache: parked small blocks, taken back by the same stream and size only."""
from __future__ import annotations

import pytest

import runtime
from runtime.errors import InvalidParamError, MemoryAccessError, OutOfMemoryError
from runtime.memory.front_cache import FrontCache
from runtime.memory.pool import CachingAllocator

KiB, MiB = 1 << 10, 1 << 20
S1, S2 = "stream1", "stream2"


class FakeRaw:
    def __init__(self):
        self.next = 1 << 40
        self.live: dict[int, int] = {}

    def reserve(self, nbytes: int) -> int:
        addr = self.next
        self.next += nbytes + 2 * MiB
        self.live[addr] = nbytes
        return addr

    def release(self, addr: int, nbytes: int) -> None:
        assert self.live.pop(addr) == nbytes


class Marker:
    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done


def make(capacity=64 * MiB, front_cache=4):
    raw = FakeRaw()
    return CachingAllocator(raw, capacity, front_cache=front_cache), raw


def blocks_of(p):
    return [(b["address"], b["size"], b["state"], b["parked"])
            for seg in p.snapshot() for b in seg["blocks"]]


def stat(p, key):
    return p.stats()[key]


def test_a_freed_small_block_is_parked_and_taken_back_by_the_same_stream_and_size():
    p, raw = make()
    a = p.malloc(MiB, S1, site="a")
    p.free(a)
    seg = a.segment.addr
    assert blocks_of(p) == [(seg, MiB, "inactive", True), (seg + MiB, MiB, "inactive", False)]
    b = p.malloc(MiB - 100, S1, site="b")            # same rounded size: the parked block
    assert b.addr == a.addr and b is not a and b.gen > 0 and b.site == "b"
    assert blocks_of(p) == [(seg, MiB, "active_allocated", False),
                            (seg + MiB, MiB, "inactive", False)]
    with pytest.raises(MemoryAccessError, match="double free"):
        p.free(a)                                    # the old handle stays retired
    assert len(raw.live) == 1


def test_a_parked_block_is_free_memory_in_every_statistic():
    p, _ = make()
    a = p.malloc(4096, S1)
    p.free(a)                                        # parked next to the 2 MiB - 4 KiB rest
    st = p.stats()
    assert (st["allocated_bytes.all.current"], st["allocation.all.current"]) == (0, 0)
    assert st["requested_bytes.all.current"] == 0
    assert st["reserved_bytes.all.current"] == 2 * MiB
    assert (st["inactive_split_bytes.all.current"], st["inactive_split.all.current"]) == (
        2 * MiB, 2)                                  # two free pieces of a split segment
    assert (st["allocation.all.allocated"], st["allocation.all.freed"]) == (1, 1)
    assert p.allocated == 0 and p.largest_free_block() == 2 * MiB - 4096
    b = p.malloc(4000, S1)
    st = p.stats()
    assert b.addr == a.addr
    assert (st["allocated_bytes.all.current"], st["requested_bytes.all.current"]) == (4096, 4000)
    assert (st["inactive_split_bytes.all.current"], st["inactive_split.all.current"]) == (
        2 * MiB - 4096, 1)
    assert (st["allocation.all.allocated"], st["allocation.all.freed"]) == (2, 1)
    assert st["allocated_bytes.all.peak"] == 4096 and st["requested_bytes.all.peak"] == 4096
    assert st["inactive_split_bytes.all.peak"] == 2 * MiB


def test_another_stream_or_size_never_gets_a_parked_block():
    p, _ = make()
    a = p.malloc(MiB, S1)
    p.free(a)
    b = p.malloc(MiB, S2)                            # the segment's free rest, not the parked one
    assert b.addr == a.addr + MiB
    assert [x[3] for x in blocks_of(p) if x[0] == a.addr] == [True]
    c = p.malloc(512 * KiB, S1)                      # another size: no fit, so the cache is
    assert c.addr == a.addr and p.reserved == 2 * MiB   # flushed before a segment is reserved
    assert not any(x[3] for x in blocks_of(p))


def test_a_block_in_use_is_never_parked_twice_or_handed_out_twice():
    p, _ = make()
    a, b = p.malloc(MiB, S1), p.malloc(MiB, S1)      # both halves of one segment
    p.free(a)
    c = p.malloc(MiB, S1)                            # takes the parked block back
    d = p.malloc(MiB, S1)                            # nothing parked now: a new segment
    assert c.addr == a.addr and d.addr not in (a.addr, b.addr)
    assert len({x.addr for x in (b, c, d)}) == 3


def test_a_pending_block_goes_back_only_to_its_stream_until_the_marker_completes():
    p, _ = make(capacity=2 * MiB)
    a, b = p.malloc(MiB, S1), p.malloc(MiB, S1)
    m = Marker()
    p.free(a, m)                                     # parked with S1's unfinished work
    with pytest.raises(OutOfMemoryError):
        p.malloc(MiB, S2)                            # flushed, but still S1's until m is done
    assert [x for x in p.snapshot()[0]["blocks"] if x["address"] == a.addr][0]["pending"]
    c = p.malloc(MiB, S1)                            # stream order makes S1's reuse safe
    assert c.addr == a.addr and c.pending is m
    p.free(c)                                        # carries the marker: still pending
    m.done = True
    d = p.malloc(MiB, S2)
    assert d.addr == a.addr and p.reserved == 2 * MiB
    p.free(b)
    p.free(d)


def test_a_malloc_without_a_fit_flushes_the_cache_before_reserving():
    p, raw = make(capacity=2 * MiB)
    a = p.malloc(MiB, S1)
    p.free(a)                                        # parked + a free 1 MiB rest
    b = p.malloc(2 * MiB, S1)                        # large: the small segment must go
    assert len(raw.live) == 1 and b.size == 2 * MiB
    assert p.stats()["num_alloc_retries"] == 1 and p.reserved == 2 * MiB
    p.free(b)                                        # large blocks are never parked
    assert not any(x[3] for x in blocks_of(p)) and p.stats()["inactive_split.all.current"] == 0


def test_empty_cache_and_memory_fraction_release_parked_blocks():
    p, raw = make()
    blocks = [p.malloc(MiB, S1) for _ in range(4)]
    for b in blocks:
        p.free(b)
    assert p.reserved == 4 * MiB and sum(x[3] for x in blocks_of(p)) == 4
    p.set_memory_fraction(1 / 64)                    # 1 MiB: only after flushing and releasing
    assert p.reserved == 0 and raw.live == {}
    p.set_memory_fraction(1.0)
    p.free(p.malloc(MiB, S1))
    p.empty_cache()
    assert p.reserved == 0 and raw.live == {} and blocks_of(p) == []


def test_a_full_cache_lets_frees_merge_as_usual():
    p, _ = make(front_cache=2)
    blocks = [p.malloc(MiB, S1) for _ in range(4)]   # two segments, each in two halves
    for b in blocks:
        p.free(b)
    states = blocks_of(p)
    assert sum(x[3] for x in states) == 2            # the first two parked
    assert (blocks[2].segment.addr, 2 * MiB, "inactive", False) in states   # merged whole


def test_release_all_flushes_parked_blocks():
    p, raw = make()
    p.free(p.malloc(MiB, S1))
    leak = p.malloc(4096, S2)
    assert p.release_all() == [leak] and raw.live == {} and p.reserved == 0


def test_front_cache_size_is_checked():
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidParamError, match="front_cache"):
            CachingAllocator(FakeRaw(), 64 * MiB, front_cache=bad)


def test_front_cache_container():
    class B:
        def __init__(self, stream, size):
            self.stream, self.size, self.parked = stream, size, False
    fc = FrontCache(limit=3)
    x, y, z = B(S1, 512), B(S1, 512), B(S2, 512)
    for b in (x, y, z):
        fc.park(b)
    assert fc.count == 3 and x.parked and fc.largest() == 512
    assert fc.take(S1, 512) is y and fc.take(S1, 512) is x and fc.take(S1, 512) is None
    assert not x.parked and fc.take(S2, 1024) is None
    assert fc.drain() == [z] and fc.count == 0 and z.parked


@pytest.fixture
def device():
    runtime.set_device(0)
    yield
    runtime.reset_device(0)


def test_runtime_pool_parks_and_every_query_sees_it(device):
    a = runtime.malloc(MiB)
    addr = a.addr
    runtime.free(a)
    assert runtime.memory_allocated() == 0 and runtime.memory_reserved() == 2 * MiB
    assert runtime.memory_stats()["allocation.all.current"] == 0
    rows = [b for seg in runtime.memory_snapshot() for b in seg["blocks"]]
    assert [(b["address"] == addr, b["state"], b["parked"]) for b in rows] == [
        (True, "inactive", True), (False, "inactive", False)]
    b = runtime.malloc(MiB)
    assert b.addr == addr
    with pytest.raises(MemoryAccessError):
        runtime.free(a)                              # the stale pointer is still caught
    runtime.free(b)
    runtime.empty_cache()
    assert runtime.memory_reserved() == 0 and runtime.memory_snapshot() == []


def test_runtime_stream_ordered_free_is_reused_by_its_stream_only(device):
    s1, s2 = runtime.Stream(), runtime.Stream()
    gate = __import__("threading").Event()
    with runtime.stream(s1):
        a = runtime.malloc(MiB)
        runtime.launch(lambda: gate.wait(30), stream=s1)
        runtime.free(a)                              # s1 still busy: parked, pending on s1
        b = runtime.malloc(MiB)                      # s1 itself may take it back at once
    assert b.addr == a.addr
    with runtime.stream(s1):
        runtime.free(b)
    with runtime.stream(s2):
        c = runtime.malloc(MiB)                      # another stream: other memory
    assert c.addr != a.addr
    gate.set()
    s1.synchronize()
    with runtime.stream(s2):
        runtime.free(c)
    s1.destroy()
    s2.destroy()
