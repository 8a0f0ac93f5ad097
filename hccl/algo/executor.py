"""Runs one rank's schedule (``hccl.algo.schedule``) over its peers' pairs: bound once, run many times.

Design note (gloo's algorithm objects). ``bind`` turns a schedule, the buffers' byte views and
the peers' pairs (``hccl.transport``: one per peer, siblings with the same calls) into a
``Program``: one small object per step (``BoundSend``, ``BoundRecv``, ``BoundCopy``,
``BoundReduce``) holding the pair, the view of the bytes it moves (a memoryview for a send, the
typed numpy regions and the reduce function for a receive) and the address range it touches.
``Program.run`` and ``Program.begin`` share one loop over those steps (``Program._loop``);
nothing is sliced, looked up or allocated per step beyond what the messages themselves need.
Bound with the tag's fixed parts (comm_id, fingerprint), a step also holds what its pair
prepared for it (``Pair.sender`` / ``Pair.receiver``: the shared-memory ring's writer and
reader), called with the sequence number alone. A ``hccl.call.Call`` binds its program once,
when the call is first validated, and runs it at every issue.

An eager call on an idle stream begins its program at the call (``Program.begin``, through
``runtime.Stream.enqueue_begun``). A small one runs there as far as it goes without waiting: its
sends, its local steps, and each receive whose message is there or arrives before a deadline a
few microseconds away (the pair spins for it, never sleeping in the kernel); most often that is
the whole program, and the call is done before it returns, with no hand-off to the stream's
worker. Otherwise (and for a large call, which only posts the sends before its first receive, so
the peers' receives find them early) the stream's task goes on from the first step not run. Sends are posted zero-copy and not waited for; a Recv is first tried without waiting
(``pair.try_recv``: the message is often there already) and only then waited for (at most
``timeout`` seconds, the HCCL_EXEC_TIMEOUT of one wait), telling ``on_wait`` whom it waits for;
it then reduces or copies the payload into its region; a Copy moves bytes locally. Before
anything writes a region that a still-pending send reads, that send is waited for (the
write-after-send hazard). Hazards are tracked by memory address, not buffer name, so aliased
buffers (in place: recv is send) are safe. All sends are waited for before ``run`` returns, so
the caller may reuse every buffer afterwards.

A failing step raises ``StepFailed`` (the error and the step); ``hccl.algo.translate.failure``
(re-exported here with ``Context``) makes it the user's exception, once.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from hccl.algo.reduction import WIDENED, reduce3, reduce_into, ufunc
from hccl.algo.schedule import (NONE, SCRATCH, Copy, LocalReduce, Recv, Send, buffer_extents,
                                reduces)
from hccl.algo.translate import Context, failure  # noqa: F401   (re-exported: call.py uses them)
from hccl.errors import HcclError, InvalidArgumentError
from hccl.transport.base import DONE, PeerTimeout, TransportError, norm_fp
from hccl.types import DataType, ReduceOp, Result

_EMPTY = np.empty(0, np.uint8)
_EMPTY_MV = memoryview(b"")
_U8 = np.dtype(np.uint8)
GIL_COPY_BYTES = 256 << 10      # copies up to this size keep the GIL (see copy_bytes)
_WAIT = object()                # Program._loop's until for run: every step waits
_END = 1 << 64                  # above every address: ``busy(0, _END)`` asks of every send
_perf = time.perf_counter


class _Pending:
    """Zero-copy sends whose payload the transport may still read: [lo, hi) addresses."""

    __slots__ = ("items", "timeout", "on_wait")

    def __init__(self, timeout: float | None, on_wait):
        self.items: list[tuple[int, int, object, int, int]] = []   # lo, hi, handle, peer, step
        self.timeout = timeout
        self.on_wait = on_wait      # (peer, sending): sending=True, for delivery of our send

    def settle(self, lo: int, hi: int) -> None:
        """Wait every pending send that reads any byte of [lo, hi)."""
        if not self.items or hi <= lo:
            return
        keep = []
        for item in self.items:
            if item[0] < hi and lo < item[1] and not item[2].done():
                self._wait(item)
            elif not item[2].done():
                keep.append(item)
        self.items = keep

    def busy(self, lo: int, hi: int) -> bool:
        """Drop the sends delivered; whether one still pending reads any byte of [lo, hi)
        (``settle`` would wait for it). Never waits."""
        self.items = keep = [item for item in self.items if not item[2].done()]
        return any(item[0] < hi and lo < item[1] for item in keep)

    def drain(self) -> None:
        items, self.items = self.items, []
        for item in items:
            self._wait(item)

    def _wait(self, item) -> None:
        _, _, handle, peer, step = item
        if self.on_wait is not None and not handle.done():
            self.on_wait(peer, True)
        try:
            handle.wait(self.timeout)
        except PeerTimeout as e:
            e.send_step = step     # the wait was for delivery of our send, not for a message
            raise


def copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for flat uint8 views of equal size, keeping the GIL below
    GIL_COPY_BYTES.

    numpy releases the GIL for a copy of 512 elements or more. When another thread of the process
    wants it (a stream worker just woken by an enqueue, the socket receiver), the release hands it
    over and taking it back costs a thread wake-up: 15-100 us on this VM for a 1 KiB copy that
    itself takes 0.1 us. A memoryview copy holds the GIL; above the limit the copy is long enough
    to let other threads run beside it.
    """
    if dst.nbytes <= GIL_COPY_BYTES:
        dst.data[:] = src.data
    else:
        np.copyto(dst, src)


def _as_bytes(name: str, arr) -> np.ndarray:
    if type(arr) is np.ndarray and arr.dtype == _U8 and arr.ndim == 1 and arr.flags.c_contiguous:
        return arr                  # already flat bytes: what runtime.host_view returns
    a = np.asarray(arr)
    if not a.flags.c_contiguous:
        raise InvalidArgumentError(f"buffer {name!r} must be C-contiguous")
    return a.reshape(-1).view(np.uint8)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def prepare_buffers(steps, buffers: dict) -> dict[str, np.ndarray]:
    """Flat uint8 views of ``buffers``, checked against what ``steps`` touch; allocates scratch.

    Raises InvalidArgumentError if a buffer the schedule uses is missing or too small.
    """
    views: dict[str, np.ndarray] = {}
    for name, need in buffer_extents(steps).items():
        arr = buffers.get(name)
        if arr is None and name == SCRATCH:
            views[name] = np.empty(need, np.uint8)
            continue
        if arr is None:
            raise InvalidArgumentError(
                f"the schedule uses buffer {name!r} ({need} bytes) but only "
                f"{sorted(buffers)} were given")
        view = _as_bytes(name, arr)
        if view.nbytes < need:
            if name == SCRATCH:
                view = np.empty(need, np.uint8)
            else:
                raise InvalidArgumentError(
                    f"buffer {name!r} has {view.nbytes} bytes, the collective needs {need}")
        views[name] = view
    views.setdefault(NONE, _EMPTY)
    return views


class BoundSend:
    """A bound Send: post ``payload`` (the bytes [lo, hi)) to comm rank ``peer`` through ``pair``
    with tag ``step``; ``fn(seq)`` is what the pair prepared for it (None: ``pair.send``)."""

    __slots__ = ("pair", "payload", "step", "lo", "hi", "peer", "fn")

    def __init__(self, pair, payload: memoryview, step: int, lo: int, hi: int, peer: int, fn):
        self.pair, self.payload, self.step, self.lo, self.hi = pair, payload, step, lo, hi
        self.peer, self.fn = peer, fn


class BoundRecv:
    """A bound Recv: take tag ``step`` from comm rank ``peer`` through ``pair`` into ``consume``
    (which writes [lo, hi)); ``fn(seq, spin)`` is what the pair prepared (None: the pair's
    ``try_recv``)."""

    __slots__ = ("pair", "step", "consume", "lo", "hi", "peer", "fn")

    def __init__(self, pair, step: int, consume, lo: int, hi: int, peer: int, fn):
        self.pair, self.step, self.consume, self.lo, self.hi = pair, step, consume, lo, hi
        self.peer, self.fn = peer, fn


class BoundCopy:
    """A bound Copy ``dst[:] = src`` (writes [lo, hi)); ``small``: memoryviews, the GIL kept
    (``copy_bytes``' rule, decided once)."""

    __slots__ = ("dst", "src", "small", "lo", "hi")

    def __init__(self, dst, src, small: bool, lo: int, hi: int):
        self.dst, self.src, self.small, self.lo, self.hi = dst, src, small, lo, hi


class BoundReduce:
    """A bound LocalReduce ``dst op= src`` on typed numpy views (writes [lo, hi))."""

    __slots__ = ("dst", "src", "op", "lo", "hi")

    def __init__(self, dst: np.ndarray, src: np.ndarray, op, lo: int, hi: int):
        self.dst, self.src, self.op, self.lo, self.hi = dst, src, op, lo, hi


class Program:
    """A schedule bound to views and pairs (``bind``); ``run`` executes it, any number of times
    (one at a time: its scratch is its own)."""

    __slots__ = ("ops", "views", "lead", "provisional")

    def __init__(self, ops: tuple, views: dict, provisional: bool = False):
        self.ops, self.views = ops, views
        # bound to a pair not made yet (``Pair.provisional``): its steps take the pair's plain
        # calls; bind again after a run to take what the real pair prepares
        self.provisional = provisional
        # the steps before the first receive: ``begin`` may run them before the task does
        self.lead = next((i for i, op in enumerate(ops) if type(op) is BoundRecv), len(ops))

    def begin(self, comm_id: int, seq: int, fp, timeout: float | None,
              on_wait: Callable[[int, bool], None] | None = None,
              until: float | None = None) -> tuple | None:
        """Run the steps that need no waiting, now, in the calling thread: the sends, and the
        local steps and receives while nothing blocks them. With ``until`` (a ``perf_counter``
        time) it goes as far as it can: a receive whose message is there, or arrives by
        ``until`` (the pair spins for it, never sleeping in the kernel: ``Pair.try_recv``), runs
        too; without, it stops at the first receive (the sends before it are posted, so the
        peers' receives find them early). A step that would wait (a receive not there in time,
        a local step or the end behind a send still being delivered) stops it.

        Returns None when the whole program ran (every send delivered: the caller may reuse
        every buffer), else (the index of the first step not run, the pending sends) for
        ``run``'s ``start`` and ``pending``; raises ``StepFailed`` as ``run`` does."""
        n = self.lead if until is None else len(self.ops)
        return self._loop(comm_id, seq, fp, timeout, on_wait, 0, n, None, until)

    def run(self, comm_id: int, seq: int, fp, timeout: float | None,
            on_wait: Callable[[int, bool], None] | None = None, start: int = 0,
            pending: "_Pending | None" = None) -> None:
        """Execute the program for ``seq`` (from step ``start`` with the sends ``pending``
        after a ``begin``); raises ``StepFailed`` (the transport's or the consumer's exception
        and the step it failed in) for ``failure`` to translate."""
        self._loop(comm_id, seq, fp, timeout, on_wait, start, len(self.ops), pending, _WAIT)

    def _loop(self, comm_id, seq, fp, timeout, on_wait, i, n, pending, until):
        """The one executor loop: steps ``i`` to ``n``. ``until`` is ``_WAIT`` (``run``: a step
        waits for what it needs, the pending sends are drained at the end, returns None) or a
        ``perf_counter`` deadline / None (``begin``: a step that would wait stops the loop)."""
        ops = self.ops
        wait = until is _WAIT
        op = None
        try:
            while i < n:
                op = ops[i]
                kind = type(op)
                if kind is BoundSend:
                    fn = op.fn
                    handle = op.pair.send(comm_id, seq, op.step, fp, op.payload) if fn is None \
                        else fn(seq)
                    if handle is not DONE and op.hi > op.lo and not handle.done():
                        if pending is None:
                            pending = _Pending(timeout, on_wait)
                        pending.items.append((op.lo, op.hi, handle, op.peer, op.step))
                    i += 1
                    continue
                if pending is not None and pending.items:   # the region's readers first: the
                    if wait:                                # consumer may run inside the poll
                        pending.settle(op.lo, op.hi)
                    elif pending.busy(op.lo, op.hi):
                        break               # a send still reads the region: the task waits
                if kind is BoundRecv:
                    fn = op.fn
                    if wait:
                        if not (op.pair.try_recv(comm_id, seq, op.step, fp, op.consume)
                                if fn is None else fn(seq)):
                            if on_wait is not None:
                                on_wait(op.peer, False)
                            op.pair.recv_into(comm_id, seq, op.step, fp, timeout, op.consume)
                    elif not (op.pair.try_recv(comm_id, seq, op.step, fp, op.consume,
                                               until - _perf())
                              if fn is None else fn(seq, until - _perf())):
                        break               # not there in time: the task waits for it
                elif kind is BoundCopy:
                    if op.small:                        # copy_bytes, inline: memoryviews,
                        op.dst[:] = op.src              # the GIL kept
                    else:
                        np.copyto(op.dst, op.src)
                else:
                    reduce_into(op.dst, op.src, op.op)
                i += 1
            op = None
            if wait:
                if pending is not None:
                    pending.drain()
                return None
        except (TransportError, HcclError) as e:
            raise StepFailed(e, op) from e
        if i == len(ops) and (pending is None or not pending.busy(0, _END)):
            return None
        return i, pending


class StepFailed(Exception):
    """What ``Program.run`` raises: ``error`` (a TransportError or HcclError) in step ``op``
    (a BoundSend, BoundRecv, BoundCopy or BoundReduce; None after the loop)."""

    def __init__(self, error: BaseException, op):
        super().__init__(str(error))
        self.error, self.op = error, op

    @property
    def peer(self) -> int | None:
        """The comm rank the failing step talked to (None for a local step or after the loop)."""
        return self.op.peer if type(self.op) in (BoundSend, BoundRecv) else None

    @property
    def is_recv(self) -> bool:
        return type(self.op) is BoundRecv


def bind(steps: Sequence, views: dict, op: ReduceOp | None, dtype, pairs: Sequence,
         tag: tuple | None = None) -> Program:
    """The ``Program`` of ``steps`` on ``views`` (``prepare_buffers``' flat uint8 views) with
    ``pairs[r]`` the pair of comm rank r. With ``tag`` = (comm_id, fp), the fixed parts of
    every message's tag, each Send and Recv takes what its pair prepares for them
    (``Pair.sender`` / ``Pair.receiver``), and the program may then run only with that
    comm_id and fp. Raises InvalidArgumentError for a reducing schedule without op and dtype,
    or an unknown step."""
    np_dtype = None if dtype is None else \
        (dtype if type(dtype) is DataType else DataType.of(dtype)).numpy
    if reduces(steps):
        if np_dtype is None or op is None:
            raise InvalidArgumentError("a reducing schedule needs op and dtype")
        op = ReduceOp.of(op)
    base = {name: _address(v) if v.nbytes else 0 for name, v in views.items()}
    ops, provisional = [], False
    for step in steps:
        kind = type(step)
        if kind is Send:
            off, nb = step.offset, step.nbytes
            payload = memoryview(views[step.buf][off:off + nb]) if nb else _EMPTY_MV
            lo, pair = base[step.buf] + off, pairs[step.peer]
            fn = None if tag is None else pair.sender(tag[0], step.step, tag[1], payload)
            provisional = provisional or pair.provisional
            ops.append(BoundSend(pair, payload, step.step, lo, lo + nb, step.peer, fn))
        elif kind is Recv:
            lo, pair = base[step.buf] + step.offset, pairs[step.peer]
            consume, direct = _consumer(step, views, np_dtype, op)
            fn = None if tag is None else pair.receiver(tag[0], step.step, tag[1], step.nbytes,
                                                        consume, direct)
            provisional = provisional or pair.provisional
            ops.append(BoundRecv(pair, step.step, consume, lo, lo + step.nbytes, step.peer, fn))
        elif kind is Copy:
            nb = step.nbytes
            if not nb or (views[step.src_buf] is views[step.dst_buf]
                          and step.src_off == step.dst_off):
                continue        # a self-copy (in place) moves nothing
            lo = base[step.dst_buf] + step.dst_off
            if base[step.src_buf] + step.src_off == lo:
                continue
            dst = views[step.dst_buf][step.dst_off:step.dst_off + nb]
            src = views[step.src_buf][step.src_off:step.src_off + nb]
            small = nb <= GIL_COPY_BYTES        # copy_bytes' rule, decided once
            if small:
                dst, src = memoryview(dst), memoryview(src)
            ops.append(BoundCopy(dst, src, small, lo, lo + nb))
        elif kind is LocalReduce:
            nb = step.nbytes
            if not nb:
                continue
            lo = base[step.dst_buf] + step.dst_off
            dst = views[step.dst_buf][step.dst_off:step.dst_off + nb]
            src = views[step.src_buf][step.src_off:step.src_off + nb]
            ops.append(BoundReduce(dst.view(np_dtype), src.view(np_dtype), op, lo, lo + nb))
        else:
            raise InvalidArgumentError(f"unknown schedule step {step!r}")
    return Program(tuple(ops), views, provisional)


def _consumer(step: Recv, views: dict, np_dtype, op):
    """What a Recv does with its payload: check the size, then reduce or copy it into place.
    Returns (consume, direct): ``consume(view)`` takes the payload as a byte view of any size
    (a wrong size is an error); ``direct`` is None or (dtype, fn), ``fn(arr)`` doing the same
    with the payload already an array of that dtype and the right size (``Pair.receiver``).

    Built once per bound step. It never waits (the executor settled the region's pending sends
    before the Recv): a pair may call it while it holds the lock of the peer's ring."""
    nb = step.nbytes
    dst = views[step.buf][step.offset:step.offset + nb]

    def wrong(data):
        return HcclError(
            f"rank {step.peer} sent {data.nbytes} bytes for step {step.step}, expected {nb}; "
            "the ranks disagree on the buffer layout", Result.E_INTERNAL, peer=step.peer,
            step=step.step)

    if not nb:
        def consume(data) -> None:
            if data.nbytes:
                raise wrong(data)
        return consume, None
    if not step.reduce:
        def consume(data) -> None:
            if data.nbytes != nb:
                raise wrong(data)
            copy_bytes(dst, np.frombuffer(data, np.uint8))

        def copy(arr) -> None:
            copy_bytes(dst, arr)
        return consume, (_U8, copy)
    typed = dst.view(np_dtype)
    src = views[step.src][step.offset:step.offset + nb].view(np_dtype) if step.src else None
    if src is not None and views[step.src] is views[step.buf]:
        src = None                          # in place: the plain reduce into dst
    a = typed if src is None else src
    if np_dtype in WIDENED:                 # fp16 / bf16: widened block by block (reduction.py)
        def fn(x, y, out):
            reduce3(out, x, y, op)
    else:
        fn = ufunc(op)
    if step.payload_first:                  # dst = payload op src, dst's first write
        def consume(data) -> None:
            if data.nbytes != nb:
                raise wrong(data)
            fn(np.frombuffer(data, np_dtype), a, out=typed)

        def direct(arr) -> None:
            fn(arr, a, out=typed)
    else:                                   # dst = src op payload (src is dst in place)
        def consume(data) -> None:
            if data.nbytes != nb:
                raise wrong(data)
            fn(a, np.frombuffer(data, np_dtype), out=typed)

        def direct(arr) -> None:
            fn(a, arr, out=typed)
    return consume, (np_dtype, direct)


def run(steps: Sequence, buffers: dict, op: ReduceOp | None, dtype, transport, comm_id: int,
        seq: int, fp, peers: Sequence[int], timeout: float | None,
        on_wait: Callable[[int, bool], None] | None = None, *, rank: int | None = None) -> None:
    """Bind ``steps`` to ``buffers`` and ``transport``'s pairs and run them once (tests, tools).

    Args:
        buffers: ``{"send": ..., "recv": ...}`` (numpy arrays, any dtype, C-contiguous; viewed as
            bytes); the same array under both names for in-place. ``"scratch"`` is allocated
            when the schedule needs it and none (or too small a one) is given.
        op, dtype: the reduce op and element type (anything ``DataType.of`` accepts); only
            needed when the schedule reduces.
        comm_id, seq, fp: message tag parts and the fingerprint (5 ints) sent with every message.
        peers: comm rank -> world rank (the transport's rank numbers).
        timeout: the longest single wait for a peer, in seconds (None = forever).
        on_wait: called with the comm rank before each blocking wait for that peer, and True
            when the wait is for the delivery of this rank's own send.
        rank: this rank's comm rank, only used to fill error fields.

    Raises ``HcclTimeoutError``, ``CollectiveMismatchError``, ``RemoteRankError`` (peer abort),
    ``HcclError`` (E_UNAVAIL: transport closed; E_INTERNAL: a message of the wrong size) and
    ``InvalidArgumentError`` (buffers do not fit the schedule), through ``failure`` without a
    communicator (nothing is aborted).
    """
    world = list(peers)
    prog = bind(steps, prepare_buffers(steps, buffers), op, dtype,
                [transport.pair(p) for p in world])
    try:
        prog.run(comm_id, seq, norm_fp(fp), timeout, on_wait)
    except StepFailed as f:
        raise failure(f, world, seq, fp, timeout, rank) from f.error
