"""npurun's launch policy for crowded ranks: SCHED_BATCH and one core per rank pair while no
other program uses the CPU; the default class, on the cores the other programs leave free, as
soon as one does.

Design note. With more ranks than cores, two settings speed up a job that has the machine to
itself: Linux's SCHED_BATCH class (a woken rank does not take the core from the peer that woke
it) and binding consecutive local ranks to one core (warm caches). World 4 on 2 cores, 1 KiB /
64 KiB all_reduce, idle machine: 214 / 275 us with both, 289 / 337 us with neither. The same two
lose 8-10x as soon as another program keeps a core busy (3,989 / 3,994 us against 433 / 384):
a SCHED_BATCH rank woken while the other program runs on its core waits for that program's
scheduler tick (~4 ms), and a bound rank cannot move to the free core (runtime/sched.py has
the older, shared-machine figures). Spreading the ranks over every core is not the answer
either: the ranks on the core a busy program shares wait for the scheduler at every hand-off,
and the whole ring waits for them. The ranks do best on the cores the others leave free
(``free_cores``, ``SQUEEZE_RANKS_PER_CORE`` has the figures): there a waiter that spins yields
the core to the peer it waits for (hccl/transport/shm.py). No fixed choice wins both, so
npurun watches:

- one thread of npurun samples, every ``INTERVAL`` s, the busy time of the cores npurun may use
  (their wall time minus their idle time, /proc/stat) and subtracts the run time of the job's
  own threads (npurun, its fork server, its ranks: /proc/PID/task/TID/schedstat). What remains
  is the other programs' use, in cores (``CpuProbe``). A rank's own child processes (data
  loaders, compilers) count as other programs: their CPU use keeps the ranks in the default
  class, the safe side. A sample costs npurun ~0.5 ms of CPU (0.25 % of a core).
- above ``threshold`` cores (NPUSIM_SCHED_WATCH_CORES) in one sample, every thread of every rank
  goes back to SCHED_OTHER, on the cores the other programs leave free: as many as their use
  leaves, rounded (at least one, at most ``SQUEEZE_RANKS_PER_CORE`` ranks per core, else all),
  those idle the longest in the sample. The count changes when the free cores move
  ``SQUEEZE_BAND`` away from it; the cores change with it, or when one the ranks left sat idle
  more than ``IDLE_SHARE`` of a sample (the other program moved). Only after
  ``QUIET_SAMPLES`` samples in a row below half the threshold do the ranks go (back) to
  SCHED_BATCH and their core. Staying in SCHED_BATCH under load costs 10x, leaving it on an
  idle machine ~35 %: leaving is fast, coming back is slow. A sample across a change of the
  job's processes (a rank forked, restarted or gone) is not judged: a new process brings CPU
  time from before the sample.
- the ranks start in the state the machine calls for when they are forked: npurun measures
  the other programs' use over its own start-up (at least ``FIRST_WINDOW`` s, its fork server
  counted as the job's) and forks them in SCHED_BATCH on their cores when it is below half the
  threshold, else in the default class, unbound, until the first samples place them
  (``Watcher.first``). A short job on a quiet
  machine so runs quiet from its first call: with the first decision left to the samples, a
  world-4 job spent its first 0.6-0.8 s in the default class: ``QUIET_SAMPLES`` samples after
  the one its ranks' start voids. Broadcast of 64 KiB at world 4 then took 2.0x the time of
  8d596b4, which started its ranks in SCHED_BATCH.
- npurun moves only its ranks' threads (its children: Linux lets a process of the same user set
  both), every tid in /proc/PID/task, and only a thread in the state npurun gave it: a thread
  whose class or cores changed since (by the user's code) keeps them, from then on. At a switch every such
  thread moves; between switches only threads npurun has not seen yet (threads inherit their
  creator's class and cores, so a late thread is in the state of the thread that made it). The
  library (runtime, hccl) never changes a user's thread.

Only for crowded ranks (more ranks on the node than cores npurun may use, up to
``WATCH_RANKS_PER_CORE`` per core: beyond, sampling every rank's threads costs npurun more than
the policy gains, and npurun changes nothing, see the constant); NPUSIM_SCHED_BATCH
and NPUSIM_BIND, when set, fix their half (1 always, 0 never: ``runtime.sched``) and the watcher
keeps to the other (the busy state's cores are the binding half: NPUSIM_BIND=0 leaves every
rank on every core); NPUSIM_SCHED_WATCH=0 turns the watcher off (then npurun changes nothing it
was not asked to). npurun says which on its first line. Where the classes, affinity or /proc are
missing, or a sandbox forbids the calls, nothing is changed.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from launcher import config
from runtime import config as rconfig
from runtime import sched

log = logging.getLogger("launcher")

INTERVAL = 0.2          # s between two samples: a switch to the default class within ~0.2 s
QUIET_SAMPLES = 3       # samples in a row below threshold / 2 before SCHED_BATCH comes back
FIRST_WINDOW = 0.1      # s of npurun's start-up over which the ranks' first state is decided
# Busy: the ranks share the cores the other programs leave free (``free_cores``). World 4 on 2
# cores with one busy loop, 1 KiB / 64 KiB all_reduce (us, hccl.bench medians, 3 interleaved
# rounds): the 4 ranks on one core 139 / 292, on both 395 / 405; with two busy loops 146 / 269
# against 452 / 433. A waiter yields its core at every turn of its spin (hccl/transport/shm.py),
# so ranks sharing one core hand it to each other, where ranks on a core a busy loop shares
# wait for the scheduler. It loses with more ranks per core (one busy loop, 2 rounds: world 6
# on one core 313 / 718 against 555 / 638 on both; world 8 767 / 1061 against 486 / 656).
SQUEEZE_RANKS_PER_CORE = 4
SQUEEZE_BAND = 0.75     # the free cores must move this far from the count in force to change it
IDLE_SHARE = 0.5        # a core the ranks do not use, idle this share of a sample: taken again
_OTHER = getattr(os, "SCHED_OTHER", 0)
_BATCH = getattr(os, "SCHED_BATCH", None)
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Policy:
    """What npurun does with the scheduling of ``ranks`` ranks on ``cores`` cores."""

    ranks: int
    cores: int
    batch: bool = False           # fixed: the ranks start in SCHED_BATCH (NPUSIM_SCHED_BATCH=1)
    bind: bool = False            # fixed: each rank bound to one core (NPUSIM_BIND=1)
    watch_batch: bool = False     # the watcher moves the ranks between SCHED_BATCH and OTHER
    watch_bind: bool = False      # the watcher binds and unbinds them
    threshold: float = 0.3        # others' cores above which the watcher leaves BATCH / cores

    @property
    def watching(self) -> bool:
        return self.watch_batch or self.watch_bind

    def announce(self) -> str | None:
        """npurun's first-line text for this policy, or None when npurun changes nothing."""
        parts = []
        if self.batch:
            parts.append("the ranks run in Linux's SCHED_BATCH class (NPUSIM_SCHED_BATCH=1; "
                         "unset it to keep the default class)")
        if self.bind:
            parts.append("each rank is bound to one core, consecutive local ranks sharing "
                         "one (NPUSIM_BIND=1; unset it to leave them free)")
        if self.watching:
            what = ", ".join(w for w, on in (("in SCHED_BATCH", self.watch_batch),
                                             ("one core per rank pair", self.watch_bind)) if on)
            where = ("on the cores the other programs leave free" if self.watch_bind
                     else "on their cores")
            parts.append(f"while other programs use less than {self.threshold:g} of these "
                         f"cores, the ranks run {what}; above, in the default class {where} "
                         "(NPUSIM_SCHED_WATCH=0 turns this off)")
        if not parts:
            return None
        return f"npurun: {self.ranks} ranks on {self.cores} cores: {'; '.join(parts)}"


# The watcher acts on nodes with up to this many ranks per core. Its gain was measured at 2 per
# core (world 4 on 2 cores); at 128 per core (world 256 on 2 cores) npurun's samples of every
# rank's threads (/proc, ~2,300 threads five times a second) share npurun's GIL with the job's
# store, and launch -> exit took 19.8-63 s against 17.7-19.3 s without it (benchmarks.scale).
WATCH_RANKS_PER_CORE = 4


def policy(ranks_here: int) -> Policy:
    """npurun's policy for ``ranks_here`` ranks of this node, from the environment (the design
    note): fixed halves where NPUSIM_SCHED_BATCH / NPUSIM_BIND say 1, the watcher for the
    halves left unset when the ranks outnumber the cores (up to WATCH_RANKS_PER_CORE per core)
    and NPUSIM_SCHED_WATCH is not 0."""
    cores = sched.cores()
    crowded = (cores < ranks_here <= WATCH_RANKS_PER_CORE * cores and config.sched_watch()
               and _procfs())
    return Policy(ranks_here, cores, batch=sched.wanted(ranks_here),
                  bind=sched.binds(ranks_here),
                  watch_batch=crowded and _BATCH is not None and rconfig.sched_batch() is None,
                  watch_bind=crowded and rconfig.bind() is None,
                  threshold=config.sched_watch_cores())


def _procfs() -> bool:
    return os.path.exists("/proc/stat") and os.path.exists(f"/proc/{os.getpid()}/task")


def _runtimes(pid: int) -> dict[int, int]:
    """{tid: ns on a CPU} of every thread of ``pid`` (/proc/PID/task/TID/schedstat: exact, where
    /proc/PID/stat rounds to 10 ms); {} if it is gone."""
    out = {}
    for tid in _tids(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


class CpuProbe:
    """The other programs' CPU use of ``mask``'s cores, in cores, since the previous call
    (None for the first call and for one whose ``pids`` differ from the previous one's), and
    ``idle_share``: each core's idle share of that time (0 to 1).

    Busy time is the wall time of the cores minus their idle, iowait and steal time
    (/proc/stat: idle time is exact on a tickless kernel, where user and system time are
    sampled at the scheduler tick and would err by ~0.1 core in 0.2 s); the job's time is the
    sum over its threads of their exact run time, thread by thread (a thread that ended since
    the previous call counts as the others', the safe side)."""

    def __init__(self, mask: Iterable[int]):
        self.names = {f"cpu{c}".encode(): c for c in sorted(mask)}
        self.ncores = len(self.names)
        self.last: tuple | None = None
        self.idle_share: dict[int, float] = {}

    def idle(self) -> dict[int, int]:
        """{core: idle + iowait + steal ticks} of the mask's cores."""
        out = {}
        with open("/proc/stat", "rb") as f:
            for line in f:
                parts = line.split()
                if not parts or not parts[0].startswith(b"cpu"):
                    break
                # cpuN user nice system idle iowait irq softirq steal ...
                core = self.names.get(parts[0])
                if core is not None:
                    out[core] = int(parts[4]) + int(parts[5]) + int(parts[8])
        return out

    def __call__(self, pids: tuple[int, ...], born: tuple[int, ...] = ()) -> float | None:
        """``born``: those of ``pids`` the caller started after the previous call (all their
        run time falls inside this sample, so they count as the job's without voiding it)."""
        runs = {(pid, tid): ns for pid in pids for tid, ns in _runtimes(pid).items()}
        now = (time.monotonic(), self.idle(), pids, runs)
        last, self.last = self.last, now
        if last is None:
            return None
        dt = now[0] - last[0]
        if dt <= 0:
            return None
        idle = {c: (t - last[1].get(c, t)) / _TICK for c, t in now[1].items()}
        self.idle_share = {c: min(1.0, max(0.0, t / dt)) for c, t in idle.items()}
        if set(last[2]) | set(born) != set(pids):
            return None
        busy = self.ncores * dt - sum(idle.values())
        ours = sum(ns - last[3].get(key, 0) for key, ns in runs.items()) / 1e9
        return max(0.0, (busy - ours) / dt)


def free_cores(ncores: int, ranks: int, load: float, now: int | None = None) -> int:
    """How many of ``ncores`` cores ``ranks`` crowded ranks share while other programs use
    ``load`` cores: those the others leave free, rounded, at least one; all of them where
    that would put more than ``SQUEEZE_RANKS_PER_CORE`` ranks on a core. ``now``, the count in
    force, is kept until the free cores move ``SQUEEZE_BAND`` away from it (a load near a half
    does not flip the ranks back and forth)."""
    free = ncores - load
    if now is not None and abs(free - now) < SQUEEZE_BAND:
        return now
    k = max(1, min(ncores, int(free + 0.5)))
    return k if ranks <= SQUEEZE_RANKS_PER_CORE * k else ncores


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


class Watcher:
    """The watcher thread of one npurun (the design note). ``follow`` hands it the ranks of an
    attempt; ``close`` stops it (within one sample). ``quiet`` says whether the ranks are in
    the quiet state (SCHED_BATCH / bound one core per pair) now, ``cores`` which cores they
    share when not (all of ``mask`` unless the watcher binds and other programs keep some
    busy); ``switches`` counts the moves; ``probe`` is the other programs' CPU use
    (``CpuProbe`` by default; a test hands its own: without ``idle_share`` the watcher takes
    the last cores of the mask)."""

    def __init__(self, pol: Policy, mask: Iterable[int] | None = None, *,
                 probe: Callable[[tuple[int, ...]], float | None] | None = None,
                 interval: float = INTERVAL):
        self.policy = pol
        self.mask = frozenset(mask if mask is not None else os.sched_getaffinity(0))
        self.probe = probe or CpuProbe(self.mask)
        self.interval = interval
        self.quiet = False
        self.cores = self.mask
        self.switches = 0
        self.last_load: float | None = None
        self._prev = (False, self.mask)              # the state before the last switch
        self._born = self._prev                      # the state the ranks followed started in
        self._calm = 0
        self._ranks: dict[int, int] = {}          # pid -> local rank
        self._helpers: tuple[int, ...] = ()
        self._seen: dict[int, set[int]] = {}       # pid -> tids npurun has placed
        self._users: dict[int, set[int]] = {}      # pid -> tids the user took (not moved)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="npurun-schedwatch", daemon=True)
        self._started_at = time.monotonic()
        self.probe((os.getpid(),))                 # the first decision's baseline (``first``)

    def first(self, helpers: Iterable[int] = ()) -> bool:
        """The state the ranks start in, decided before any is forked: quiet when the other
        programs used less than half the threshold since the watcher was made (at least
        ``FIRST_WINDOW`` s, waited for here if npurun got here sooner), counting ``helpers``
        (npurun's fork server, started since) as the job's. Then the watcher's thread starts.
        A job on a quiet machine so runs quiet from its first call, not after
        ``QUIET_SAMPLES`` samples; a busy machine keeps the default class from the start (on
        every core: the first samples place the ranks)."""
        helpers = tuple(helpers)
        left = FIRST_WINDOW - (time.monotonic() - self._started_at)
        if left > 0:
            time.sleep(left)
        load = self.probe(tuple(sorted({os.getpid(), *helpers})), helpers)
        self.last_load = load
        if load is not None and load < self.policy.threshold / 2:
            self.quiet = True
            self.switches += 1
            log.info("npurun: other programs use %.2f cores: the ranks start in SCHED_BATCH / "
                     "their cores", load)
        with self._lock:
            self._helpers = helpers
        self._start()
        return self.quiet

    def _start(self) -> None:
        """Start the sampling thread, once (``first`` or, on a later attempt, ``follow``)."""
        if self._thread.ident is None and not self._stop.is_set():
            self._thread.start()

    def follow(self, ranks: Iterable[tuple[int, int]], helpers: Iterable[int] = ()) -> None:
        """Watch these ranks, ``(local_rank, pid)`` each (a new attempt's), counting ``helpers``
        (npurun's fork server) as the job's own CPU use too."""
        with self._lock:
            self._ranks = {pid: lr for lr, pid in ranks}
            self._helpers = tuple(helpers)
            self._seen, self._users = {}, {}
            self._born = (self.quiet, self.mask)  # the state npurun started them in
        self._start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._step()
            except Exception as e:   # a bug here must not end npurun; the ranks stay as they are
                log.warning("npurun: the scheduling watcher stopped: %r", e)
                return

    def _step(self) -> None:
        with self._lock:
            ranks, helpers = dict(self._ranks), self._helpers
        pids = tuple(sorted({os.getpid(), *helpers, *ranks}))
        load = self.probe(pids)
        self.last_load = load
        was = (self.quiet, self.cores)
        if load is not None:
            if load > self.policy.threshold:
                self.quiet, self._calm = False, 0
            elif load < self.policy.threshold / 2:
                self._calm += 1
                if self._calm >= QUIET_SAMPLES:
                    self.quiet = True
            else:
                self._calm = 0
            if not self.quiet and self.policy.watch_bind:
                self.cores = self._free(load, fresh=was[0])
        now = (self.quiet, self.cores)
        if now != was:
            self.switches += 1
            self._prev = was
            log.info("npurun: other programs use %.2f cores: the ranks %s", load,
                     "go to SCHED_BATCH / their cores" if self.quiet else
                     f"go to the default class on cores {sorted(self.cores)}")
        for pid, local_rank in ranks.items():
            self._place(pid, local_rank, everyone=now != was)

    def _free(self, load: float, fresh: bool) -> frozenset:
        """The cores the ranks share while other programs use ``load`` cores (``free_cores``):
        the ones idle the longest in the last sample. The cores in force are kept while their
        count holds, unless a core the ranks do not use sat idle (the others left it); ``fresh``:
        none in force (the ranks leave the quiet state)."""
        k = free_cores(len(self.mask), self.policy.ranks, load,
                       None if fresh else len(self.cores))
        if k >= len(self.mask):
            return self.mask
        share = getattr(self.probe, "idle_share", None) or {}
        if not fresh and k == len(self.cores) and not any(
                share.get(c, 0.0) > IDLE_SHARE for c in self.mask - self.cores):
            return self.cores
        return frozenset(sorted(self.mask, key=lambda c: (share.get(c, 0.0), c))[-k:])

    def _mask(self, state: tuple[bool, frozenset], local_rank: int) -> frozenset:
        """The cores of local rank ``local_rank`` in ``state`` (quiet, busy cores): one per rank
        pair when quiet (``runtime.sched.core_of`` on the cores npurun may use)."""
        quiet, cores = state
        if not quiet:
            return cores
        return frozenset({sched.core_of(local_rank, self.policy.ranks, self.mask)})

    def _place(self, pid: int, local_rank: int, everyone: bool) -> None:
        """Move pid's threads to the current state: all of them at a switch, else the new ones
        only; each only from the state npurun gave it before (the design note). A thread found
        in another state is the user's from then on, and never moved again."""
        frm, to = self._prev, (self.quiet, self.cores)
        if pid not in self._seen:            # a rank just started: from the state it began in
            frm, everyone = self._born, True
        seen = self._seen.setdefault(pid, set())
        users = self._users.setdefault(pid, set())
        frm = (frm[0], self._mask(frm, local_rank))
        to = (to[0], self._mask(to, local_rank))
        for tid in _tids(pid):
            if (everyone or tid not in seen) and tid not in users:
                seen.add(tid)
                if not self._move(tid, frm, to):
                    users.add(tid)

    def _move(self, tid: int, frm: tuple[bool, frozenset], to: tuple[bool, frozenset]) -> bool:
        """Move thread ``tid`` from state ``frm`` to ``to`` (quiet, cores) in the halves the
        watcher keeps; True when it is in ``to`` already (a thread made since, by a thread in
        it) or was moved, False when it is in neither (the user changed it) or cannot be
        moved."""
        watch_batch, watch_bind = self.policy.watch_batch, self.policy.watch_bind
        try:
            cls = os.sched_getscheduler(tid) if watch_batch else None
            cores = os.sched_getaffinity(tid) if watch_bind else None

            def within(state):
                return ((not watch_batch or cls == (_BATCH if state[0] else _OTHER))
                        and (not watch_bind or cores == state[1]))
            if within(to):
                return True
            if not within(frm):
                return False
            if watch_batch and frm[0] != to[0]:
                os.sched_setscheduler(tid, _BATCH if to[0] else _OTHER, os.sched_param(0))
            if watch_bind and frm[1] != to[1]:
                os.sched_setaffinity(tid, to[1])
        except OSError:    # the thread ended, or a sandbox forbids it: leave it as it is
            return False
        return True


def start(pol: Policy) -> Watcher | None:
    """A running watcher for ``pol``, or None when it has nothing to watch."""
    if not pol.watching:
        return None
    try:
        return Watcher(pol)
    except OSError:     # no affinity here
        return None
