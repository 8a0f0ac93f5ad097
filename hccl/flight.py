"""Flight recorder: the last NPUSIM_TRACE_BUFFER collective records of this process.

Every collective leaves a record when it is enqueued and updates it as it starts, waits for a
peer, completes or fails. The records feed hang reports (``dump``) and are written as JSON when
a collective fails. Updates are plain attribute writes under one lock: cheap enough to stay on.
"""
from __future__ import annotations

import collections
import itertools
import json
import operator
import os
import threading
import time

from . import config

STATES = ("enqueued", "started", "completed", "failed")
PROGRESS_BOUND = 1024       # communicators whose progress a process keeps: the most recently used


class Record:
    """One collective (or point-to-point operation) of one communicator."""

    __slots__ = ("comm", "comm_id", "rank", "seq", "op", "count", "dtype", "redop", "root", "peer", "stream",
                 "state", "t_enqueued", "t_started", "t_completed", "site", "waiting_for",
                 "waiting_since", "error", "error_type", "nbytes", "members", "wait_peer",
                 "wait_max", "wait_send", "wait_end", "wait_to")

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in _FIELDS}


_FIELDS = Record.__slots__


class Proto:
    """The fields a Call's records share (communicator, operation, stream, peer, size): made
    once per Call (``FlightRecorder.proto``) for the records of its calls that run whole at
    their issue (``FlightRecorder.done``)."""

    __slots__ = ("comm", "comm_id", "rank", "members", "op", "count", "dtype", "redop", "root",
                 "peer", "stream", "nbytes", "key")


class Done(tuple):
    """The record of a call that ran whole at its issue, in the calling thread, without waiting
    (``hccl.call.Call.begin``): enqueued, started and completed at once. It holds what differs
    from call to call, ``(proto, seq, site, t_enqueued)``, and reads the rest from its
    ``Proto``; nothing updates it (such a call never waits, fails or runs on), and it reads like
    a ``Record``. A tuple, so that making one runs no Python code (one per such call); it
    compares and hashes by identity, as a Record does."""

    __slots__ = ()
    proto = property(operator.itemgetter(0))
    seq = property(operator.itemgetter(1))
    site = property(operator.itemgetter(2))
    t_enqueued = t_started = t_completed = property(operator.itemgetter(3))
    count = property(lambda self: self[0].count)        # not tuple.count
    state = "completed"
    waiting_for = waiting_since = error = error_type = wait_peer = wait_to = None
    wait_max = wait_end = 0.0
    wait_send = False
    __eq__, __ne__, __hash__ = object.__eq__, object.__ne__, object.__hash__

    def __getattr__(self, name: str):
        return getattr(self[0], name)

    def __repr__(self):
        return f"<Done {self.op} seq {self.seq} of {self.comm}>"

    to_dict = Record.to_dict


class Member(tuple):
    """The record of a fused group's member after the first (``FlightRecorder.group``): the
    group runs as one exchange, so its members are enqueued, started, waiting, completed or
    failed together, as the first member's ``Record`` (the *head*) says. It holds what differs,
    ``(head, proto, seq, site)``, reads its call's fields (op, count, ...) from its ``Proto``
    and its state from the head; it reads like a ``Record``. A tuple, so that making one runs
    no Python code; it compares and hashes by identity, as a Record does."""

    __slots__ = ()
    head = property(operator.itemgetter(0))
    proto = property(operator.itemgetter(1))
    seq = property(operator.itemgetter(2))
    site = property(operator.itemgetter(3))
    count = property(lambda self: self[1].count)        # not tuple.count
    __eq__, __ne__, __hash__ = object.__eq__, object.__ne__, object.__hash__

    def __getattr__(self, name: str):
        if name in _SHARED:
            return getattr(self[0], name)
        return getattr(self[1], name)

    def __repr__(self):
        return f"<Member {self.op} seq {self.seq} of {self.comm}>"

    to_dict = Record.to_dict


# what a group's members share with its head: the state of the one exchange
_SHARED = frozenset(("state", "t_enqueued", "t_started", "t_completed", "waiting_for",
                     "waiting_since", "error", "error_type", "wait_peer", "wait_max",
                     "wait_send", "wait_end", "wait_to"))


class FlightRecorder:
    """A bounded ring buffer of records plus per-communicator progress counters."""

    def __init__(self, maxlen: int | None = None):
        self._lock = threading.Lock()
        self._records: collections.deque = collections.deque(
            maxlen=config.trace_buffer() if maxlen is None else maxlen)
        self._inflight: dict[int, Record] = {}
        # (comm id, rank) -> [last enqueued seq, last completed seq, comm name], least recently
        # enqueued first; at most PROGRESS_BOUND (a job that makes a communicator per step
        # would otherwise grow it, and every diagnostics snapshot with it, without bound)
        self.progress: collections.OrderedDict = collections.OrderedDict()

    @staticmethod
    def names(fp) -> tuple:
        """(op, count, dtype, redop, root) of a fingerprint as a record shows them; a caller
        that sees the same fingerprint often computes this once and passes it to ``enqueue``."""
        return (str(_name(fp.op)), fp.count, str(_name(fp.dtype)),
                str(_name(fp.redop)) if fp.redop != -1 else None,
                fp.root if fp.root != -1 else None)

    def enqueue(self, comm, seq: int, fp, *, stream: str, site: str, peer=None, nbytes=0,
                names: tuple | None = None) -> Record:
        """A new record, in state "enqueued"; ``names`` is ``names(fp)`` when already known."""
        r = Record()
        r.comm, r.comm_id, r.rank, r.seq = comm.name, comm.comm_id, comm.rank, seq
        r.members = comm.ranks          # the comm's own list: it never changes
        r.op, r.count, r.dtype, r.redop, r.root = names or self.names(fp)
        r.peer, r.stream, r.site, r.nbytes = peer, stream, site, nbytes
        self._open(r, (r,), None if peer is not None else (comm.comm_id, comm.rank), comm.name,
                   seq)
        return r

    @staticmethod
    def proto(comm, names: tuple, stream: str, peer, nbytes: int) -> Proto:
        """The fields the records of one Call share (``names``: ``names(fp)``), for ``done``."""
        p = Proto()
        p.comm, p.comm_id, p.rank, p.members = comm.name, comm.comm_id, comm.rank, comm.ranks
        p.op, p.count, p.dtype, p.redop, p.root = names
        p.peer, p.stream, p.nbytes = peer, stream, nbytes
        p.key = (comm.comm_id, comm.rank)
        return p

    def done(self, proto: Proto, seq: int, site: str) -> Done:
        """The record of a call that ran whole at its issue (``Done``): a tuple of four
        and one lock, where a Record has 27 fields and its updates take three."""
        r = Done((proto, seq, site, time.time()))
        lock = self._lock
        lock.acquire()              # not ``with``: half the cost in CPython 3.11, every call
        try:
            self._records.append(r)
            if proto.peer is None:
                progress = self.progress
                p = progress.get(proto.key)
                if p is None:
                    if len(progress) >= PROGRESS_BOUND:
                        progress.popitem(last=False)
                    p = progress[proto.key] = [seq, seq, proto.comm]
                else:
                    progress.move_to_end(proto.key)
                    p[0] = seq
                    if seq > p[1]:
                        p[1] = seq
        finally:
            lock.release()
        return r

    def add(self, comm, seq: int, names: tuple, stream: str, site: str, peer, nbytes: int,
            done: bool) -> Record | Done:
        """A new record (``names``: ``names(fp)``), enqueued, or with ``done`` that of a call
        that ran whole at its issue, in the calling thread, without waiting
        (``hccl.call.Call.begin``): enqueued, started and completed at once (``done``; a
        Call that issues many keeps its ``proto`` and calls ``done`` itself). Such a call can
        hang nowhere, so it needs no record while it runs; its communicator's progress counts
        it enqueued and completed together."""
        if done:
            return self.done(self.proto(comm, names, stream, peer, nbytes), seq, site)
        return self.enqueue(comm, seq, None, stream=stream, site=site, peer=peer, nbytes=nbytes,
                            names=names)

    def _open(self, r: Record, recs: tuple, key, name: str, last: int) -> None:
        """``r`` enqueued now, and ``recs`` (``r`` first, then the members that read their
        state from it) in flight; with ``key``, (comm id, rank), the communicator named
        ``name`` has enqueued up to ``last``."""
        r.t_enqueued = time.time()
        r.state, r.t_started, r.t_completed = "enqueued", None, None
        r.waiting_for = r.waiting_since = r.error = r.error_type = r.wait_peer = None
        r.wait_max, r.wait_send, r.wait_end, r.wait_to = 0.0, False, 0.0, None
        lock = self._lock
        lock.acquire()              # not ``with``: half the cost in CPython 3.11, every call
        try:
            self._records.extend(recs)
            inflight = self._inflight
            for m in recs:
                inflight[id(m)] = m
            if key is not None:
                progress = self.progress
                p = progress.get(key)
                if p is None:
                    if len(progress) >= PROGRESS_BOUND:
                        progress.popitem(last=False)
                    p = progress[key] = [0, 0, name]
                else:
                    progress.move_to_end(key)
                p[0] = last
        finally:
            lock.release()

    def group(self, protos: tuple, sites: tuple, seq0: int) -> tuple:
        """The records of a fused group (``hccl.algo.fusion``): member i of ``protos`` (each its
        Call's ``proto``), issued at ``sites[i]``, as ``seq0 + i``, all enqueued now, under one
        lock. The first is a
        ``Record`` that the group's exchange updates (``start``, ``waiting``, ``complete``,
        ``fail`` of it act for every member: ``complete_group``, ``fail``); the others are
        ``Member`` tuples that read their state from it."""
        p = protos[0]
        r = Record()
        r.comm, r.comm_id, r.rank, r.seq, r.members = p.comm, p.comm_id, p.rank, seq0, p.members
        r.op, r.count, r.dtype, r.redop, r.root = p.op, p.count, p.dtype, p.redop, p.root
        r.peer, r.stream, r.site, r.nbytes = None, p.stream, sites[0], p.nbytes
        recs = (r,) + tuple([Member((r, q, seq0 + i, sites[i])) for i, q in enumerate(protos)
                             if i])
        self._open(r, recs, p.key, p.comm, seq0 + len(protos) - 1)
        return recs

    def complete_group(self, recs: tuple) -> None:
        """Complete the records of a fused group (``group``) at once."""
        r = recs[0]
        now = time.time()
        if r.waiting_for is not None:
            _longest_wait(r, now)
        r.state, r.t_completed, r.waiting_for = "completed", now, None
        lock = self._lock
        lock.acquire()
        try:
            inflight = self._inflight
            for m in recs:
                inflight.pop(id(m), None)
            p = self.progress.get((r.comm_id, r.rank))
            if p is not None:
                last = recs[-1].seq
                if last > p[1]:
                    p[1] = last
        finally:
            lock.release()

    def start(self, r: Record) -> None:
        r.state, r.t_started = "started", time.time()

    def waiting(self, r: Record, peer: int, sending: bool = False) -> None:
        """``r`` waits for ``peer`` from now: for a message from it, or (``sending``) for the
        delivery of a message to it."""
        now = time.time()
        if r.waiting_for is not None:
            _longest_wait(r, now)
        r.waiting_for, r.waiting_since, r.wait_send = peer, now, sending

    def complete(self, r: Record) -> None:
        now = time.time()
        if r.waiting_for is not None:
            _longest_wait(r, now)
        r.state, r.t_completed, r.waiting_for = "completed", now, None
        with self._lock:
            self._inflight.pop(id(r), None)
            p = self.progress.get((r.comm_id, r.rank)) if r.peer is None else None
            if p is not None:           # None: evicted since its enqueue (PROGRESS_BOUND)
                p[1] = max(p[1], r.seq)

    def fail(self, r: Record, err: BaseException) -> None:
        if type(r) is Member:       # its head fails for it: it only leaves the flight
            with self._lock:
                self._inflight.pop(id(r), None)
            return
        r.state, r.t_completed = "failed", time.time()
        r.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        r.error_type = type(err).__name__
        with self._lock:
            self._inflight.pop(id(r), None)

    def last(self, comm_id: int, rank: int) -> tuple[int, int]:
        """(last enqueued seq, last completed seq) of a communicator on this rank."""
        p = self.progress.get((comm_id, rank), (0, 0))
        return p[0], p[1]

    def in_flight(self) -> list[dict]:
        """Records enqueued or started and not finished, oldest first."""
        with self._lock:
            recs = sorted(self._inflight.values(), key=lambda r: r.t_enqueued)
        return [r.to_dict() for r in recs]

    def tail(self, recent: int, failed: int) -> dict:
        """What a frequent publisher needs, converting only those records (the ring holds up to
        NPUSIM_TRACE_BUFFER; a full ``dump`` of 2000 costs tens of ms): ``recent``, the last
        ``recent`` records; ``failed``, the last ``failed`` failed ones still in the ring (both
        oldest first); ``in_flight`` and ``progress`` as ``dump`` gives them."""
        with self._lock:
            records = self._records
            last = [r.to_dict() for r in itertools.islice(
                reversed(records), recent)][::-1] if recent > 0 else []
            bad = []
            if failed > 0:
                for r in reversed(records):
                    if r.state == "failed":
                        bad.append(r.to_dict())
                        if len(bad) == failed:
                            break
            progress = self._progress_list()
        return {"recent": last, "failed": bad[::-1], "in_flight": self.in_flight(),
                "progress": progress}

    def timeline(self, last: int) -> dict:
        """The arrival and finish times of this rank's last ``last`` completed collectives, per
        communicator, as plain numbers for npurun's fail-slow detector (``launcher.failslow``):
        ``{comm_id: {"comm", "rank", "members", "seq", "start", "end", "wait_peer",
        "wait", "wait_end", "wait_to"}}``, one list entry per collective, oldest first.
        ``wait_peer`` / ``wait`` / ``wait_end`` are the comm rank whose transfers this rank waited
        for longest inside that collective (-1: none; its own rank: the delivery of its own send,
        to ``wait_to``, else -1), for how long, and when that wait ended. A few hundred numbers:
        cheap enough to publish every interval."""
        out: dict = {}
        with self._lock:
            recent = list(itertools.islice(reversed(self._records), last))
        for r in reversed(recent):
            if r.state != "completed" or r.peer is not None or r.t_started is None:
                continue
            t = out.get(r.comm_id)
            if t is None:
                t = out[r.comm_id] = {"comm": r.comm, "rank": r.rank, "members": list(r.members),
                                      "seq": [], "start": [], "end": [], "wait_peer": [],
                                      "wait": [], "wait_end": [], "wait_to": []}
            t["seq"].append(r.seq)
            t["start"].append(round(r.t_started, 6))
            t["end"].append(round(r.t_completed, 6))
            t["wait_peer"].append(-1 if r.wait_peer is None else r.wait_peer)
            t["wait"].append(round(r.wait_max, 6))
            t["wait_end"].append(round(r.wait_end, 6))
            t["wait_to"].append(-1 if r.wait_to is None else r.wait_to)
        return out

    def _progress_list(self) -> list[dict]:
        return [{"comm": v[2], "comm_id": c, "rank": rk, "last_enqueued": v[0],
                 "last_completed": v[1]} for (c, rk), v in self.progress.items()]

    def dump(self) -> dict:
        """Everything as JSON-able data: records (oldest first), in-flight ones, progress."""
        with self._lock:
            records = [r.to_dict() for r in self._records]
            progress = self._progress_list()
        return {"pid": os.getpid(), "rank": config.rank_text(), "time": time.time(),
                "records": records, "in_flight": self.in_flight(), "progress": progress}

    def dump_to(self, path: str) -> str:
        """Write ``dump()`` as JSON to ``path`` (atomically); returns the path."""
        os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.dump(), f, indent=1, default=str)
        os.replace(tmp, path)
        return path


def _longest_wait(r: Record, now: float) -> None:
    """Close the wait for ``r.waiting_for`` (it lasted until ``now``): the longest one of the
    collective is kept, naming the rank whose transfers held this one: the peer for a message
    from it, this rank itself for the delivery of its own send (its link is the slow one)."""
    waited = now - r.waiting_since
    if waited > r.wait_max:
        r.wait_max, r.wait_peer = waited, r.rank if r.wait_send else r.waiting_for
        r.wait_end, r.wait_to = now, r.waiting_for if r.wait_send else None


def _name(v):
    return getattr(v, "name", v)


recorder = FlightRecorder()
