"""Linux scheduling classes of npusim's threads: the one place that changes them.

Design note. In Linux's default class (SCHED_OTHER) a thread that wakes another on a busy machine
often loses its core to it at once; in SCHED_BATCH the woken thread waits for a free core or the
next scheduling tick. With more ranks than cores that matters to npusim twice:

- a stream worker woken for work a synchronizing caller already runs would take the caller's
  core for nothing (``runtime.stream``: such a worker moves itself to SCHED_BATCH with ``move``
  and back when it finds work nobody else runs);
- a rank that sends to a peer would lose its core to that peer before it has posted its other
  messages and reached its own wait (``hccl``: the thread that runs a collective is in
  SCHED_BATCH for the collective's duration, ``enter`` / ``leave``).

Only npusim changes what npusim changed: ``move`` is called by npusim's own threads on
themselves, and ``leave`` puts back the class ``enter`` found when the collective ends, whichever
thread ran it (the user's main thread runs a collective when it synchronizes). A user's thread is
therefore in its own class whenever the user's code runs. The cost is two class changes per
collective: 16 us for the pair at best, 30-200 us on this 2-core VM under a load of 20
(a change back to the default class may hand the core to another runnable thread at once):
``python -m timeit -s "from runtime import sched" "sched.leave(sched.enter(True))"``. Nothing
needs privilege; where the classes are missing or a sandbox forbids them every call does
nothing. NPUSIM_SCHED_BATCH (``runtime.config.sched_batch``) decides.
"""
from __future__ import annotations

import os

from . import config

_OTHER = getattr(os, "SCHED_OTHER", 0)
_BATCH = getattr(os, "SCHED_BATCH", None)


def wanted(crowded: bool) -> bool:
    """Whether collectives run in SCHED_BATCH: NPUSIM_SCHED_BATCH if set, else ``crowded`` (the
    node runs more ranks than this process may use cores)."""
    knob = config.sched_batch()
    return crowded if knob is None else knob


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


def enter(want: bool) -> bool:
    """Start a collective in the calling thread: SCHED_BATCH if ``want`` and the thread is in the
    default class. Returns what ``leave`` needs (True: the thread was moved)."""
    return want and move(True)


def leave(moved: bool) -> None:
    """End what ``enter`` started: the thread goes back to the class it was in."""
    if moved:
        move(False)


def current() -> int:
    """The calling thread's scheduling class (an ``os.SCHED_*`` value; 0 where unknown)."""
    try:
        return os.sched_getscheduler(0)
    except (AttributeError, OSError):
        return 0

