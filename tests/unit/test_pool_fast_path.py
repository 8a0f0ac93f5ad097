"""The pool's one-step malloc and free of a parked block (CachingAllocator.malloc / free with the
front cache, stats.parked_taken / parked_freed) and what a user leaves with parked memory
(Block.reuse): every statistic exact after every call, peaks included, as the general path
keeps them."""
from __future__ import annotations

import random

from runtime.memory.blocks import Block
from runtime.memory.pool import CachingAllocator

KiB, MiB = 1 << 10, 1 << 20
S1, S2 = "stream1", "stream2"


class FakeRaw:
    def __init__(self):
        self.next = 1 << 40

    def reserve(self, nbytes: int) -> int:
        addr = self.next
        self.next += nbytes + 2 * MiB
        return addr

    def release(self, addr: int, nbytes: int) -> None:
        pass


class Marker:
    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done


def _expected(p: CachingAllocator) -> dict:
    """The current values the statistics must have, counted from the blocks themselves."""
    out = {}
    for pool in ("small_pool", "large_pool"):
        segs = [s for s in p.snapshot() if s["segment_type"] == pool.split("_")[0]]
        blocks = [b for s in segs for b in s["blocks"]]
        live = [b for b in blocks if b["state"] == "active_allocated"]
        idle = [b for s in segs for b in s["blocks"]
                if b["state"] == "inactive" and b["size"] != s["total_size"]]
        out[pool] = {"allocated_bytes": sum(b["size"] for b in live),
                     "requested_bytes": sum(b["requested_size"] for b in live),
                     "allocation": len(live),
                     "inactive_split_bytes": sum(b["size"] for b in idle),
                     "inactive_split": len(idle)}
    return out


def test_every_statistic_is_exact_after_every_call_through_the_fast_path():
    rnd = random.Random(5)
    p = CachingAllocator(FakeRaw(), 64 * MiB, front_cache=16)
    live: list[Block] = []
    markers: list[Marker] = []
    peaks: dict = {}
    fast = 0
    for step in range(3000):
        if live and (rnd.random() < 0.5 or len(live) > 40):
            b = live.pop(rnd.randrange(len(live)))
            m = None
            if rnd.random() < 0.2:
                m = Marker()
                markers.append(m)
            p.free(b, m)
        else:
            size = rnd.choice((512, 4 * KiB, 16 * KiB, 16 * KiB, 16 * KiB, 64 * KiB, 2 * MiB))
            n = rnd.randrange(size // 2 + 1, size + 1)
            parked = p._front.count
            live.append(p.malloc(n, rnd.choice((S1, S1, S2))))
            fast += p._front.count < parked
        if markers and rnd.random() < 0.1:
            markers.pop(0).done = True
        stats = p.stats()
        want = _expected(p)
        for name in want["small_pool"]:
            total = 0
            for pool in ("small_pool", "large_pool"):
                cur = stats[f"{name}.{pool}.current"]
                assert cur == want[pool][name], (step, name, pool)
                total += cur
                key = f"{name}.{pool}.peak"
                peaks[key] = max(peaks.get(key, 0), cur)
                assert stats[key] == peaks[key], (step, key)
                assert stats[f"{name}.{pool}.allocated"] - stats[f"{name}.{pool}.freed"] == cur
            assert stats[f"{name}.all.current"] == total
            key = f"{name}.all.peak"
            peaks[key] = max(peaks.get(key, 0), total)
            assert stats[key] == peaks[key], (step, key)
        if step % 500 == 499:
            p.empty_cache()
    assert fast > 200                    # the one-step path was taken, many times


def test_what_a_user_leaves_goes_with_the_parked_block_to_the_next_malloc():
    p = CachingAllocator(FakeRaw(), 64 * MiB, front_cache=4)
    a = p.malloc(16 * KiB, S1)
    a.reuse = left = object()
    p.free(a)
    assert a.reuse is None                               # the retired handle keeps nothing
    b = p.malloc(16 * KiB, S1)
    assert b.addr == a.addr and b is not a and b.reuse is left
    b.reuse = None
    p.free(b)
    c = p.malloc(16 * KiB, S1)
    assert c.reuse is None


def test_what_was_left_goes_when_the_memory_merges():
    p = CachingAllocator(FakeRaw(), 64 * MiB, front_cache=1)
    a, b = p.malloc(16 * KiB, S1), p.malloc(16 * KiB, S1)
    a.reuse, b.reuse = object(), object()
    p.free(a)                                            # parked: keeps it
    p.free(b)                                            # the cache is full: b merges
    assert b.reuse is None
    parked = [x for x in p._front.parked.values()][0][0]
    assert parked.reuse is not None
    p.empty_cache()                                      # a flush merges the parked one
    assert parked.reuse is None
    c = p.malloc(16 * KiB, S2)                           # from the free lists: nothing left
    assert c.reuse is None
    big = p.malloc(2 * MiB, S1)                          # a large block is never parked
    big.reuse = object()
    p.free(big)
    assert big.reuse is None and p.malloc(2 * MiB, S1).reuse is None


def test_a_shared_free_or_another_stream_gets_nothing_left():
    p = CachingAllocator(FakeRaw(), 64 * MiB, front_cache=4)
    a = p.malloc(16 * KiB, S1)
    a.reuse = object()
    m = Marker()
    p.free(a, m, shared=True)                            # record_stream's free: never parked
    assert a.reuse is None
    b = p.malloc(16 * KiB, S1)
    b.reuse = object()
    p.free(b)                                            # parked for S1
    c = p.malloc(16 * KiB, S2)
    assert c.reuse is None and c.addr != b.addr
