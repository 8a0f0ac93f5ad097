"""Where a rank's step time went: per-rank traces -> steps, late-peer waits and the time split.

Design note. Input: the per-rank Chrome traces ``runtime.profiler`` writes (one file per rank,
wall-clock microseconds shared by the ranks of a machine). Three rules, each stated once:

- **Steps.** With two or more ``step()`` marks on a rank, step N is the device work enqueued
  between marks N-1 and N: a task belongs to it when its timeline value on its stream
  (``args.task``) lies between the stream's last issued values at the two marks (tasks without
  one - a graph's nodes, a copy run inline - go by time). The step *ends* when its last task ends,
  or at its closing mark if the host comes later; it *begins* where the previous step ended. So
  steps tile the device timeline and the host running ahead of the device (one step in flight)
  does not shift work between steps. What comes before the first mark and after the last is no
  step. Without marks the whole run (first task start to last task end) is one step.
- **Waiting for a late peer.** A collective (same communicator name, seq and op on every rank that
  took part) cannot finish anywhere before its last member has started it. On rank r its first
  ``max(start over the members) - start_r`` microseconds (at most its duration) are waiting for a
  late peer, the rest is the collective's own transfer. This compares start times of different
  processes: exact on one machine (one clock), as good as the nodes' clock sync otherwise.
  Point-to-point operations count as transfer.
- **Split of a step's wall time.** At each instant of a step the rank is in the first of these
  that some stream of the rank is doing: *compute* (a kernel), *transfer* (a collective past its
  late-peer wait), *copy* (memcpy / memset), *peer wait*, else *host* (no task running: the host
  code between tasks, or the device waiting on an event). Overlap is thereby counted once, as the
  more useful activity, and the five parts sum to the step time exactly.

Pure: numpy on arrays built from the traces; no printing. Used by ``summary``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from launcher.profile.tracemerge import labelled_rank, read_trace

PARTS = ("compute", "transfer", "copy", "peer_wait", "host")
COMPUTE, TRANSFER, COPY, WAIT, HOST = range(5)
KIND_OF_CAT = {"kernel": "kernel", "collective": "collective", "copy": "copy"}


@dataclass
class RankTrace:
    """The events of one rank's trace as arrays (times in microseconds)."""

    rank: int
    path: str
    name: list = field(default_factory=list)      # operator name per event
    kind: list = field(default_factory=list)      # "kernel" | "collective" | "copy" | None
    track: np.ndarray = None
    t0: np.ndarray = None
    t1: np.ndarray = None
    cpu: np.ndarray = None                        # thread CPU time, NaN when not recorded
    delay: np.ndarray = None                      # the thread's run delay, NaN when not recorded
    task: np.ndarray = None                       # timeline value on its stream, -1 if none
    site: list = field(default_factory=list)
    coll_key: list = field(default_factory=list)  # (comm, seq, op) of a collective, else None
    marks: list = field(default_factory=list)     # [(time, {track: issued}, host run delay)]
    memory: list = field(default_factory=list)    # [(time, device, allocated, reserved)]
    peaks: dict = field(default_factory=dict)     # device -> {"allocated", "reserved"}
    # filled by analyze()
    wait: np.ndarray = None                       # late-peer wait of each event (0 if none)
    step: np.ndarray = None                       # step of each event: 1..S, 0 before, S+1 after
    ends: np.ndarray = None                       # end of step 0 (set-up) .. step S
    parts: np.ndarray = None                      # [S, 5] microseconds per step and part
    marked: bool = False

    @property
    def steps(self) -> int:
        return 0 if self.ends is None else len(self.ends) - 1

    def host_delays(self) -> np.ndarray | None:
        """The host thread's run delay (us) between consecutive marks, one per step; None
        without marks or where the trace did not record it."""
        d = np.asarray([m[2] for m in self.marks], float)
        if len(d) < 2 or np.isnan(d).any():
            return None
        return np.diff(d)


def load(path: str, rank: int | None = None) -> RankTrace:
    """One rank's trace file. Raises ValueError naming the file when it is not a Chrome trace."""
    doc, events = read_trace(path)
    if rank is None:
        rank = _rank_of(path, events)
    rt = RankTrace(rank=rank, path=path)
    tr, t0, t1, cpu, delay, task = [], [], [], [], [], []
    for e in events:
        ph = e.get("ph")
        a = e.get("args") or {}
        if ph == "X":
            kind = KIND_OF_CAT.get(e.get("cat"))
            if kind is None and e.get("cat") not in ("event",):
                continue                   # ranges, steps, graph containers: not device tasks
            ts = float(e.get("ts", 0.0))
            rt.name.append(str(e.get("name")))
            rt.kind.append(kind)
            tr.append(int(e.get("tid", 0)))
            t0.append(ts)
            t1.append(ts + float(e.get("dur", 0.0)))
            cpu.append(float(a.get("cpu_us", np.nan)))
            delay.append(float(a.get("delay_us", np.nan)))
            task.append(int(a.get("task", -1)))
            rt.site.append(a.get("site"))
            rt.coll_key.append((a.get("comm"), a["seq"], e.get("name"))
                               if kind == "collective" and "seq" in a and "peer" not in a
                               else None)
        elif ph == "i" and e.get("name") == "step mark":
            rt.marks.append((float(e["ts"]), {int(k): int(v)
                                              for k, v in (a.get("issued") or {}).items()},
                             float(a.get("delay_us", np.nan))))
        elif ph == "C" and str(e.get("name", "")).endswith(" memory"):
            dev = str(e["name"])[3:-len(" memory")]
            rt.memory.append((float(e["ts"]), dev, int(a.get("allocated", 0)),
                              int(a.get("reserved", 0))))
    rt.track = np.asarray(tr, np.int64)
    rt.t0, rt.t1 = np.asarray(t0, float), np.asarray(t1, float)
    rt.cpu, rt.task = np.asarray(cpu, float), np.asarray(task, np.int64)
    rt.delay = np.asarray(delay, float)
    rt.marks.sort(key=lambda m: m[0])
    if isinstance(doc, dict):
        rt.peaks = ((doc.get("npusim") or {}).get("memory_peak")) or {}
    return rt


def _rank_of(path: str, events: list) -> int:
    rank = labelled_rank(path, events)
    if rank is None:
        raise ValueError(f"{path}: cannot tell its rank (no 'rank N' process name, no "
                         "trace_rank<N>.json file name)")
    return rank


def late_peer_waits(traces: list[RankTrace]) -> None:
    """Set ``wait`` of every event: a collective's time before its last member started it."""
    last: dict = {}
    for rt in traces:
        for i, key in enumerate(rt.coll_key):
            if key is not None:
                s = rt.t0[i]
                if last.get(key, -np.inf) < s:
                    last[key] = s
    for rt in traces:
        w = np.zeros(len(rt.t0))
        idx = [i for i, k in enumerate(rt.coll_key) if k is not None]
        if idx:
            idx = np.asarray(idx)
            arrive = np.asarray([last[rt.coll_key[i]] for i in idx])
            w[idx] = np.clip(arrive - rt.t0[idx], 0.0, rt.t1[idx] - rt.t0[idx])
        rt.wait = w


def assign_steps(rt: RankTrace) -> None:
    """Set ``step``, ``ends`` and ``marked`` of ``rt`` (see the design note)."""
    n = len(rt.t0)
    if len(rt.marks) < 2:
        rt.marked = False
        if n == 0:
            rt.ends, rt.step = np.zeros(1), np.zeros(0, np.int64)
            return
        rt.ends = np.asarray([rt.t0.min(), rt.t1.max()])
        rt.step = np.ones(n, np.int64)
        return
    rt.marked = True
    nm = len(rt.marks)
    step = np.full(n, -1, np.int64)
    has = rt.task >= 0
    for tr in np.unique(rt.track[has]):
        issued = np.asarray([m[1].get(int(tr), 0) for m in rt.marks], np.int64)
        issued = np.maximum.accumulate(issued)
        sel = has & (rt.track == tr)
        step[sel] = np.searchsorted(issued, rt.task[sel], side="left")
    mark_t = np.asarray([m[0] for m in rt.marks])
    ends = mark_t.copy()
    known = step >= 0
    if known.any():
        # the latest end of each mark interval's tasks (ufunc.at: no Python loop per event)
        last = np.full(nm + 1, -np.inf)
        np.maximum.at(last, step[known], rt.t1[known])
        ends = np.maximum(ends, last[:nm])
    ends = np.maximum.accumulate(ends)
    unknown = ~known                     # by time: the step whose window holds the start
    step[unknown] = np.searchsorted(ends, rt.t0[unknown], side="left")
    rt.ends, rt.step = ends, step


def split(rt: RankTrace) -> None:
    """Set ``parts``: each step's wall time split by the precedence of the design note."""
    S = rt.steps
    if S <= 0:
        rt.parts = np.zeros((0, len(PARTS)))
        return
    kind = np.asarray([{"kernel": COMPUTE, "collective": TRANSFER, "copy": COPY}.get(k, -1)
                       for k in rt.kind], np.int64)
    lo, hi, cls = [rt.t0[kind == COMPUTE], rt.t0[kind == COPY]], \
        [rt.t1[kind == COMPUTE], rt.t1[kind == COPY]], [COMPUTE, COPY]
    coll = kind == TRANSFER
    mid = rt.t0[coll] + rt.wait[coll]
    lo += [mid, rt.t0[coll]]
    hi += [rt.t1[coll], mid]
    cls += [TRANSFER, WAIT]
    edges = np.unique(np.concatenate([rt.ends] + lo + hi))
    edges = edges[(edges >= rt.ends[0]) & (edges <= rt.ends[-1])]
    seg = np.diff(edges)
    label = np.full(len(seg), HOST, np.int64)
    for c in (WAIT, COPY, TRANSFER, COMPUTE):          # lowest precedence first: later wins
        i = cls.index(c)
        a, b = lo[i], hi[i]
        keep = b > a
        cover = np.zeros(len(edges) + 1, np.int64)
        np.add.at(cover, np.searchsorted(edges, a[keep], side="left"), 1)
        np.add.at(cover, np.searchsorted(edges, b[keep], side="left"), -1)
        active = np.cumsum(cover)[:len(seg)] > 0
        label[active] = c
    which = np.searchsorted(rt.ends, edges[:-1], side="right") - 1     # step index 0..S-1
    ok = (which >= 0) & (which < S)
    flat = np.bincount(which[ok] * len(PARTS) + label[ok], weights=seg[ok],
                       minlength=S * len(PARTS))
    rt.parts = flat.reshape(S, len(PARTS))


def analyze(traces: list[RankTrace]) -> None:
    """Waits, steps and splits of every rank's trace (in place)."""
    late_peer_waits(traces)
    for rt in traces:
        assign_steps(rt)
        split(rt)


def peak_memory(rt: RankTrace) -> tuple[int, int]:
    """(allocated, reserved) peak bytes of the rank: the pools' own peaks, else the counters'."""
    if rt.peaks:
        return (max(int(p.get("allocated", 0)) for p in rt.peaks.values()),
                max(int(p.get("reserved", 0)) for p in rt.peaks.values()))
    if rt.memory:
        return max(m[2] for m in rt.memory), max(m[3] for m in rt.memory)
    return 0, 0
