"""Fail-slow: the rank that holds a communicator back without failing, and what it costs.

Design note. Every rank publishes, per communicator, the start and end of its last collectives
and, for each, the peer it waited longest for inside it and how long (``hccl.flight``'s
``timeline``). ``detect`` looks at the last ``window`` collectives that every member published
and tells two kinds apart, as Falcon (arXiv 2410.12588) does:

- **late to arrive** (its own code is slow: compute, a data loader): a collective cannot finish
  on any rank before its last rank arrives, and then finishes on all of them at about the same
  time, so rank i's duration ``end_i - start_i`` is the time it waited for the last arrival plus
  the collective itself. The rank with the shortest duration arrived last, and
  ``median of the others' durations - its duration`` is how late it was. Only durations, each
  measured on one rank's own clock, are compared: no clock offset between nodes enters.
- **slow inside the collective** (its transfers: a slow link, a slow NIC): everyone enters
  together, but the collective takes long and the peers of the slow rank wait for messages from
  it. Each rank names the peer it waited longest for in each collective (itself when it waited
  for the delivery of its own send, with that send's receiver), and when that wait ended. Only
  the part of a wait beyond the peer's later start counts (a slow sender makes its receiver
  late for the next collective, which makes the sender wait in turn). A wait for a peer that
  was itself waiting for another rank passes on up to the end of the peer's wait (the peer
  could not answer before its own data came: a star's hub waits for the slow leaf while the
  other leaves, and the slow leaf too, wait for its answer); a peer whose wait ended after this
  one's did not hold it up, and all of it counts. The rank waited on most, by far (the longest
  wait on it per collective, summed, against any other rank's), is named, with the links out
  of it that were waited on (``links``: which receiver, the median wait, the share). This
  compares times of different ranks: it takes the nodes' clocks to agree within a
  millisecond or so (NTP or PTP on a cluster, one clock on one machine), an error that only
  shifts each wait by that much, well under MIN_INSIDE. Schedules that relay data (a ring's
  upstream neighbour) pass some of the blame on, so the name is exact for direct exchanges
  (2 ranks, the mesh AllReduce from 3 ranks) and the star at any world size (the slow leaf, or
  the hub and which of its links), and points near the slow link otherwise. Timelines without
  wait ends (an older rank) fall back to subtracting the peer's own wait.

A rank is named only when it is last (or waited on most) in at least LAST_SHARE of the window,
its median lateness is at least MIN_LATENESS (late to arrive) or MIN_INSIDE seconds (slow
inside), and the others lose at least MIN_SHARE of their time waiting for it: the absolute bounds
keep the scheduling noise of a healthy job out (a rank descheduled for a few milliseconds; on 2
loaded cores a healthy star AllReduce still waits a median 3.4 ms for its hub's answer after the
blame passing), the relative one keeps a lateness that costs the job nothing out. ``Tracker``
merges the states npurun polls into per-rank histories, runs ``detect`` and turns findings into
episodes (one notice each).
Pure: no I/O, no clock of its own; unit-tested in tests/unit/test_failslow_detector.py (worlds
2-5) and end to end in tests/faults/test_failslow_nodes.py (three network namespaces).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

WINDOW = 200          # collectives per verdict
MIN_SEQS = 60         # fewer common collectives than this: no verdict
WARMUP = 20           # a communicator's first collectives are not looked at (see Tracker)
CONFIRM = 2           # polls in a row with the same finding before it is told
LAST_SHARE = 0.8      # last (or most waited on) at this share of the window at least
MIN_LATENESS = 0.005  # s, median lateness at least (late to arrive)
MIN_INSIDE = 0.008    # s, median wait for it inside the collective at least (slow inside)
MIN_SHARE = 0.05      # the others lose this share of their time waiting for it, at least
DOMINANCE = 2.0       # slow inside: waited on this many times more than any other rank
KEEP = 1024           # collectives kept per rank and communicator by a Tracker
QUIET_POLLS = 3       # polls without the finding that end an episode
LINK_SHARE = 0.25     # slow inside: a link out of the slow rank is named with this share of
                      # the waits on it at least

LATE = "late to arrive"
INSIDE = "slow inside the collective"


@dataclass(frozen=True)
class Finding:
    """One slow rank of one communicator over one window of collectives."""

    comm: str
    comm_id: int
    kind: str                 # LATE or INSIDE
    ranks: list               # the slow rank(s), job ranks
    lateness: float           # s, median per collective: how late it arrived / was waited for
    waited_share: float       # share of the other ranks' time spent waiting for it
    last_share: float         # share of the window where it was last (waited on most)
    first_seq: int
    last_seq: int
    collectives: int          # in the window
    seconds: float            # the window's length on the other ranks' clocks (median)
    # slow inside: the links out of the slow rank that were waited on, most first (``_links``)
    links: list = field(default_factory=list)

    def line(self) -> str:
        """``slow rank(s): [1]`` and the figures, in one line."""
        what = ("arrives late by a median" if self.kind == LATE
                else "is waited for inside the collective a median")
        return (f"slow rank(s): {self.ranks} in comm {self.comm}: {self.kind}: "
                f"{what} {self.lateness * 1e3:.1f} ms at {self.last_share:.0%} of "
                f"{self.collectives} collectives (seq {self.first_seq}-{self.last_seq}, "
                f"{self.seconds:.1f} s); the other ranks spent {self.waited_share:.0%} of "
                f"their time waiting for it{self.link_text()}")

    def link_text(self) -> str:
        """``; slow link(s): 1->2 (median 54.0 ms, 97% of the waits)`` or nothing."""
        if not self.links:
            return ""
        parts = [f"{x['src']}->{x['dst'] if x['dst'] >= 0 else '?'} (median "
                 f"{x['lateness'] * 1e3:.1f} ms, {x['share']:.0%} of the waits)"
                 for x in self.links]
        return f"; slow link(s): {', '.join(parts)}"

    def to_dict(self) -> dict:
        return asdict(self)


def detect(timelines: dict, *, window: int = WINDOW, comm: str = "?",
           comm_id: int = 0) -> Finding | None:
    """The slow rank of one communicator, or None.

    Args:
        timelines: job rank -> ``{"seq", "start", "end", "wait_peer", "wait"}`` (equal-length
            sequences, one entry per collective; ``wait_peer`` a job rank or -1), one entry per
            member of the communicator.
        window: how many of the latest collectives every member has to look at.
    Raises ValueError naming the rank and lengths when a timeline's lists differ in length.
    """
    if window < 2:
        raise ValueError(f"window={window} must be at least 2 collectives")
    ranks = sorted(timelines)
    if len(ranks) < 2:
        return None
    cols = {}
    # when every rank published them: when its longest wait ended, and a send's receiver
    ends = all("wait_end" in timelines[r] and "wait_to" in timelines[r] for r in ranks)
    keys = ("seq", "start", "end", "wait_peer", "wait") + (("wait_end", "wait_to") if ends else ())
    for r in ranks:
        t = timelines[r]
        lens = {k: len(t[k]) for k in keys}
        if len(set(lens.values())) != 1:
            raise ValueError(f"timeline of rank {r}: lists of different lengths {lens}")
        cols[r] = {k: np.asarray(t[k], dtype=np.float64) for k in lens}
    common = cols[ranks[0]]["seq"]
    for r in ranks[1:]:
        common = np.intersect1d(common, cols[r]["seq"])
    common = common[-window:]
    if len(common) < MIN_SEQS:
        return None
    start, dur, peer, wait, span, wend, wto = [], [], [], [], [], [], []
    for r in ranks:
        c = cols[r]
        seq, idx = np.unique(c["seq"], return_index=True)
        at = idx[np.searchsorted(seq, common)]
        start.append(c["start"][at])
        dur.append(c["end"][at] - c["start"][at])
        peer.append(c["wait_peer"][at])
        wait.append(c["wait"][at])
        span.append(c["end"][at[-1]] - c["start"][at[0]])
        if ends:
            wend.append(c["wait_end"][at])
            wto.append(c["wait_to"][at])
    start, dur, peer, wait = np.array(start), np.array(dur), np.array(peer), np.array(wait)
    extra = (np.array(wend), np.array(wto)) if ends else None
    span = np.maximum(np.array(span), 1e-9)
    n, m = dur.shape
    window_info = dict(comm=comm, comm_id=comm_id, first_seq=int(common[0]),
                       last_seq=int(common[-1]), collectives=m)
    # late to arrive: the shortest duration arrived last
    last = np.argmin(dur, axis=0)
    s = int(np.bincount(last, minlength=n).argmax())
    others = np.arange(n) != s
    lost = dur[others] - dur[s]                        # what each other rank lost, per seq
    lateness = float(np.median(np.median(dur[others], axis=0) - dur[s]))
    share = float(np.clip(lost, 0, None).sum(axis=1).sum() / span[others].sum())
    last_share = float(np.mean(last == s))
    if last_share >= LAST_SHARE and lateness >= MIN_LATENESS and share >= MIN_SHARE:
        return Finding(kind=LATE, ranks=[ranks[s]], lateness=lateness, waited_share=share,
                       last_share=last_share, seconds=float(np.median(span[others])),
                       **window_info)
    # slow inside: the rank the others waited for most, by far
    # A wait for a peer that entered the collective later is that late start's, not its link's
    # (a slow sender makes its receiver late for the next collective, which makes the sender
    # wait in turn): only the wait beyond the peer's later start counts. A rank's wait for the
    # delivery of its own sends names itself: its link is the slow one.
    rank_of = np.array(ranks, dtype=np.float64)
    pos = np.searchsorted(rank_of, np.where(peer >= 0, peer, rank_of[0]))
    pos = np.minimum(pos, n - 1)
    peer_start = np.take_along_axis(start, pos, axis=0)
    excess = np.clip(wait - np.clip(peer_start - start, 0, None), 0, None)
    own = peer == rank_of[:, None]
    peer_peer = np.take_along_axis(peer, pos, axis=0)
    if extra is not None:
        # ... and a wait for a peer that was itself waiting for another rank passes on up to
        # the end of the peer's wait: the peer could not send before its own data came (a
        # star's hub waits for the slow leaf while the others, the slow leaf too, wait for its
        # answer). Only what this rank waited after the peer's wait ended is the peer's. A
        # peer whose wait ended after this one's did not hold it up: all of it counts.
        wait_end, _ = extra
        peer_end = np.take_along_axis(wait_end, pos, axis=0)
        relayed = (peer_peer >= 0) & (peer_peer != peer) & (peer_end <= wait_end)
        net = np.where(relayed & ~own, np.clip(wait_end - peer_end, 0, excess), excess)
    else:
        # (timelines without wait ends) the part beyond the peer's own wait in that collective
        # counts (all of it when the peer waited for a third rank; the part beyond the late
        # start when it waited for this rank: two ranks exchanging in turn)
        passed = np.where(peer_peer == rank_of[:, None],
                          np.take_along_axis(excess, pos, axis=0),
                          np.take_along_axis(wait, pos, axis=0))
        net = np.where(own, excess, np.clip(excess - passed, 0, None))
    on = np.where(peer[None, :, :] == rank_of[:, None, None], net[None, :, :], 0.0)  # p, i, q
    total = on.sum(axis=(1, 2))
    p = int(total.argmax())
    # "by far" compares the longest wait on each rank per collective, not the sums over the
    # waiters: a receiver that ends late behind the slow link arrives last at the next
    # collective, and its n-2 other peers each wait a message's ordinary transfer time for it
    peak = on.max(axis=1).sum(axis=1)
    rest = np.delete(peak, p)
    per_seq = on[p].max(axis=0)
    lateness = float(np.median(per_seq))
    share = float(total[p] / span.sum())
    most = on.max(axis=1).argmax(axis=0) == p          # the longest wait of the seq was on p
    last_share = float(np.mean(most & (per_seq > 0)))
    if (last_share >= LAST_SHARE and lateness >= MIN_INSIDE and share >= MIN_SHARE
            and peak[p] >= DOMINANCE * (rest.max() if len(rest) else 0.0)):
        return Finding(kind=INSIDE, ranks=[ranks[p]], lateness=lateness, waited_share=share,
                       last_share=last_share, seconds=float(np.median(span)),
                       links=_links(ranks[p], ranks, on[p], extra), **window_info)
    return None


def _links(slow: int, ranks: list, blame, extra) -> list:
    """The links out of the slow rank that its peers waited on: ``blame`` (waiter x seq) is the
    wait each rank counted against it; a wait of the slow rank itself (the delivery of its own
    send) is on the link to that send's receiver (``wait_to``; -1 when not known). Those with at
    least LINK_SHARE of the rank's blame, most first: ``{"src", "dst", "lateness", "share"}``,
    lateness the median over the window of the wait on that link per collective."""
    per_dst: dict = {}
    me = ranks.index(slow)
    for i, r in enumerate(ranks):
        if i != me:
            per_dst[r] = per_dst.get(r, 0.0) + blame[i]
    if extra is not None:           # the slow rank's own waits, by the receiver of its send
        to = extra[1][me]
        for d in np.unique(to[blame[me] > 0]):
            per_dst[int(d)] = per_dst.get(int(d), 0.0) + np.where(to == d, blame[me], 0.0)
    elif blame[me].any():
        per_dst[-1] = per_dst.get(-1, 0.0) + blame[me]
    whole = sum(float(v.sum()) for v in per_dst.values()) or 1.0
    out = [{"src": slow, "dst": d, "lateness": float(np.median(v)),
            "share": float(v.sum()) / whole} for d, v in per_dst.items()]
    return sorted((x for x in out if x["share"] >= LINK_SHARE), key=lambda x: -x["share"])


class Tracker:
    """Merges the ranks' published timelines as npurun polls them, and keeps the findings.

    A communicator's first WARMUP collectives are left out: they carry the ranks' start-up
    (imports, connections, first touches of memory) that ends at different times on a loaded
    machine (a healthy train_ddp.py run on 2 cores under a load of 40 had one rank 50 ms late
    at 68 % of its first 31 collectives). A finding is told (and kept for the summary) once
    CONFIRM polls in a row found it; its episode ends after QUIET_POLLS polls without it.
    """

    def __init__(self, window: int = WINDOW, keep: int = KEEP):
        if keep < window:
            raise ValueError(f"keep={keep} must be at least window={window}")
        self.window, self.keep = window, keep
        # comm id -> {job rank: {seq: (start, end, peer, wait, wait end, send's receiver)}}
        self.history: dict = {}
        self.meta: dict = {}         # comm id -> (name, members as job ranks)
        self.active: dict = {}       # comm id -> [finding, polls without it]
        self.found: dict = {}        # (comm id, kind, ranks) -> latest finding of that episode
        self.episodes: dict = {}     # (comm id, kind, ranks) -> episodes seen

    def add(self, states: dict) -> None:
        """Take the ``timeline`` of every rank's published state (job rank -> state)."""
        for state in states.values():
            for key, t in (state.get("timeline") or {}).items():
                cid, members = int(key), t["members"]   # JSON made the comm id a string
                self.meta[cid] = (t["comm"], members)
                rank = members[t["rank"]]
                h = self.history.setdefault(cid, {}).setdefault(rank, {})
                n = len(t["seq"])
                ends = t.get("wait_end") or [None] * n    # a rank of an older npusim: none
                tos = t.get("wait_to") or [-1] * n
                for q, a, b, p, w, e, to in zip(t["seq"], t["start"], t["end"], t["wait_peer"],
                                                t["wait"], ends, tos):
                    if q > WARMUP:
                        h[q] = (a, b, members[p] if p >= 0 else -1, w, e,
                                members[to] if 0 <= to < len(members) else -1)
                if len(h) > self.keep:
                    for q in sorted(h)[:len(h) - self.keep]:
                        del h[q]

    def check(self) -> list[Finding]:
        """Run ``detect`` on every communicator; the findings that start a new episode."""
        new = []
        for cid, per_rank in self.history.items():
            name, members = self.meta[cid]
            if len(members) < 2 or any(r not in per_rank for r in members):
                continue
            tl = {}
            for r in members:
                seqs = sorted(per_rank[r])[-self.window:]
                rows = [per_rank[r][q] for q in seqs]
                tl[r] = {"seq": seqs, "start": [x[0] for x in rows], "end": [x[1] for x in rows],
                         "wait_peer": [x[2] for x in rows], "wait": [x[3] for x in rows]}
                if all(x[4] is not None for x in rows):
                    tl[r]["wait_end"] = [x[4] for x in rows]
                    tl[r]["wait_to"] = [x[5] for x in rows]
            f = detect(tl, window=self.window, comm=name, comm_id=cid)
            cur = self.active.get(cid)      # [finding, polls in a row, polls without, told]
            if f is None:
                if cur is not None:
                    cur[2] += 1
                    if cur[2] >= QUIET_POLLS or not cur[3]:
                        del self.active[cid]
                continue
            if cur is None or (cur[0].kind, cur[0].ranks) != (f.kind, f.ranks):
                cur = self.active[cid] = [f, 0, 0, False]
            cur[0], cur[2] = f, 0
            cur[1] += 1
            key = (cid, f.kind, tuple(f.ranks))
            if cur[1] >= CONFIRM and not cur[3]:
                cur[3] = True
                new.append(f)
                self.episodes[key] = self.episodes.get(key, 0) + 1
            if cur[3]:
                self.found[key] = f
        return new

    def summary(self) -> list[Finding]:
        """The latest finding of every (communicator, kind, ranks) seen during the job."""
        return list(self.found.values())
