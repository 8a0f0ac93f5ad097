"""One collective call as an object: validated once, bound once, issued and run many times.

Design note (gloo's algorithm objects). A ``Call`` is made from a call's arguments once
``hccl.collectives`` has checked them: communicator, collective, buffers, count, data type,
reduce op, root, peer and stream. Its constructor does everything that depends only on those:
the plan (``hccl.algo.plan``: the schedule and fingerprints), the host views of the buffers, the
scratch the schedule needs, the peers' pairs, bound together into an ``executor.Program``, the
wire fingerprint and the allocation marks of the buffers. ``issue`` does what each call does by
nature (the sequence number, the flight record, the stream's task) and ``run``, the task,
executes the program; a failure becomes the user's error there, once (``executor.failure``,
with this Call as its context). On an idle stream ``begin`` runs the program at the call first
(``runtime.Stream.enqueue_begun``, which keeps the stream's order): a small call as far as its
messages come within ``INLINE_SPIN`` (usually all of it: then no task runs and the stream's
worker is not woken), a larger one its leading sends; the task goes on from where it stopped.

Who keeps a Call:
- the communicator, for eager calls (``Calls``, keyed by the arguments as passed, each scalar
  with its type: ``16.0`` equals ``16`` but is not a count; a DevicePtr by value, any other
  buffer by identity through a weak reference that never keeps it alive; and the stream). A
  repeat is taken for the remembered Call only while the communicator and the stream are alive
  and every buffer is the very object checked and still lies in the same live allocation
  (``runtime.memory.same_allocations``: a free, a new allocation at the same address or a device
  reset changes it); otherwise every check runs again and the error is the same as before.
  At most ``BOUND`` Calls per communicator (emptied when full);
- a task graph, for each captured collective (its deferred task issues the same Call at every
  replay; ``hccl.algo.fusion`` fuses adjacent small AllReduces into one exchange).

A Call bound before its peers' pairs were made (``executor.Program.provisional``: a stand-in
pair prepares nothing) binds again after its first run, to what the real pairs prepare.

A task looks once more when it runs (a buffer may be freed after the call): if an allocation
changed, it rebuilds the views through ``runtime.host_view``, which raises the use-after-free
error. A Call runs one issue at a time (its stream orders them), so its scratch is its own.
"""
from __future__ import annotations

import functools
import time

import runtime
from runtime import graph, profiler, sanitizer
from runtime.memory import allocation_marks, same_allocations

from hccl import diag
from hccl.algo import executor, fusion, plan
from hccl.flight import Member, recorder
from hccl.transport.base import norm_fp
from hccl.types import OpType

BOUND = 64          # Calls a communicator keeps (a step issues a handful; emptied when full)
# An eager call on an idle stream runs in the calling thread while its messages come at once
# (``Call.begin``): each hand-off to the stream's worker (its wake-up, then the synchronize's
# wait for it) costs several microseconds of futex and GIL hand-off, more than the whole 1 KiB
# exchange. The caller looks for a message at most INLINE_SPIN after the call began (spinning,
# yielding the core, never sleeping: ``shm.Channel.watch``), then hands the rest to the worker,
# so a call never holds its caller longer than that (a peer that waits for something this rank
# does after the call is never deadlocked), or than a send's wait for a slot of a full ring
# (``transport.local.ROOM_WAIT``, 1 ms). 50 us covers the usual skew between two ranks'
# calls of a loop of small collectives here (measured: benchmarks.percall), and is short
# beside the 200 us a waiting worker spins (hccl.transport.process.SPIN_US).
INLINE_SPIN = 50e-6
# Only calls whose buffers are this small run inline: a larger one stays asynchronous (its
# reductions and copies would hold the caller), beginning with its leading sends only. The
# size up to which a copy keeps the GIL (executor.GIL_COPY_BYTES): a step of tens of us.
INLINE_BYTES = executor.GIL_COPY_BYTES
_perf = time.perf_counter
P2P_BIT = 1 << 62   # a point-to-point operation's comm id: its own sequence numbers
_time = time.time

API_NAMES = {OpType.ALLREDUCE: "AllReduce", OpType.ALLGATHER: "AllGather",
             OpType.REDUCE_SCATTER: "ReduceScatter", OpType.BROADCAST: "Broadcast",
             OpType.REDUCE: "Reduce", OpType.ALLTOALL: "AlltoAll", OpType.SEND: "Send",
             OpType.RECV: "Recv", OpType.BARRIER: "Barrier"}


class Call(executor.Context):
    """One validated collective call (see the module note). ``bufs``: ``{"send": ..., "recv":
    ...}`` as checked (None where a rank has no such buffer); ``knobs``: (algorithm, slice
    bytes, solo bytes) for ``plan.collective``. Raises what the plan and
    ``runtime.host_view`` raise."""

    __slots__ = ("comm", "op", "stream", "plan", "cid", "fp", "wire_fp", "count", "dtype",
                 "redop", "root", "peer", "inplace", "knobs", "name", "names", "marks",
                 "program", "timeout_by_comm", "rec", "proto", "on_wait", "nbytes", "inline", "begins",
                 "__weakref__")

    def __init__(self, comm, op: OpType, bufs: dict, count: int, dtype, redop, root, peer,
                 stream, knobs: tuple, inplace: bool):
        self.comm, self.op, self.stream, self.knobs = comm, op, stream, knobs
        self.count, self.dtype, self.redop, self.root, self.peer = count, dtype, redop, root, peer
        self.inplace, self.nbytes = inplace, count * dtype.itemsize
        self.plan = pl = plan.collective(op, comm.rank, comm.size, count, dtype, redop, root,
                                         peer, inplace, *knobs)
        self.fp, self.wire_fp = pl.fp, norm_fp(pl.fp)
        self.inline = max(pl.nbytes.values(), default=0) <= INLINE_BYTES
        self.cid = comm.comm_id | P2P_BIT if op in (OpType.SEND, OpType.RECV) else comm.comm_id
        self.name = f"Hccl{API_NAMES[op]}"
        self.names = tuple(k for k, b in bufs.items() if b is not None)
        objs = [bufs[k] for k in self.names]
        self.marks = allocation_marks(objs)         # and the buffers, weakly
        self.timeout_by_comm = False
        self.rec = self.proto = None        # proto: its records' shared fields, at first need
        self.on_wait = self._waiting
        self.program = self._bind(objs)
        # whether an idle stream's issue begins at the call: a small call runs there as far as
        # it goes (``begin``); a larger one posts its leading sends, if it has any
        self.begins = self.inline or self.program.lead > 0

    def _bind(self, objs) -> executor.Program:
        """The program on the buffers ``objs`` (in ``names`` order) as they are now."""
        nbytes, t = self.plan.nbytes, self.comm.world.transport
        views = {k: runtime.host_view(b, nbytes[k], name=k) for k, b in zip(self.names, objs)
                 if not (self.inplace and k == "recv")}
        if self.inplace:
            views["recv"] = views["send"]
        steps = self.plan.steps
        return executor.bind(steps, executor.prepare_buffers(steps, views), self.redop,
                             self.dtype, [t.pair(w) for w in self.comm.ranks],
                             (self.cid, self.wire_fp))

    # -- per call --------------------------------------------------------------------------
    def issue(self, objs: tuple, site: str) -> None:
        """Enqueue one run of the call on its stream (``objs``: its buffers, ``names`` order,
        kept alive by the task)."""
        s = self.stream
        if sanitizer.on:        # before the seq is taken: a race leaves no trace
            nbytes = self.plan.nbytes
            runtime.declare_access(s, self.name, site=site, reads=[
                (b, nbytes[k]) for k, b in zip(self.names, objs) if k == "send"], writes=[
                (b, nbytes[k]) for k, b in zip(self.names, objs) if k == "recv"])
        meta = None
        if profiler.on:             # the trace's arguments of the task: only when recorded
            meta = {"comm": self.comm.name, "count": self.count, "dtype": self.dtype.name,
                    "bytes": self.nbytes}
            if self.peer is not None:
                meta["peer"] = self.peer
        if s.capture is None and not graph.active:      # eager, no capture anywhere: the task
            if self.begins and meta is None and not sanitizer.on and s.enqueue_begun(
                    self.begin, self.name, "collective", None, site, (objs, site)) is not None:
                return                  # an idle stream: begun (or done) in this thread
            s.enqueue(self.make(objs, site, meta), self.name, "collective", meta, site)    # now
            return
        fuse = None
        if s.capture is not None and self.op == OpType.ALLREDUCE:
            fuse = fusion.fusable(self, objs, site)
        s.enqueue_deferred(functools.partial(self.make, objs, site, meta), name=self.name,
                           category="collective", meta=meta, site=site, fuse=fuse)

    def make(self, objs: tuple, site: str, meta=None):
        """The task of one issue: now when eager, at each replay of a task graph."""
        seq, rec = self._take(site)
        if meta is not None:
            meta["seq"] = seq
        return functools.partial(self.run, seq, rec, objs)

    def begin(self, objs: tuple, site: str):
        """An eager issue on an idle stream, run in the calling thread as far as it goes
        without waiting (``Stream.enqueue_begun`` calls this holding the stream's execution
        lock): a call of at most ``INLINE_BYTES`` runs its steps while each message is there or
        arrives within ``INLINE_SPIN`` of the call (``executor.Program.begin``), a larger one
        posts the sends before its first receive. Returns None when the whole call ran here
        (it is complete: no task, the stream's worker is never woken), else the task that goes
        on from where it stopped; a failure is raised by that task, as when the task meets it
        (the stream's sticky error, with the same fields)."""
        comm, seq = self.comm, self._next_seq()
        timeout = comm.exec_timeout
        if timeout is None:
            timeout = comm._env_timeout
            if timeout is None:
                timeout = comm.timeout()[0]
        try:
            ahead = self.program.begin(self.cid, seq, self.wire_fp, timeout, self.on_wait,
                                       _perf() + INLINE_SPIN if self.inline else None)
        except executor.StepFailed as f:
            ahead = f
        if ahead is None:           # ran whole, here: nothing of it can hang, one record
            if self.program.provisional:    # its first run made the pairs: bind to them
                self.program = self._bind(objs)
            proto = self.proto
            if proto is None:
                proto = self.proto = recorder.proto(comm, self.plan.names, self.stream.name,
                                                    self.peer, self.nbytes)
            self.rec = recorder.done(proto, seq, site)
            return None
        # goes on in a task (or failed): the record a hang report finds, started now
        rec = self._record(seq, site)
        rec.state, rec.t_started = "started", rec.t_enqueued
        self.rec = rec
        return functools.partial(self.run, seq, rec, objs, ahead)

    def _take(self, site: str) -> tuple:
        """The next sequence number of this call and its flight record."""
        seq = self._next_seq()
        return seq, self._record(seq, site)

    def _next_seq(self) -> int:
        comm, peer = self.comm, self.peer
        if peer is not None:
            key = ("send" if self.op == OpType.SEND else "recv", peer)
            with comm._lock:
                seq = comm._p2p.get(key, 0) + 1
                comm._p2p[key] = seq
        else:                               # comm.take_seqs(1), inline: every eager call
            lock = comm._lock
            lock.acquire()                  # not ``with``: half the cost in CPython 3.11
            try:
                comm._seq = seq = comm._seq + 1
            finally:
                lock.release()
        return seq

    def _record(self, seq: int, site: str):
        return recorder.enqueue(self.comm, seq, self.plan.rec_fp, stream=self.stream.name,
                                site=site, peer=self.peer, nbytes=self.nbytes,
                                names=self.plan.names)

    def run(self, seq: int, rec, objs: tuple, ahead=None) -> None:
        """Execute the call as ``seq`` (the task): the user's error on failure. ``ahead``:
        what ``begin`` did (where the program goes on, or the failure it met), None if nothing
        began."""
        if not same_allocations(self.marks, objs):
            self.program = self._bind(objs)         # raises the use-after-free error
            self.marks = allocation_marks(objs)
        if ahead is None:
            rec.state, rec.t_started = "started", _time()   # recorder.start(rec), inline
        self.rec = rec
        comm = self.comm
        timeout = comm.exec_timeout
        by_comm = timeout is not None
        if not by_comm:
            timeout = comm._env_timeout     # comm.timeout(), without its call once read
            if timeout is None:
                timeout = comm.timeout()[0]
        try:
            if ahead is None:
                self.program.run(self.cid, seq, self.wire_fp, timeout, self.on_wait)
            elif type(ahead) is executor.StepFailed:
                raise ahead
            else:
                self.program.run(self.cid, seq, self.wire_fp, timeout, self.on_wait, *ahead)
        except executor.StepFailed as f:
            self.timeout_by_comm = by_comm
            raise self.failed(f, seq, timeout, (rec,)) from f.error
        if self.program.provisional:        # its first run made the pairs: bind to them
            self.program = self._bind(objs)
        recorder.complete(rec)

    def _waiting(self, peer: int, sending: bool) -> None:
        recorder.waiting(self.rec, peer, sending)

    def failed(self, f: executor.StepFailed, seq: int, timeout, recs: tuple, fp=None):
        """The user's error for the failure ``f`` of this call's exchange as ``seq``, recorded
        on the flight records ``recs``; a fused group (``hccl.algo.fusion``) passes its own records
        and fingerprint ``fp``."""
        for rec in recs:
            recorder.fail(rec, f.error)
        err = executor.failure(f, self.comm.ranks, seq, fp or self.fp, timeout, None, self)
        for rec in recs:
            if type(rec) is Member:     # a fused group's member: its head holds the error
                continue
            rec.error = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            # a peer's failure reaching this rank: the verdict looks past it for the cause
            rec.error_type = "RemoteRankError" if getattr(err, "abort", None) else \
                type(err).__name__
        diag.flush()
        return err

    def holds(self, objs: tuple) -> bool:
        """Whether ``objs`` are the very buffers this Call was made for, in the same live
        allocations."""
        return same_allocations(self.marks, objs)


class Calls:
    """A communicator's Calls by key (see the module note); at most ``BOUND``."""

    __slots__ = ("_d",)

    def __init__(self):
        self._d: dict = {}

    def __len__(self) -> int:
        return len(self._d)

    def put(self, key, call: Call) -> None:
        d = self._d
        if len(d) >= BOUND:
            d.clear()
        try:
            d[key] = call
        except TypeError:       # an unhashable argument: the call is checked every time
            pass

    def clear(self) -> None:
        self._d.clear()

    def find(self, key, objs: tuple):
        """The Call remembered under ``key`` if it still holds for ``objs``, else None."""
        try:
            call = self._d.get(key)
        except TypeError:       # an unhashable argument: the checks say what is wrong with it
            return None
        if call is None:
            return None
        return call if same_allocations(call.marks, objs) else None
