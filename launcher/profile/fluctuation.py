"""Fluctuation detection: operator calls far outside their usual time, and ranks that are slower.

Design note. Two rules, robust to the few wild values a shared machine produces. A *floor* keeps
what costs little out: ``floor = max(ABS_FLOOR_US, STEP_SHARE * the median step time)``.

- **A call** of an operator on a rank (at least MIN_CALLS calls there) is flagged when its time
  exceeds ``median + K * max(1.4826 * MAD, REL_FLOOR * median)`` (MAD: the median absolute
  deviation; 1.4826 * MAD estimates the standard deviation of normal noise; REL_FLOOR keeps an
  operator with near-constant times from flagging small excursions: a flagged call takes at
  least 2.5 times its median) and by at least the floor. Each call is judged at the speed its
  rank ran at that moment (``local_factors``): its time divided by how much slower than their
  own medians the calls of *other* operators just before it, or just after it, ran. A
  core that runs slower for a while slows every operator then: measured here, in a healthy
  world-2 run of examples/train_ddp.py, every kernel of one rank ran 2-3 times its median in
  *user* CPU time for ~30 ms, with no page fault and no context switch (another VM, or the
  other rank on the core's hyperthread sibling), and the call rule flagged the kernels that
  crossed 2.5x. An operator slow on its own is slow beside normal neighbours. Where the trace
  has CPU times the speed is read from them alone, for the wall time too: neighbours that
  were descheduled ran no slower, and their wall factor (2.3x under one busy loop) hid a call
  of 5 times its CPU median.
- **A rank** is flagged for an operator (not a collective, below) that every rank calls equally
  often (the same work) when
  its median time is at least (1 + RANK_REL) times the median of the other ranks' medians, and
  that much beyond the rank's own *factor* (the median of this ratio over all the operators the
  ranks share: a rank that is slower at everything runs on a slower or busier core, which the
  slowest-rank line reports, not an operator), at least RANK_SHARE of its calls are slower than
  every other rank's median, and its median exceeds the others' by at least the floor per step.

A collective's time here is its transfer time (its duration less its wait for a late peer): a
late peer is the peer's problem, reported as that peer's lateness, not as the collective's.

In a simulation a kernel's wall time also holds the time its thread was descheduled or waited
for the GIL: measured on 2 loaded cores, a kernel of 9 ms CPU took a median 42 ms of wall time
and single calls 20 times their median, while the CPU times of the same kernel on two ranks
agreed within 2 %; on an idle machine single calls still took 4 times their median wall time
and twice their median CPU time. So where the trace has each task's thread CPU time (``runtime.profiler``
records it for every task), both rules judge the work, the CPU time: a call must be an
outlier in CPU time, by the floor scaled by the operator's median CPU / wall time (load
stretches wall time and the step, not CPU time), and its wall time must exceed the median by
the floor; the rank rule judges CPU times alone, the floor per step included. Under load the
wall times are the scheduler's: with one busy loop beside 2 ranks on 2 cores, asking a wall-time
outlier too missed a call of 5 times its CPU median in 5 runs of 20, and asking a rank's wall
median to lose the floor missed a rank doing 30 % more work in 5 of 10. Time lost to the host's
scheduler is thereby never blamed on an operator; a kernel that sleeps is not flagged either
(it does no work).

**Device time** (the first measure, where the trace has each task's run delay,
``args.delay_us``): a task is judged by the time it held its stream less the time its worker
waited for a core (Linux's per-thread run delay, /proc/thread-self/schedstat). The scheduler's
share is thereby left out, as the CPU rule above leaves it out, while a delay that burns no CPU
(a wait, a simulated latency, a host function on the stream) is the operator's, which the CPU
rule could not see: a kernel sleeping 60 ms at one step of one rank was "fluctuations: none".
Both rules apply unchanged to device times (``device_time``), neighbours' factors included;
the floor, which comes from the wall time of the steps, is scaled by the operator's median
device / wall time (load stretches wall time, not device time; the rank rule scales it so for
CPU times too: a rank doing 30 % more work lost 2.4 ms a step against a floor of 2.2-2.6 ms at
steps of 110-130 ms under load); flags say ``measure="device"``. What a device time still holds
beyond the work and the wait: a worker waiting for the GIL sleeps (no run delay), behind a
holder that runs or is itself descheduled, and a guest vCPU's stolen time is neither CPU nor run
delay. Measured in healthy train_ddp runs beside a busy loop, single calls took 2.5-20 times
their device medians that way (2 runs in 9 flagged one to three calls); a 2 ms kernel took
24 ms beyond its CPU time, a 7 ms one 36 ms (its comm worker's AllReduce, descheduled, beside
it); the largest such stall of 9 busy runs was 16-36 ms. So a call whose device-time excess is
not also an excess of CPU work (the CPU rule above) is flagged only from STALL_US (45 ms)
beyond the operator's usual; a 60 ms latency is flagged (measured 51-60 ms beyond its usual:
the sleep, less what the run delay over-counts), a 30 ms one only when it is work. (An
allowance relative to the rank's other operators' stalls, 2.5 times the largest, flagged
stalls of 12-25 ms in 3 of 30 runs: a rank's operators do not stall alike.) Traces without run delays are judged
by the CPU rule above.

Collectives are left out of both rules: the transfer time of one call is set by when the OS
runs every member process, and its CPU time holds spinning waits, so neither tells a slow call
from a descheduled peer (measured: healthy runs on an idle machine had single AllReduces at 6-10
times their median), nor a slow rank from one whose peer ran later: in healthy world-2 runs of
examples/train_ddp.py on 2 cores (a compute worker, a comm worker and a main thread per rank),
one rank's median HcclAllReduce took 1.26-3.36 times the other's, and the rank rule flagged it
in 5 of 22 runs. Nor does a collective enter a rank's factor. A collective slow call after
call is the fail-slow detector's "slow inside the collective" (docs/hangs.md); a rank that
makes its peers wait is the summary's slowest rank (its busy time, peer waits left out).

Pure: arrays in, findings out; unit-tested in tests/unit/test_profsummary.py.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

MIN_CALLS = 8           # calls of an operator on a rank before its calls are judged
K = 5.0                 # robust standard deviations above the median
REL_FLOOR = 0.30        # the deviation is taken as at least this share of the median
ABS_FLOOR_US = 1000.0   # an excess below 1 ms (a call; a rank: per step) is never flagged
STEP_SHARE = 0.02       # ... nor one below 2 % of the median step time
RANK_REL = 0.15         # a rank's median at least this much above the others'
RANK_SHARE = 0.75       # ... in at least this share of its calls
MAD_SIGMA = 1.4826
NEIGHBOURS = 2          # calls of other operators on each side that tell a rank's speed then
STALL_US = 45000.0      # a call's device-time excess that is not CPU work flags it from 45 ms


@dataclass(frozen=True)
class Flag:
    """One finding: ``what`` is "call" (one slow call) or "rank" (a rank slower at an op)."""

    what: str
    rank: int
    op: str
    kind: str
    step: int | None        # the call's step ("call"); None for "rank" (see steps)
    steps: tuple            # the steps concerned: (step,) or (first, last)
    site: str | None
    time_us: float          # the call's time, or the rank's median
    usual_us: float         # the operator's median on the rank, or the other ranks' median
    calls: int
    measure: str = "wall"   # what time_us / usual_us are: "device" time (held the stream, less
    #                         the worker's run delay), "cpu" time, or "wall" time (see _measure)

    @property
    def ratio(self) -> float:
        return self.time_us / self.usual_us if self.usual_us > 0 else float("inf")


@dataclass
class OpCalls:
    """The calls of one operator on one rank (in steps): times, CPU times, steps, sites, and
    the run delay of the worker over each call (``delay``: None or NaN where not recorded)."""

    rank: int
    op: str
    kind: str
    time: np.ndarray          # microseconds (a collective: its transfer time)
    cpu: np.ndarray           # microseconds, NaN where not recorded
    step: np.ndarray
    site: list
    t0: np.ndarray | None = None    # start times (us), for ``local_factors``; None: unknown
    delay: np.ndarray | None = None  # microseconds the worker waited for a core in each call


def _spread(v: np.ndarray) -> tuple[float, float]:
    m = float(np.median(v))
    return m, max(MAD_SIGMA * float(np.median(np.abs(v - m))), REL_FLOOR * m)


def _outliers(v: np.ndarray, floor_us: float) -> tuple[np.ndarray, float]:
    m, s = _spread(v)
    return (v > m + K * s) & (v - m >= floor_us), m


def floor_for(step_us: float) -> float:
    """The least excess worth a flag in a job whose median step takes ``step_us``."""
    return max(ABS_FLOOR_US, STEP_SHARE * step_us)


def _has_cpu(c: OpCalls) -> bool:
    return len(c.cpu) > 0 and not np.isnan(c.cpu).any()


def _has_delay(c: OpCalls) -> bool:
    return c.delay is not None and len(c.delay) == len(c.time) > 0 and \
        not np.isnan(c.delay).any()


def device_time(c: OpCalls) -> np.ndarray:
    """Each call's time on the device: the time it held its stream less the time its worker
    waited for a core (its run delay); its wall time where no run delay was recorded."""
    if not _has_delay(c):
        return c.time
    return np.maximum(c.time - c.delay, 0.0)


def _judged(c: OpCalls) -> bool:
    return len(c.time) >= MIN_CALLS and c.kind != "collective"


def local_factors(calls: list[OpCalls]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (wall, CPU) factors of each of ``calls`` (one rank's operators, in that order), one
    per call: how much slower than usual the rank ran around each call. Each side of the call
    says it by the median, over the NEIGHBOURS calls of other judged operators started just
    before it (or just after), of their time over their operator's median; the factor is the
    larger side's, at least 1 (a side with fewer such calls says nothing; no start times: 1).
    A call at either edge of a slow stretch has one slow side."""
    out = [(np.ones(len(c.time)), np.ones(len(c.time))) for c in calls]
    judged = [i for i, c in enumerate(calls)
              if _judged(c) and c.t0 is not None and len(c.t0) == len(c.time)]
    if len(judged) < 2:
        return out
    judged_calls = [calls[i] for i in judged]
    t0 = np.concatenate([c.t0 for c in judged_calls])
    dev = [device_time(c) for c in judged_calls]
    wall = np.concatenate([d / max(float(np.median(d)), 1e-9) for d in dev])
    cpu = np.concatenate([c.cpu / max(float(np.median(c.cpu)), 1e-9) if _has_cpu(c)
                          else np.full(len(c.time), np.nan) for c in judged_calls])
    op = np.concatenate([np.full(len(c.time), k) for k, c in enumerate(judged_calls)])
    order = np.argsort(t0, kind="stable")
    wall, cpu, op = wall[order], cpu[order], op[order]
    pos = np.empty(len(order), np.int64)       # a call's place in start-time order
    pos[order] = np.arange(len(order))
    at = 0
    for k, (i_call, c) in enumerate(zip(judged, judged_calls)):
        mine = pos[at:at + len(c.time)]
        at += len(c.time)
        others = np.flatnonzero(op != k)        # the calls of other operators, in time order
        i = np.searchsorted(others, mine)       # others[i - 1] starts before, others[i] after
        fw, fc = np.ones(len(mine)), np.ones(len(mine))
        before, after = np.arange(-NEIGHBOURS, 0), np.arange(NEIGHBOURS)
        for side in (i[:, None] + before, i[:, None] + after):
            ok = (side >= 0).all(axis=1) & (side < len(others)).all(axis=1)
            near = others[np.clip(side, 0, max(len(others) - 1, 0))]
            w = np.where(ok, np.median(wall[near], axis=1), 1.0)
            u = np.median(cpu[near], axis=1)
            fw = np.maximum(fw, w)
            fc = np.maximum(fc, np.where(ok & ~np.isnan(u), u, 1.0))
        out[i_call] = (fw, fc)
    return out


def slow_calls(c: OpCalls, floor_us: float = ABS_FLOOR_US,
               factors: tuple | None = None) -> list[Flag]:
    """The calls of ``c`` far above its usual time (the call rule of the design note), each
    judged at its rank's speed then (``factors``: its ``local_factors``; None: 1)."""
    if not _judged(c):
        return []
    fw, fc = factors if factors is not None else (1.0, 1.0)
    m = float(np.median(c.time))
    measure = "wall"
    if _has_delay(c):
        # the time the call held its stream, less its worker's waits for a core: a delay that
        # burns no CPU (a wait, a simulated latency) is the operator's, the scheduler's is not.
        # An excess that is neither CPU work nor such a wait must reach STALL_US: a worker also
        # sleeps while it waits for the GIL (the module note has the figures)
        t = device_time(c)
        m = float(np.median(t))
        # the floor comes from the step's wall time, which load stretches and device time not
        wall = float(np.median(c.time))
        out = _outliers(t / fw, floor_us * (min(1.0, m / wall) if wall > 0 else 1.0))[0]
        if out.any() and _has_cpu(c):
            gap = t - c.cpu
            stall = gap - float(np.median(gap)) >= STALL_US
            scale = min(1.0, float(np.median(c.cpu)) / m) if m > 0 else 1.0
            out &= stall | _outliers(c.cpu / fc, floor_us * scale)[0]
        return [Flag("call", c.rank, c.op, c.kind, int(c.step[i]), (int(c.step[i]),),
                     c.site[i], float(t[i]), m, len(t), "device") for i in np.flatnonzero(out)]
    if not _has_cpu(c):
        out = _outliers(c.time / fw, floor_us)[0]
    else:
        # the work is the CPU time, at the core's speed then (fc); the wall time only has to
        # lose the floor (the module note says why, measured); the floor in CPU time is scaled
        # by the operator's CPU / wall time, as load stretches wall time, not CPU time
        scale = min(1.0, float(np.median(c.cpu)) / m) if m > 0 else 1.0
        out = _outliers(c.cpu / fc, floor_us * scale)[0] & (c.time / fc - m >= floor_us)
    return [Flag("call", c.rank, c.op, c.kind, int(c.step[i]), (int(c.step[i]),), c.site[i],
                 float(c.time[i]), m, len(c.time), measure) for i in np.flatnonzero(out)]


def _comparable(per_rank: list[OpCalls]) -> bool:
    counts = {len(c.time) for c in per_rank}
    return len(per_rank) >= 2 and len(counts) == 1 and counts.pop() >= max(MIN_CALLS // 2, 1)


def _measure(per_rank: list[OpCalls]) -> tuple[list[np.ndarray], str]:
    """The times the rank rule judges, and which they are: device times where every rank
    recorded its run delays, else CPU times where every rank has them, else wall times."""
    if all(_has_delay(c) for c in per_rank):
        return [device_time(c) for c in per_rank], "device"
    cpu = all(_has_cpu(c) for c in per_rank)
    return [c.cpu if cpu else c.time for c in per_rank], "cpu" if cpu else "wall"


def _ratios(per_rank: list[OpCalls]) -> np.ndarray:
    """Each rank's median over the median of the other ranks' medians."""
    med = np.asarray([np.median(v) for v in _measure(per_rank)[0]])
    return np.asarray([med[i] / max(float(np.median(np.delete(med, i))), 1e-9)
                       for i in range(len(med))])


def rank_factors(ops: list[list[OpCalls]]) -> dict[int, float]:
    """rank -> the median, over the operators every rank calls equally often (each a list of
    OpCalls, one per rank, in the same rank order), of its time over the others' (>= 1 each)."""
    ratios = [_ratios(per_rank) for per_rank in ops
              if _comparable(per_rank) and per_rank[0].kind != "collective"]
    if not ratios:
        return {}
    med = np.median(np.asarray(ratios), axis=0)
    return {c.rank: max(1.0, float(f)) for c, f in zip(ops[0], med)}


def slow_ranks(per_rank: list[OpCalls], steps: int, floor_us: float = ABS_FLOOR_US,
               factors: dict | None = None) -> list[Flag]:
    """Ranks markedly slower than the others at one operator they all call equally often
    (``factors``: ``rank_factors`` of the job, each rank's general slowness)."""
    if steps <= 0 or not _comparable(per_rank) or per_rank[0].kind == "collective":
        return []
    measure, unit = _measure(per_rank)
    med = np.asarray([np.median(v) for v in measure])
    # the floor per step comes from the steps' wall time, which load stretches; device and CPU
    # times it does not: the floor shrinks with them (a healthy job's floor, under load)
    walls = float(np.median([np.median(c.time) for c in per_rank]))
    if unit != "wall" and walls > 0:
        floor_us *= min(1.0, float(np.median(med)) / walls)
    flags = []
    for i, c in enumerate(per_rank):
        others = np.delete(med, i)
        usual = float(np.median(others))
        factor = (factors or {}).get(c.rank, 1.0)
        if med[i] < (1 + RANK_REL) * factor * usual:
            continue
        if float(np.mean(measure[i] > others.max())) < RANK_SHARE:
            continue
        # the time lost per step: with CPU times, the extra work itself (a thread spends at
        # least its CPU time in wall time, whatever the load; the module note has the figures)
        if (med[i] - usual) * len(c.time) / steps < floor_us:
            continue                      # no time lost that matters
        site = Counter(s for s in c.site if s).most_common(1)
        flags.append(Flag("rank", c.rank, c.op, c.kind, None,
                          (int(c.step.min()), int(c.step.max())), site[0][0] if site else None,
                          float(med[i]), usual, len(c.time), unit))
    return flags


RULES = {"min_calls": MIN_CALLS, "k": K, "rel_floor": REL_FLOOR, "abs_floor_us": ABS_FLOOR_US,
         "step_share": STEP_SHARE, "rank_rel": RANK_REL, "rank_share": RANK_SHARE,
         "stall_us": STALL_US}
