"""Linux scheduling classes and core binding: the one place npusim changes them, only for threads
it created or npurun's own launch.

Design note. In Linux's default class (SCHED_OTHER) a thread woken on a busy core often takes
that core from the thread that woke it at once; a thread in SCHED_BATCH, once woken, waits for
a free core or the next scheduling tick. With more ranks than cores that matters twice:

- a rank that sends to a peer would lose its core to that peer before it has posted its other
  messages and reached its own wait. So npurun starts its rank processes in SCHED_BATCH when
  the node's ranks outnumber the cores it may use (``spawning``: the launcher's own thread
  takes the class around the fork and gives it back; Linux children inherit their creator's
  class). It is the launch's policy, as torchrun sets OMP_NUM_THREADS=1 for the same reason,
  and npurun says so when it does it. The library never changes a thread of the user's: a
  rank started otherwise (plain python, torchrun, ``mp.spawn``) keeps the class it was given
  (``chrt --batch 0 torchrun ...`` does what npurun does);
- a stream worker woken for work a synchronizing caller already runs would take the caller's
  core for nothing (``runtime.stream``: such a worker moves itself to SCHED_BATCH with ``move``
  and back when it finds work nobody else runs).

The same launch binds each rank to one core when the ranks outnumber the cores (``binds``,
``core_of``, ``pinned``: again the launcher's thread around the fork), consecutive local ranks
sharing a core: left free, Linux moves the ranks between the cores at their wake-ups, and each
move finds a Python process's caches cold. 4 ranks on 2 cores, ``hccl.bench`` medians, 1 KiB
all_reduce: 275-288 us free, 196-203 us bound; 1 MiB 1.2-1.5 ms -> 1.05-1.07 ms; the
data-parallel example unchanged (58.9-60.4k samples/s free, 58.7-61.0k bound). With no more
ranks than cores nothing changes by default (measured: no gain at 2 ranks on 2 cores). Open
MPI and Intel MPI bind by default too. NPUSIM_BIND (``runtime.config.bind``): unset, the rule
above; 1, always; 0, never.

The earlier design moved the thread that ran each collective into SCHED_BATCH and back: two
class changes per collective, and a change back to the default class may hand the core to
another runnable thread at once. 4 ranks on 2 cores, 1 KiB all_reduce, medians of 10
alternating jobs: 490 us per call with the moves, 421 us with the ranks started in SCHED_BATCH
(``benchmarks/ab.sh``). Nothing needs privilege; where the classes are missing or a sandbox
forbids them every call does nothing. NPUSIM_SCHED_BATCH (``runtime.config.sched_batch``)
decides: unset, the rule above; 1, always; 0, never (stream workers stay put too).
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


def wanted(ranks_here: int) -> bool:
    """Whether a launcher starts ``ranks_here`` ranks of this node in SCHED_BATCH:
    NPUSIM_SCHED_BATCH if set, else whether they outnumber ``cores()``."""
    knob = config.sched_batch()
    return ranks_here > cores() if knob is None else knob


def adaptive_workers() -> bool:
    """Whether stream workers may move themselves (NPUSIM_SCHED_BATCH unset or 1)."""
    return config.sched_batch() is not False


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
    """Whether a launcher binds each of the ``ranks_here`` ranks of this node to one core:
    NPUSIM_BIND if set, else whether they outnumber ``cores()``."""
    knob = config.bind()
    return ranks_here > cores() if knob is None else knob


def core_of(local_rank: int, ranks_here: int) -> int | None:
    """The core local rank ``local_rank`` of ``ranks_here`` is bound to: the cores this process
    may use, in order, each taking consecutive ranks (4 ranks on 2 cores: 0, 0, 1, 1); None
    where affinity is unknown."""
    try:
        mask = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
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
