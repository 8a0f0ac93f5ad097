"""Memory statistics as torch.cuda.memory_stats keeps them: ``Stat`` records with flat dotted keys.

Each statistic (``allocated_bytes``, ``segment``, ...) is three records: a ``Stat`` per pool
(small, large) and a ``TotalStat`` for all pools, whose values are the sums of the pools' and
whose peak is its own (the pools need not peak at the same moment).
"""
from __future__ import annotations

STAT_NAMES = ("allocated_bytes", "reserved_bytes", "inactive_split_bytes", "requested_bytes",
              "allocation", "segment", "inactive_split")
POOL_NAMES = ("all", "small_pool", "large_pool")
# ``active`` equals ``allocation`` here: a block freed with a pending marker is already reusable
# by its stream, so it counts as cached (see the pool's design note).
MIRRORS = {"active_bytes": "allocated_bytes", "active": "allocation"}
FIELDS = ("current", "peak", "allocated", "freed")
# what a malloc or free moves (bytes, requested bytes, count, non-releasable bytes and count) and
# what a segment's reserve or release moves
BLOCK_STATS = ("allocated_bytes", "requested_bytes", "allocation", "inactive_split_bytes",
               "inactive_split")
SEGMENT_STATS = ("reserved_bytes", "segment")


class Stat:
    """One statistic of one pool: ``current`` value, its ``peak``, and the totals ``allocated`` /
    ``freed``. ``move`` changes it; ``total`` is the record of all pools it counts in."""

    # ``freed`` is derived: what was allocated and is no longer current (``base``: current at
    # the last reset of the totals), so a fall moves one field
    __slots__ = ("current", "peak", "allocated", "base", "total", "other")

    def __init__(self, total: "TotalStat"):
        self.current = self.peak = self.allocated = self.base = 0
        self.total = total
        self.other: Stat | None = None      # the other pool's record of the same statistic

    @property
    def freed(self) -> int:
        return self.base + self.allocated - self.current

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated = 0
        self.base = self.current


class TotalStat:
    """A statistic over all pools: the sums of the pools' records, and a ``peak`` of its own
    (the pools need not peak at the same moment), kept by ``move``."""

    __slots__ = ("parts", "peak")

    def __init__(self):
        self.parts: tuple[Stat, ...] = ()
        self.peak = 0

    current = property(lambda self: sum(p.current for p in self.parts))
    allocated = property(lambda self: sum(p.allocated for p in self.parts))
    freed = property(lambda self: sum(p.freed for p in self.parts))

    def reset_peak(self) -> None:
        self.peak = self.current

    def reset_accumulated(self) -> None:
        pass                                # the pools' records hold the totals


def move(records, deltas) -> None:
    """Move each pool ``Stat`` of ``records`` by the matching delta of ``deltas``.

    A rise counts in ``allocated`` and may set a peak (the pool's, and its total's), a fall in
    ``freed``; 0 leaves the record alone.
    """
    for st, n in zip(records, deltas):
        shift(st, n)


def shift(st: Stat, n: int) -> None:
    """Move the pool ``Stat`` ``st`` by ``n``: a rise (``rise``) or a fall."""
    if n > 0:
        rise(st, n)
    else:
        st.current += n


def rise(st: Stat, n: int) -> None:
    """Raise the pool ``Stat`` ``st`` by ``n`` > 0: its total, its peak and its total's peak."""
    st.current = c = st.current + n
    st.allocated += n
    if c > st.peak:
        st.peak = c
    c += st.other.current
    t = st.total
    if c > t.peak:
        t.peak = c


def malloc_moved(records, size: int, requested: int, idle_bytes: int, idle_count: int) -> None:
    """The moves of a malloc, ``records`` being a pool's ``BLOCK_STATS``: one block of ``size``
    bytes (``requested`` asked for) more, and the non-releasable free memory changed by
    ``idle_bytes`` in ``idle_count`` blocks."""
    alloc, req, count, idle, idle_n = records
    rise(alloc, size)
    rise(req, requested)
    rise(count, 1)
    _idle_moved(idle, idle_n, idle_bytes, idle_count)


def _idle_moved(idle, idle_n, idle_bytes: int, idle_count: int) -> None:
    """The non-releasable free memory changed by ``idle_bytes`` in ``idle_count`` blocks."""
    if idle_bytes > 0:
        rise(idle, idle_bytes)
    else:
        idle.current += idle_bytes
    if idle_count > 0:
        rise(idle_n, idle_count)
    else:
        idle_n.current += idle_count


def free_moved(records, size: int, requested: int, idle_bytes: int, idle_count: int) -> None:
    """The moves of a free (``records`` as for ``malloc_moved``): one block of ``size`` bytes
    (``requested`` asked for) less, the non-releasable free memory changed by ``idle_bytes`` in
    ``idle_count`` blocks."""
    alloc, req, count, idle, idle_n = records
    alloc.current -= size
    req.current -= requested
    count.current -= 1
    _idle_moved(idle, idle_n, idle_bytes, idle_count)


def parked_taken(records, size: int, requested: int) -> None:
    """``malloc_moved(records, size, requested, -size, -1)`` in one step: the moves of a malloc
    served by a parked block of the small pool (the pool's common case in a training step)."""
    alloc, req, count, idle, idle_n = records
    rise(alloc, size)
    rise(req, requested)
    rise(count, 1)
    idle.current -= size
    idle_n.current -= 1


def parked_freed(records, size: int, requested: int) -> None:
    """``free_moved(records, size, requested, size, 1)`` in one step: the moves of a free whose
    block is parked (a small block: it never spans its segment, so it counts as non-releasable)."""
    alloc, req, count, idle, idle_n = records
    alloc.current -= size
    req.current -= requested
    count.current -= 1
    rise(idle, size)
    rise(idle_n, 1)


class MemoryStats:
    """Every statistic of one allocator: ``stats.allocated_bytes[pool]`` is a ``Stat``.

    ``pool`` is 0 (all: a ``TotalStat``), 1 (small) or 2 (large).
    """

    def __init__(self):
        for name in STAT_NAMES:
            total = TotalStat()
            small, large = Stat(total), Stat(total)
            small.other, large.other = large, small
            total.parts = (small, large)
            setattr(self, name, (total, small, large))
        # per pool, the records ``move`` takes with deltas in BLOCK_STATS / SEGMENT_STATS order
        self.blocks = (None,) + tuple(tuple(getattr(self, n)[pool] for n in BLOCK_STATS)
                                      for pool in (1, 2))
        self.segments = (None,) + tuple(tuple(getattr(self, n)[pool] for n in SEGMENT_STATS)
                                        for pool in (1, 2))

    def records(self):
        """(name, pool name, Stat) of every statistic, mirrors included."""
        for name in STAT_NAMES + tuple(MIRRORS):
            stat = getattr(self, MIRRORS.get(name, name))
            for pool, pname in enumerate(POOL_NAMES):
                yield name, pname, stat[pool]

    def as_dict(self) -> dict:
        """Flat dotted keys: ``allocated_bytes.all.current`` ... (unsorted)."""
        return {f"{name}.{pname}.{field}": getattr(st, field)
                for name, pname, st in self.records() for field in FIELDS}

    def reset_peak(self) -> None:
        for name in STAT_NAMES:
            for st in getattr(self, name):
                st.reset_peak()

    def reset_accumulated(self) -> None:
        for name in STAT_NAMES:
            for st in getattr(self, name):
                st.reset_accumulated()


_SUMMARY_METRICS = (
    ("allocated_bytes", "Allocated memory", True),
    ("active_bytes", "Active memory", True),
    ("requested_bytes", "Requested memory", True),
    ("reserved_bytes", "Device reserved memory", True),
    ("inactive_split_bytes", "Non-releasable memory", True),
    ("allocation", "Allocations", False),
    ("active", "Active allocs", False),
    ("segment", "Device reserved segments", False),
    ("inactive_split", "Non-releasable allocs", False),
)


def summary_table(stats: dict, header: list[str], abbreviated: bool = False) -> str:
    """A torch.cuda.memory_summary()-style table of ``stats`` (flat dotted keys).

    ``header`` is the lines under the title (device, OOMs, capacity ...), each at most 76 wide.
    """
    rule = "=" * 78
    lines = [rule, *header, rule,
             "          Metric          | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    for key, name, is_bytes in _SUMMARY_METRICS:
        fmt = _fmt_size if is_bytes else _fmt_count
        lines.append("-" * 78)
        subs = [("all", name)]
        if not abbreviated:
            subs += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        pref = None
        for pool, label in subs:
            vals = [stats[f"{key}.{pool}.{f}"] for f in FIELDS]
            if pref is None:
                pref = vals
            lines.append(" {:<24} | {} | {} | {} | {} ".format(
                label, *(fmt(v, p) for v, p in zip(vals, pref))))
    lines.append(rule)
    return "|" + "|\n|".join(lines) + "|\n"


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
