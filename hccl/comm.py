"""Communicators: ranks of a world, per-communicator sequence numbers, collectives as stream tasks.

Design note. A *world* is one transport connecting the processes (or, in tests, threads) of a
job. Every communicator of that world shares its transport and tags its messages with its own
64-bit ``comm_id``, so concurrent communicators never cross. A collective takes the next ``seq``
of its communicator when it is *called* (host order, as HCCL requires every rank to call the same
collectives in the same order), validates every argument, builds its schedule (pure data) and
enqueues one task on the caller's stream; the task runs the schedule through the executor.
Point-to-point operations count their own per-peer sequence on a separate id, so they are never
taken for a mismatch with a collective.

When a collective fails on one rank (timeout, mismatch), that rank aborts the communicator: every
peer waiting in it fails at once with RemoteRankError naming the rank (or, for a mismatch, with
the same CollectiveMismatchError) instead of waiting for its own timeout. An aborted
communicator stays aborted: create a new one.
"""
from __future__ import annotations

import functools
import hashlib
import os
import threading

import numpy as np

import runtime
from runtime.callsite import add_internal, callsite
from runtime import profiler
from runtime.log import setup as setup_log
from runtime.context import resolve_stream
from runtime.errors import NpuError, describe

from . import abortrec, calls, collectives, config, diag, executor, fusion, plan
from .errors import (CollectiveMismatchError, HcclError, HcclTimeoutError, InvalidArgumentError,
                     RemoteRankError)
from .failure import Failure
from .flight import recorder
from .transport.base import Aborted, PeerTimeout
from .types import DataType, OpType, ReduceOp, Result, describe_call

log = setup_log("hccl")
# collective failures surface from stream synchronize with their own type (and as TaskError)
HcclError.npusim_surface = True
add_internal(os.path.dirname(os.path.abspath(__file__)))
_P2P_BIT = 1 << 62


def comm_id_of(text: str) -> int:
    """A 62-bit communicator id from a unique string."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") & (_P2P_BIT - 1)


class World:
    """One transport and what keeps it alive (store client, hosted store server)."""

    def __init__(self, transport, *, uid: str, store=None, server=None):
        self.transport, self.uid, self.store, self.server = transport, uid, store, server
        self.rank, self.size = transport.rank, transport.size
        self.comms = 0
        self.comm_ids: set[int] = set()        # every comm id in use (dead-peer abort)
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            self.comms -= 1
            if self.comms > 0:
                return
        for obj in (self.transport, self.store, self.server):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # closing must never raise
                    log.debug("close failed", exc_info=True)


class Comm:
    """A communicator: ``rank`` and ``size`` within it, a name, and its collectives.

    Create one with ``comm_init_root_info``, ``init_comm`` or ``create_sub_comm``.
    """

    def __init__(self, world: World, ranks: list[int], comm_id: int, name: str):
        self.world = world
        self.ranks = list(ranks)            # comm rank -> world rank
        self.rank = self.ranks.index(world.rank)
        self.size = len(self.ranks)
        self.comm_id = comm_id
        self.name = name
        self.exec_timeout: float | None = None
        self._knobs: tuple | None = None        # (algorithm, slice bytes): _read_knobs
        self._env_timeout: float | None = None  # HCCL_EXEC_TIMEOUT, read at the first use
        self._seq = 0
        self._p2p: dict[tuple[str, int], int] = {}
        self._subs: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._destroyed = False
        self._calls = calls.Memo()          # the validated calls an eager call may repeat
        with world._lock:
            world.comms += 1
            world.comm_ids.update((comm_id, comm_id | _P2P_BIT))

    # ------------------------------------------------------------------ lifecycle
    def __repr__(self):
        return f"<hccl.Comm {self.name} rank {self.rank}/{self.size}{' destroyed' if self._destroyed else ''}>"

    def set_exec_timeout(self, seconds: float) -> None:
        """Override HCCL_EXEC_TIMEOUT for this communicator (the longest wait for a peer)."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
            raise InvalidArgumentError(f"set_exec_timeout(seconds={seconds!r}): must be a positive number")
        self.exec_timeout = float(seconds)

    def _timeout(self) -> tuple[float, bool]:
        """The longest wait for a peer, and whether ``set_exec_timeout`` set it (every call asks;
        the text naming the source is built by ``_failure`` only)."""
        if self.exec_timeout is not None:
            return self.exec_timeout, True
        if self._env_timeout is None:
            self._env_timeout = config.exec_timeout()
        return self._env_timeout, False

    def destroy(self) -> None:
        """Release the communicator (HcclCommDestroy); later calls on it raise E_PARA."""
        if self._destroyed:
            return
        self._destroyed = True
        self._calls.clear()
        try:
            self.world.transport.forget(self.comm_id)
            self.world.transport.forget(self.comm_id | _P2P_BIT)
        except Exception:
            pass
        with self.world._lock:
            self.world.comm_ids.difference_update((self.comm_id, self.comm_id | _P2P_BIT))
        self.world.release()

    def _check_alive(self, what: str) -> None:
        if self._destroyed:
            raise InvalidArgumentError(f"{what}: communicator {self.name} was destroyed; create a new one",
                                       Result.E_PARA)

    def create_sub_comm(self, rank_ids) -> "Comm":
        """A communicator of the ranks ``rank_ids`` of this one (HCCL's habit: called by each of
        them, in the same order on every member; non-members do not call it). The caller's rank
        in the new comm is its index in ``rank_ids``. See ``new_group`` for torch's habit."""
        ids = self._sub_ids(rank_ids, "create_sub_comm")
        if self.rank not in ids:
            raise InvalidArgumentError(
                f"create_sub_comm(rank_ids={ids}): rank {self.rank} is not a member; only members "
                "call it (or let every rank call comm.new_group(ranks), which returns None on "
                "non-members, as torch's new_group does)")
        return self._sub(ids)

    def new_group(self, ranks) -> "Comm | None":
        """torch's habit: EVERY rank of this communicator calls it, in the same order; members
        get the communicator of ``ranks`` (ordered by rank, as torch orders a group), the other
        ranks get None. Ranks in the new comm are local: its ``rank`` is the index there."""
        ids = sorted(self._sub_ids(ranks, "new_group"))
        return self._sub(ids) if self.rank in ids else None

    def _sub_ids(self, rank_ids, api: str) -> list[int]:
        """``rank_ids`` checked: ints, in range, no duplicates, not empty."""
        self._check_alive(api)
        if isinstance(rank_ids, (str, bytes)) or not hasattr(rank_ids, "__iter__"):
            raise InvalidArgumentError(f"{api}(rank_ids={rank_ids!r}): expected a list of ints")
        rank_ids = list(rank_ids)
        bad = [r for r in rank_ids if isinstance(r, bool) or not isinstance(r, (int, np.integer))]
        if bad:
            # int() would silently turn 1.5 into 1 and True into 1: a different communicator
            raise InvalidArgumentError(f"{api}(rank_ids={rank_ids!r}): {bad[0]!r} is not an int rank")
        ids = [int(r) for r in rank_ids]
        if not ids:
            raise InvalidArgumentError(f"{api}(rank_ids=[]): a communicator needs at least one rank")
        dup = sorted({r for r in ids if ids.count(r) > 1})
        if dup:
            raise InvalidArgumentError(f"{api}(rank_ids={ids}): rank(s) {dup} listed more than once")
        out = [r for r in ids if not 0 <= r < self.size]
        if out:
            raise InvalidArgumentError(
                f"{api}(rank_ids={ids}): rank(s) {out} out of range for a communicator of "
                f"{self.size} ranks (valid: 0..{self.size - 1})")
        return ids

    def _sub(self, ids: list[int]) -> "Comm":
        key = tuple(ids)
        with self._lock:
            n = self._subs.get(key, 0)
            self._subs[key] = n + 1
        cid = comm_id_of(f"{self.comm_id}/sub/{key}/{n}")
        return Comm(self.world, [self.ranks[r] for r in ids], cid,
                    f"{self.name}.sub{list(ids)}" + (f"#{n}" if n else ""))

    def wait_any_sender(self, timeout: float | None = None) -> int:
        """The rank whose next point-to-point message to this rank arrived first (receive from
        any source: then ``recv`` from it). Waits up to ``timeout`` s (default: the exec
        timeout); raises ``HcclTimeoutError`` when nothing came, ``RemoteRankError`` if the
        communicator was aborted."""
        self._check_alive("wait_any_sender")
        with self._lock:
            want = {self.ranks[p]: self._p2p.get(("recv", p), 0) + 1
                    for p in range(self.size) if p != self.rank}
        if not want:
            raise InvalidArgumentError(f"wait_any_sender: communicator {self.name} has no other rank")
        timeout = self._timeout()[0] if timeout is None else timeout
        try:
            peer = self.world.transport.first_arrived(self.comm_id | _P2P_BIT, want, timeout)
        except PeerTimeout as e:
            raise HcclTimeoutError(f"[rank {self.rank}] recv from any source on {self.name}: "
                                   f"nothing arrived within {timeout:g} s", peer=-1, seq=0,
                                   waited=e.waited, timeout=timeout, rank=self.rank) from None
        except Aborted as e:
            raise RemoteRankError(f"[rank {self.rank}] recv from any source on {self.name}: the "
                                  f"communicator was aborted: {e}", world_peer=e.peer,
                                  reason=str(e), seq=0) from None
        return self.ranks.index(peer)

    # ------------------------------------------------------------------ the core
    def _describe(self, op, seq, fp) -> str:
        return describe_call(op, fp.count, fp.dtype, fp.redop, fp.root, comm=self.name, seq=seq)

    def _failure(self, e: HcclError, op, seq, fp, timeout, by_comm, cid) -> HcclError:
        """The error a user sees, with the op, the comm and the seq; aborts the comm for the peers."""
        call = self._describe(op, seq, fp)
        last_enq, last_done = recorder.last(self.comm_id, self.rank)
        transport = self.world.transport
        if isinstance(e, HcclTimeoutError):
            source = (f"comm.set_exec_timeout({timeout:g})" if by_comm else
                      f"HCCL_EXEC_TIMEOUT={timeout:g}")
            msg = (f"[rank {self.rank}] {call} timed out after {timeout:.1f} s "
                   f"(the timeout set by {source}); "
                   f"last enqueued seq {last_enq}, last completed seq {last_done}\n  {e}")
            err = HcclTimeoutError(msg, peer=e.peer, world_peer=getattr(e, "world_peer", None), seq=seq,
                                   waited=e.waited, timeout=timeout, rank=self.rank,
                                   step=getattr(e, "step", None))
            transport.abort(cid, abortrec.record(
                Failure.TIMEOUT, self.world.rank, f"rank {self.rank} timed out in {call} waiting for "
                f"rank {e.peer}", waited_for=e.peer))
            return err
        if isinstance(e, CollectiveMismatchError):
            msg = f"[rank {self.rank}] {call}: collective mismatch: {e}"
            err = CollectiveMismatchError(msg, seq=seq, ranks=e.ranks, calls=[str(c) for c in e.calls])
            transport.abort(cid, abortrec.record(Failure.MISMATCH, self.world.rank, str(e)))
            return err
        if isinstance(e, RemoteRankError):
            ab = getattr(e, "abort", None) or abortrec.read(getattr(e, "reason", ""), e.rank)
            text = ab["text"]
            if ab["kind"] == Failure.DEAD:     # seen by a rank's transport, or by the launcher
                stopping = "" if "seen_by" in ab else "; the job is being stopped"
                err = RemoteRankError(f"[rank {self.rank}] {call} failed: {text}{stopping}",
                                      rank=ab["rank"], reason=text, seq=seq)
            elif ab["kind"] in (Failure.DEADLOCK, Failure.STOPPED, Failure.ERROR):  # text: the cause
                err = RemoteRankError(f"[rank {self.rank}] {call} failed: {text}", rank=ab["rank"],
                                      reason=text, seq=seq)
            elif ab["kind"] == Failure.MISMATCH:
                err = CollectiveMismatchError(
                    f"[rank {self.rank}] {call}: collective mismatch reported by rank {e.rank}: "
                    f"{text}", seq=seq, ranks=[e.rank], calls=[])
            elif ab["kind"] in (Failure.TIMEOUT, Failure.FAILED):   # the text names who waited for whom
                waiting = getattr(e, "waiting_for", None)
                chain = (f"; rank {self.rank} was itself waiting for rank {waiting}"
                         if ab["kind"] == Failure.TIMEOUT and waiting is not None else "")
                err = RemoteRankError(f"[rank {self.rank}] {call} aborted: {text}{chain}",
                                      rank=e.rank, reason=text, seq=seq)
            else:
                err = RemoteRankError(f"[rank {self.rank}] {call} failed: rank {e.rank} failed or "
                                      f"aborted the communicator: {text}", rank=e.rank, reason=text,
                                      seq=seq)
            err.abort = ab                  # the typed record, for the launcher's error file
            return err
        msg = f"[rank {self.rank}] {call} failed: {e}"
        err = type(e).__new__(type(e))
        Exception.__init__(err, msg)
        err.__dict__.update(e.__dict__)
        transport.abort(cid, abortrec.record(Failure.FAILED, self.world.rank,
                                             f"rank {self.rank} failed in {call}: "
                                             f"{str(e).splitlines()[0]}"))
        return err

    # ------------------------------------------------------------------ methods with inferred count/dtype
    def all_reduce(self, send, recv=None, op=ReduceOp.SUM, stream=None):
        recv = send if recv is None else recv
        collectives.all_reduce(send, recv, _size(send, "send"), _arr_dtype(send), op, self, stream, site=callsite(2))
        return recv

    def all_gather(self, send, recv, stream=None):
        collectives.all_gather(send, recv, _size(send, "send"), _arr_dtype(send), self, stream, site=callsite(2))
        return recv

    def reduce_scatter(self, send, recv, op=ReduceOp.SUM, stream=None):
        collectives.reduce_scatter(send, recv, _size(recv, "recv"), _arr_dtype(recv), op, self, stream, site=callsite(2))
        return recv

    def broadcast(self, buf, root=0, stream=None):
        collectives.broadcast(buf, _size(buf, "buf"), _arr_dtype(buf), root, self, stream, site=callsite(2))
        return buf

    def reduce(self, send, recv=None, op=ReduceOp.SUM, root=0, stream=None):
        collectives.reduce(send, recv, _size(send, "send"), _arr_dtype(send), op, root, self, stream, site=callsite(2))
        return recv

    def all_to_all(self, send, recv, stream=None):
        n = _size(send, "send")
        if n % self.size:
            raise InvalidArgumentError(f"all_to_all: send has {n} elements, not a multiple of the "
                                       f"communicator size {self.size}")
        c = n // self.size
        collectives.all_to_all(send, c, recv, c, _arr_dtype(send), self, stream, site=callsite(2))
        return recv

    def send(self, buf, dest, stream=None):
        collectives.send(buf, _size(buf, "buf"), _arr_dtype(buf), dest, self, stream, site=callsite(2))

    def recv(self, buf, src, stream=None):
        collectives.recv(buf, _size(buf, "buf"), _arr_dtype(buf), src, self, stream, site=callsite(2))
        return buf

    def barrier(self, stream=None):
        collectives.barrier(self, stream, site=callsite(2))


# ------------------------------------------------------------------ the core
def live(comm, api: str) -> Comm:
    """``comm`` if it is an ``hccl.Comm`` not yet destroyed; else InvalidArgumentError naming
    ``api`` (for ``hccl.collectives``)."""
    if not isinstance(comm, Comm):
        raise InvalidArgumentError(f"{api}: comm={comm!r} is not an hccl.Comm")
    comm._check_alive(api)
    return comm


def take_seqs(comm: Comm, n: int = 1) -> int:
    """Take ``comm``'s next ``n`` collective sequence numbers; returns the first (an issue of a
    collective takes one, a fused group of a task graph one per call: hccl.fusion)."""
    with comm._lock:
        first = comm._seq + 1
        comm._seq += n
    return first


def collective(op: OpType, check, comm, bufs: dict, count, dtype, redop, root, stream,
               site) -> None:
    """Enqueue collective ``op`` (``hccl.collectives``' front): at once when the call repeats
    one validated before with the very same arguments (``hccl.calls``), else once
    ``check(comm, bufs, count, dtype, redop, root)`` passed. A check raises InvalidArgumentError
    for a bad argument, else returns (the live comm, the API's name, ``enqueue``'s keyword
    arguments); ``enqueue`` then remembers the call. Checks are module-level functions, not
    closures: a closure would cost every call its cells, hit or miss."""
    key = None
    if type(comm) is Comm and not comm._destroyed:
        try:
            s = resolve_stream(stream)
        except NpuError:        # the check says what is wrong with it
            s = None
        if s is not None:
            key = calls.key(op, bufs, count, dtype, redop, root, s)
            call = comm._calls.find(key, bufs, s)
            if call is not None:
                issue(call, bufs, site or callsite(2))
                return
    comm, api, args = check(comm, bufs, count, dtype, redop, root)
    enqueue(comm, op, api, bufs=bufs, stream=stream, site=site or callsite(2), key=key, **args)


def enqueue(comm: Comm, op: OpType, api: str, *, bufs: dict, count: int, dtype: DataType,
            redop=None, root=None, peer=None, stream=None, site=None, key=None) -> None:
    """Plan the validated call and issue it; remember it under ``key`` (``collective``'s) if given."""
    s = _resolve_stream(api, stream)
    for name, b in bufs.items():
        if b is not None and _device_of(b) not in (s.device_id, -1):
            raise InvalidArgumentError(
                f"{api}: {name} is on device {_device_of(b)} but the stream is on device {s.device_id}")
    inplace = bufs.get("send") is not None and _same(bufs.get("send"), bufs.get("recv"))
    knobs = comm._knobs or _read_knobs()
    pl = plan.collective(op, comm.rank, comm.size, count, dtype, redop, root, peer, inplace,
                         *knobs)
    comm._knobs = knobs     # kept once a call was planned with them (a bad one is not kept)
    cid = comm.comm_id | _P2P_BIT if op in (OpType.SEND, OpType.RECV) else comm.comm_id
    call = calls.Call(comm, op, s, pl, bufs, inplace, cid, count, dtype, redop, root, peer, knobs,
                      f"Hccl{_API_NAMES[op]}")
    if key is not None:
        comm._calls.put(key, call)
    issue(call, bufs, site or callsite(2))


def issue(call: calls.Call, bufs: dict, site: str) -> None:
    """Enqueue one issue of a validated call (``bufs``: the buffers it was validated with)."""
    comm, op, s, pl = call.comm, call.op, call.stream, call.plan
    if runtime.stream_check_enabled():     # before the seq is taken: a race leaves no trace
        nbytes = pl.nbytes
        runtime.declare_access(s, call.name, site=site, reads=[
            (b, nbytes[k]) for k, b in bufs.items() if k == "send" and b is not None], writes=[
            (b, nbytes[k]) for k, b in bufs.items() if k == "recv" and b is not None])
    timeout, by_comm = comm._timeout()
    peer, count, dtype = call.peer, call.count, call.dtype

    def make():
        """The task of one issue of the call: now when eager, at each replay of a task graph
        (the checks and the plan are done once, at the call or the capture)."""
        if op == OpType.SEND or op == OpType.RECV:
            with comm._lock:
                key = ("send" if op == OpType.SEND else "recv", peer)
                seq = comm._p2p.get(key, 0) + 1
                comm._p2p[key] = seq
        else:
            seq = take_seqs(comm)
        rec = recorder.enqueue(comm, seq, pl.rec_fp, stream=s.name, site=site, peer=peer,
                               nbytes=count * dtype.itemsize, names=pl.names)
        if meta is not None:
            meta["seq"] = seq

        def task():
            execute(comm, op, pl.steps, call.current_views(bufs), call.redop, dtype, call.cid,
                    seq, pl.fp, timeout, by_comm, (rec,))
        return task

    meta = None
    if profiler.active():       # the trace's arguments of the task: only when recorded
        meta = {"comm": comm.name, "count": count, "dtype": dtype.name,
                "bytes": count * dtype.itemsize}
        if peer is not None:
            meta["peer"] = peer
    fuse = None
    if s.capture is not None and op == OpType.ALLREDUCE:
        fuse = fusion.fusable(comm, bufs, pl, count, dtype, call.redop, call.knobs, site, s.name,
                              call.cid, timeout, by_comm, call.inplace)
    s.enqueue_deferred(make, name=call.name, category="collective", meta=meta, site=site,
                       fuse=fuse)


def execute(comm: Comm, op, steps, views: dict, redop, dtype, cid: int, seq: int, fp,
            timeout, by_comm: bool, recs: tuple) -> None:
    """Run one exchange (``steps`` on the host ``views``) for the flight records ``recs``: one
    per call, several for a fused group; a failure becomes the user's error on each."""
    for rec in recs:
        recorder.start(rec)
    first = recs[0]
    try:
        executor.run(steps, views, redop, dtype, comm.world.transport, cid, seq, fp, comm.ranks,
                     timeout, on_wait=functools.partial(recorder.waiting, first),
                     rank=comm.rank)
    except HcclError as e:
        for rec in recs:
            recorder.fail(rec, e)
        err = comm._failure(e, op, seq, fp, timeout, by_comm, cid)
        for rec in recs:
            rec.error = f"{type(err).__name__}: {str(err).splitlines()[0]}"
            # a peer's failure reaching this rank: the verdict looks past it for the cause
            rec.error_type = "RemoteRankError" if getattr(err, "abort", None) else \
                type(err).__name__
        diag.flush()
        raise err from e
    for rec in recs:
        recorder.complete(rec)


def _read_knobs() -> tuple:
    """(HCCL_ALGO, slice bytes) for ``plan.collective``. A communicator keeps them from its first planned
    collective on; a bad value fails each call until it is fixed, as when read at every call."""
    algo = config.algo() if config.algo_set() else "auto"   # auto: schedule.choose by size
    return algo, config.slice_bytes()


_API_NAMES = {OpType.ALLREDUCE: "AllReduce", OpType.ALLGATHER: "AllGather",
              OpType.REDUCE_SCATTER: "ReduceScatter", OpType.BROADCAST: "Broadcast",
              OpType.REDUCE: "Reduce", OpType.ALLTOALL: "AlltoAll", OpType.SEND: "Send",
              OpType.RECV: "Recv", OpType.BARRIER: "Barrier"}


def _resolve_stream(api, stream):
    try:
        return resolve_stream(stream)
    except NpuError as e:
        raise InvalidArgumentError(f"{api}: stream: {e}") from None


def _device_of(b) -> int:
    if isinstance(b, runtime.DeviceArray):
        return b.ptr.device_id if b.ptr is not None else -1
    return b.device_id


def _same(a, b) -> bool:
    if a is None or b is None:
        return False
    if a is b:
        return True
    pa = a.ptr if isinstance(a, runtime.DeviceArray) else a
    pb = b.ptr if isinstance(b, runtime.DeviceArray) else b
    return pa is not None and pb is not None and pa.device_id == pb.device_id and pa.addr == pb.addr


def _size(a, name) -> int:
    if not isinstance(a, runtime.DeviceArray):
        raise InvalidArgumentError(f"{name}={describe(a)}: the Comm methods infer count and dtype from a "
                                   "DeviceArray; use hccl.<collective>(...) with a count for DevicePtr")
    return a.size


def _arr_dtype(a) -> DataType:
    try:
        return DataType.of(a.dtype)
    except (InvalidArgumentError, ValueError, TypeError):
        raise InvalidArgumentError(f"dtype {a.dtype} of the DeviceArray is not an HCCL data type "
                                   f"({', '.join(d.name for d in DataType)})") from None
