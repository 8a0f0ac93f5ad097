"""Linux scheduling classes and core binding: the one place npusim changes them, only for threads
it created or npurun's own launch, and only when asked.

Design note. In Linux's default class (SCHED_OTHER) a thread woken on a busy core often takes
that core from the thread that woke it at once; a thread in SCHED_BATCH, once woken, waits for
a free core or the next scheduling tick. Binding a rank to a core keeps its caches warm. On an
idle machine with more ranks than cores both helped (4 ranks on 2 cores, 1 KiB all_reduce:
275-288 us free, 196-203 us bound; 490 -> 421 us with the ranks in SCHED_BATCH), and npurun
used to apply both by default. On a shared machine both lose, and by far: with another program
keeping a core busy, a SCHED_BATCH rank woken by its peer waits for a scheduler tick (world 4,
1 KiB all_reduce: 4.0 ms per call against 0.47 ms, #37), and a bound rank cannot leave the core
the other program keeps busy. Measured with ``benchmarks/launch_policy.py`` (world 4, hccl.bench
medians, policies interleaved; this 2-core machine shared with 7 other jobs, loadavg 10-14),
1 KiB / 64 KiB all_reduce, us:

    machine            nothing (default)  bind only    batch only   batch+bind (the old default)
    others' load only  2303/8417          8992/8601    1577/5895    8076/9658
    one core busy      1035/2531          3639/4471     932/1672    6548/5999
    two cores busy     1106/2241          6631/8381    1090/7902    7996/8042
    one core busy (6 rounds, another run): nothing 654/4292, batch only 4157/5454,
    batch+bind 7852/7991

(the full table: the commit that made it). No fixed class or binding is ever the fast choice
once other programs run, so npurun fixes none by default: its watcher (launcher/schedwatch.py)
runs crowded ranks in SCHED_BATCH, one core per rank pair, only while other programs leave the
cores idle, and moves them to the default class on the cores the others leave free within
~0.2 s of one using them (docs/figures.md, section launch-policy, has the policies side by side). What this module
does is what the knobs fix, announced on npurun's first line:

- NPUSIM_SCHED_BATCH=1: npurun starts its ranks in SCHED_BATCH (``spawning``: the launcher's own
  thread takes the class around the fork and gives it back; Linux children inherit their
  creator's class; a rank forked by the fork server takes it in the child), and stream workers
  woken for work a synchronizing caller already runs move themselves to SCHED_BATCH
  (``runtime.stream`` via ``adaptive_workers`` and ``move``) and back. The library never changes
  a thread of the user's (``chrt --batch 0 torchrun ...`` does what npurun does).
- NPUSIM_BIND=1: npurun binds each rank to one core (``binds``, ``core_of``, ``pinned``),
  consecutive local ranks sharing a core.

0: never, not even by the watcher; unset: the watcher decides. Nothing needs privilege; where
the classes are missing or a sandbox forbids them every call does nothing.
"""
from __future__ import annotations

import contextlib
import os

from . import config

_OTHER = getattr(os, "SCHED_OTHER", 0)
_BATCH = getattr(os, "SCHED_BATCH", None)


def cores() -> int:
    """The cores this process may run on (its affinity mask; the CPU count where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def node_cores() -> int:
    """The cores the ranks of this node share: what npurun says (NPUSIM_NODE_CORES, the cores
    it may use: a rank it bound to one core still shares them all with the others), else
    ``cores()``."""
    n = config.node_cores()
    return cores() if n is None else n


def wanted(ranks_here: int) -> bool:
    """Whether a launcher starts ``ranks_here`` ranks of this node in SCHED_BATCH: only when
    NPUSIM_SCHED_BATCH=1 (see the design note: it loses 8x as soon as another program keeps a
    core busy; unset, npurun's watcher decides while the job runs)."""
    return config.sched_batch() is True


def adaptive_workers() -> bool:
    """Whether stream workers may move themselves to SCHED_BATCH (only NPUSIM_SCHED_BATCH=1)."""
    return config.sched_batch() is True


def move(to_batch: bool) -> bool:
    """Move the calling thread (an npusim thread, on itself) from the default class to
    SCHED_BATCH (``to_batch``) or back; True if it moved. False where the classes are missing,
    where the thread is in another class or where a sandbox forbids it."""
    if _BATCH is None:
        return False
    frm, to = (_OTHER, _BATCH) if to_batch else (_BATCH, _OTHER)
    try:
        if os.sched_getscheduler(0) == frm:
            os.sched_setscheduler(0, to, os.sched_param(0))
            return True
    except OSError:
        pass
    return False


def binds(ranks_here: int) -> bool:
    """Whether a launcher binds each of the ``ranks_here`` ranks of this node to one core: only
    when NPUSIM_BIND=1 (see the design note)."""
    return config.bind() is True


def core_of(local_rank: int, ranks_here: int, mask=None) -> int | None:
    """The core local rank ``local_rank`` of ``ranks_here`` is bound to: the cores of ``mask``
    (default: those this process may use), in order, each taking consecutive ranks (4 ranks on
    2 cores: 0, 0, 1, 1); None where affinity is unknown."""
    if mask is None:
        try:
            mask = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            return None
    mask = sorted(mask)
    return mask[local_rank * len(mask) // max(1, ranks_here)]


@contextlib.contextmanager
def pinned(core: int | None):
    """Processes the calling thread (a launcher's) starts inside run on core ``core`` only
    (Linux children inherit their creator's affinity); the thread gets its mask back at the
    exit. Does nothing for None, or where affinity cannot be set."""
    before = None
    if core is not None:
        try:
            before = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {core})
        except (AttributeError, OSError):
            before = None
    try:
        yield
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)


@contextlib.contextmanager
def spawning(batch: bool):
    """Processes the calling thread (a launcher's) starts inside begin in SCHED_BATCH when
    ``batch``; the thread gets its class back at the exit."""
    moved = batch and move(True)
    try:
        yield
    finally:
        if moved:
            move(False)


def current() -> int:
    """The calling thread's scheduling class (an ``os.SCHED_*`` value; 0 where unknown)."""
    try:
        return os.sched_getscheduler(0)
    except (AttributeError, OSError):
        return 0
