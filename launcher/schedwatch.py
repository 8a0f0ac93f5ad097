"""npurun's launch policy for crowded ranks: SCHED_BATCH and one core per rank pair while no
other program uses the CPU, the default class and every core as soon as one does.

Design note. With more ranks than cores, two settings speed up a job that has the machine to
itself: Linux's SCHED_BATCH class (a woken rank does not take the core from the peer that woke
it) and binding consecutive local ranks to one core (warm caches). World 4 on 2 cores, 1 KiB /
64 KiB all_reduce, idle machine: 214 / 275 us with both, 289 / 337 us with neither. The same two
lose 8-10x as soon as another program keeps a core busy (3,989 / 3,994 us against 433 / 384):
a SCHED_BATCH rank woken while the other program runs on its core waits for that program's
scheduler tick (~4 ms), and a bound rank cannot move to the free core (runtime/sched.py has
the older, shared-machine figures). No fixed choice wins both, so npurun watches:

- one thread of npurun samples, every ``INTERVAL`` s, the busy time of the cores npurun may use
  (their wall time minus their idle time, /proc/stat) and subtracts the run time of the job's
  own threads (npurun, its fork server, its ranks: /proc/PID/task/TID/schedstat). What remains
  is the other programs' use, in cores (``CpuProbe``). A rank's own child processes (data
  loaders, compilers) count as other programs: their CPU use keeps the ranks in the default
  class, the safe side. A sample costs npurun ~0.5 ms of CPU (0.25 % of a core).
- above ``threshold`` cores (NPUSIM_SCHED_WATCH_CORES) in one sample, every thread of every rank
  goes back to SCHED_OTHER and to every core npurun may use; only after ``QUIET_SAMPLES``
  samples in a row below half the threshold do they go (back) to SCHED_BATCH and their core.
  Staying in SCHED_BATCH under load costs 10x, leaving it on an idle machine ~35 %: leaving is
  fast, coming back is slow. A sample across a change of the job's processes (a rank forked,
  restarted or gone) is not judged: a new process brings CPU time from before the sample.
- the ranks start in the state the machine calls for when they are forked: npurun measures
  the other programs' use over its own start-up (at least ``FIRST_WINDOW`` s, its fork server
  counted as the job's) and forks them in SCHED_BATCH on their cores when it is below half the
  threshold, else in the default class, unbound (``Watcher.first``). A short job on a quiet
  machine so runs quiet from its first call: with the first decision left to the samples, a
  world-4 job spent its first 0.6-0.8 s in the default class: ``QUIET_SAMPLES`` samples after
  the one its ranks' start voids. Broadcast of 64 KiB at world 4 then took 2.0x the time of
  8d596b4, which started its ranks in SCHED_BATCH.
- npurun moves only its ranks' threads (its children: Linux lets a process of the same user set
  both), every tid in /proc/PID/task, and only a thread in the state npurun gave it: a thread
  whose class or cores changed since (by the user's code) keeps them. At a switch every such
  thread moves; between switches only threads npurun has not seen yet (threads inherit their
  creator's class and cores, so a late thread is in the state of the thread that made it). The
  library (runtime, hccl) never changes a user's thread.

Only for crowded ranks (more ranks on the node than cores npurun may use, up to
``WATCH_RANKS_PER_CORE`` per core: beyond, sampling every rank's threads costs npurun more than
the policy gains, and npurun changes nothing, see the constant); NPUSIM_SCHED_BATCH
and NPUSIM_BIND, when set, fix their half (1 always, 0 never: ``runtime.sched``) and the watcher
keeps to the other; NPUSIM_SCHED_WATCH=0 turns the watcher off (then npurun changes nothing it
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
            parts.append(f"while other programs use less than {self.threshold:g} of these "
                         f"cores, the ranks run {what}; above, in the default class on every "
                         "core (NPUSIM_SCHED_WATCH=0 turns this off)")
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
    (None for the first call and for one whose ``pids`` differ from the previous one's).

    Busy time is the wall time of the cores minus their idle, iowait and steal time
    (/proc/stat: idle time is exact on a tickless kernel, where user and system time are
    sampled at the scheduler tick and would err by ~0.1 core in 0.2 s); the job's time is the
    sum over its threads of their exact run time, thread by thread (a thread that ended since
    the previous call counts as the others', the safe side)."""

    def __init__(self, mask: Iterable[int]):
        mask = sorted(mask)
        every = len(mask) == os.cpu_count()
        self.names = {b"cpu"} if every else {f"cpu{c}".encode() for c in mask}
        self.ncores = len(mask)
        self.last: tuple | None = None

    def idle(self) -> int:
        """Idle + iowait + steal ticks of the cores (the all-cores line when the mask is all)."""
        total = 0
        with open("/proc/stat", "rb") as f:
            for line in f:
                parts = line.split()
                # cpuN user nice system idle iowait irq softirq steal ...
                if parts and parts[0] in self.names:
                    total += int(parts[4]) + int(parts[5]) + int(parts[8])
                elif parts and not parts[0].startswith(b"cpu"):
                    break
        return total

    def __call__(self, pids: tuple[int, ...], born: tuple[int, ...] = ()) -> float | None:
        """``born``: those of ``pids`` the caller started after the previous call (all their
        run time falls inside this sample, so they count as the job's without voiding it)."""
        runs = {(pid, tid): ns for pid in pids for tid, ns in _runtimes(pid).items()}
        now = (time.monotonic(), self.idle(), pids, runs)
        last, self.last = self.last, now
        if last is None or set(last[2]) | set(born) != set(pids):
            return None
        dt = now[0] - last[0]
        if dt <= 0:
            return None
        busy = self.ncores * dt - (now[1] - last[1]) / _TICK
        ours = sum(ns - last[3].get(key, 0) for key, ns in runs.items()) / 1e9
        return max(0.0, (busy - ours) / dt)


def _tids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


class Watcher:
    """The watcher thread of one npurun (the design note). ``follow`` hands it the ranks of an
    attempt; ``close`` stops it (within one sample). ``quiet`` says whether the ranks are in
    the quiet state (SCHED_BATCH / bound) now; ``switches`` counts the moves; ``probe`` is the
    other programs' CPU use (``CpuProbe`` by default; a test hands its own)."""

    def __init__(self, pol: Policy, mask: Iterable[int] | None = None, *,
                 probe: Callable[[tuple[int, ...]], float | None] | None = None,
                 interval: float = INTERVAL):
        self.policy = pol
        self.mask = frozenset(mask if mask is not None else os.sched_getaffinity(0))
        self.probe = probe or CpuProbe(self.mask)
        self.interval = interval
        self.quiet = False
        self.switches = 0
        self.last_load: float | None = None
        self._calm = 0
        self._ranks: dict[int, int] = {}          # pid -> local rank
        self._helpers: tuple[int, ...] = ()
        self._seen: dict[int, set[int]] = {}       # pid -> tids npurun has placed
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
        ``QUIET_SAMPLES`` samples; a busy machine keeps the default class from the start."""
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
            self._seen = {}
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
        was = self.quiet
        if load is not None:
            if load > self.policy.threshold:
                self.quiet, self._calm = False, 0
            elif load < self.policy.threshold / 2:
                self._calm += 1
                if self._calm >= QUIET_SAMPLES:
                    self.quiet = True
            else:
                self._calm = 0
        if self.quiet != was:
            self.switches += 1
            log.info("npurun: other programs use %.2f cores: the ranks %s", load,
                     "go to SCHED_BATCH / their cores" if self.quiet else
                     "go back to the default class / every core")
        for pid, local_rank in ranks.items():
            self._place(pid, local_rank, everyone=self.quiet != was)

    def _place(self, pid: int, local_rank: int, everyone: bool) -> None:
        """Move pid's threads to the current state: all of them at a switch, else the new ones
        only; each only from the state npurun gave it (the design note)."""
        seen = self._seen.setdefault(pid, set())
        core = None
        if self.policy.watch_bind:     # as runtime.sched.core_of, on the cores npurun may use
            cores = sorted(self.mask)
            core = cores[local_rank * len(cores) // max(1, self.policy.ranks)]
        for tid in _tids(pid):
            if everyone or tid not in seen:
                seen.add(tid)
                self._move(tid, core)

    def _move(self, tid: int, core: int | None) -> None:
        quiet = self.quiet
        try:
            if self.policy.watch_batch:
                frm, to = (_OTHER, _BATCH) if quiet else (_BATCH, _OTHER)
                if os.sched_getscheduler(tid) == frm:
                    os.sched_setscheduler(tid, to, os.sched_param(0))
            if core is not None:
                frm, to = (self.mask, {core}) if quiet else ({core}, self.mask)
                if os.sched_getaffinity(tid) == frm:
                    os.sched_setaffinity(tid, to)
        except OSError:    # the thread ended, or a sandbox forbids it: leave it as it is
            pass


def start(pol: Policy) -> Watcher | None:
    """A running watcher for ``pol``, or None when it has nothing to watch."""
    if not pol.watching:
        return None
    try:
        return Watcher(pol)
    except OSError:     # no affinity here
        return None
