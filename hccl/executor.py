"""Runs a schedule (``hccl.schedule``) of one rank over a transport.

Sends are posted zero-copy and not waited for; a Recv blocks (at most ``timeout`` seconds, the
HCCL_EXEC_TIMEOUT of one wait) and then reduces or copies the payload into its region; a Copy
moves bytes locally. Before anything writes a region that a still-pending send reads, that send is
waited for (the write-after-send hazard). Hazards are tracked by memory address, not buffer name,
so aliased buffers (in place: recv is send) are safe. All sends are waited for before ``run``
returns, so the caller may reuse every buffer afterwards.

Transport exceptions become hccl errors carrying the raw facts (comm ranks, seq, waited seconds,
both fingerprints); the communicator layer adds the op name and context to the message.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from hccl import abortrec
from hccl.errors import (CollectiveMismatchError, HcclError, HcclTimeoutError,
                         InvalidArgumentError, RemoteRankError)
from hccl.reduction import reduce3, reduce_into
from hccl.schedule import NONE, SCRATCH, Copy, LocalReduce, Recv, Send, buffer_extents, reduces
from hccl.transport.base import (Aborted, FingerprintMismatch, PeerGone, PeerTimeout,
                                 TransportClosed, TransportError)
from hccl.types import DataType, Fingerprint, ReduceOp, Result

_EMPTY = np.empty(0, np.uint8)
_U8 = np.dtype(np.uint8)
GIL_COPY_BYTES = 256 << 10      # copies up to this size keep the GIL (see copy_bytes)


class _Pending:
    """Zero-copy sends whose payload the transport may still read: [lo, hi) addresses."""

    __slots__ = ("items", "timeout", "on_wait")

    def __init__(self, timeout: float | None, on_wait):
        self.items: list[tuple[int, int, object, int, int]] = []   # lo, hi, handle, peer, step
        self.timeout = timeout
        self.on_wait = on_wait      # (peer, sending): sending=True, for delivery of our send

    def add(self, lo: int, hi: int, handle, peer: int, step: int) -> None:
        if hi > lo and not handle.done():
            self.items.append((lo, hi, handle, peer, step))

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


class _Addresses(dict):
    """Base address of each view, looked up only when a hazard check needs it (most small
    collectives have no pending send, and reading an address costs microseconds)."""

    def __init__(self, views: dict):
        super().__init__()
        self.views = views

    def __missing__(self, name: str) -> int:
        a = self[name] = _address(self.views[name])
        return a


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


def run(steps: Sequence, buffers: dict, op: ReduceOp | None, dtype, transport, comm_id: int,
        seq: int, fp, peers: Sequence[int], timeout: float | None,
        on_wait: Callable[[int, bool], None] | None = None, *, rank: int | None = None) -> None:
    """Execute ``steps`` (one rank's schedule) and return when this rank's part is complete.

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
            when the wait is for the delivery of this rank's own send (its link, not the peer,
            is then the slow part), else False.
        rank: this rank's comm rank, only used to fill error fields.

    Raises ``HcclTimeoutError``, ``CollectiveMismatchError``, ``RemoteRankError`` (peer abort),
    ``HcclError`` (E_UNAVAIL: transport closed; E_INTERNAL: a message of the wrong size) and
    ``InvalidArgumentError`` (buffers do not fit the schedule). Sends still in flight when an
    error is raised are not waited for: treat the buffers as in use until the communicator is
    aborted or destroyed.
    """
    views = prepare_buffers(steps, buffers)
    addr = _Addresses(views)
    if dtype is None:
        np_dtype = None
    else:
        np_dtype = (dtype if type(dtype) is DataType else DataType.of(dtype)).numpy
    if reduces(steps):
        if np_dtype is None or op is None:
            raise InvalidArgumentError("a reducing schedule needs op and dtype")
        op = ReduceOp.of(op)
    pending = _Pending(timeout, on_wait)
    world = peers if type(peers) is list else list(peers)
    step = None
    try:
        for step in steps:
            kind = type(step)
            if kind is Send:
                off, nb = step.offset, step.nbytes
                payload = views[step.buf][off:off + nb] if nb else _EMPTY
                handle = transport.send(world[step.peer], comm_id, seq, step.step, fp, payload)
                if nb and not handle.done():
                    lo = addr[step.buf] + off
                    pending.add(lo, lo + nb, handle, step.peer, step.step)
            elif kind is Recv:
                if pending.items and step.nbytes:     # the region's readers first: the consumer
                    lo = addr[step.buf] + step.offset  # may run inside the transport's poll of
                    pending.settle(lo, lo + step.nbytes)   # this peer, where it must not wait
                if on_wait is not None:
                    on_wait(step.peer, False)
                transport.recv_into(world[step.peer], comm_id, seq, step.step, fp, timeout,
                                    _consumer(step, views, np_dtype, op, seq))
            elif kind is Copy:
                nb = step.nbytes
                if nb and not (views[step.src_buf] is views[step.dst_buf]
                               and step.src_off == step.dst_off):
                    dst_lo = addr[step.dst_buf] + step.dst_off if pending.items else 0
                    if not pending.items or addr[step.src_buf] + step.src_off != dst_lo:
                        pending.settle(dst_lo, dst_lo + nb)
                        copy_bytes(views[step.dst_buf][step.dst_off:step.dst_off + nb],
                                   views[step.src_buf][step.src_off:step.src_off + nb])
            elif kind is LocalReduce:
                nb = step.nbytes
                if nb:
                    if np_dtype is None or op is None:
                        raise InvalidArgumentError("a reducing schedule needs op and dtype")
                    if pending.items:
                        dst_lo = addr[step.dst_buf] + step.dst_off
                        pending.settle(dst_lo, dst_lo + nb)
                    reduce_into(views[step.dst_buf][step.dst_off:step.dst_off + nb].view(np_dtype),
                                views[step.src_buf][step.src_off:step.src_off + nb].view(np_dtype), op)
            else:
                raise InvalidArgumentError(f"unknown schedule step {step!r}")
        step = None
        pending.drain()
    except TransportError as e:
        raise _translate(e, world, seq, fp, timeout, rank, step) from e


def _consumer(step: Recv, views: dict, np_dtype, op, seq: int):
    """What a Recv does with its payload: check the size, then reduce or copy it into place.

    It never waits (the executor settled the region's pending sends before the Recv): a
    transport may call it while it holds the lock of the peer's ring."""
    def consume(data) -> None:
        nb = step.nbytes
        if data.nbytes != nb:
            raise HcclError(
                f"seq {seq}: rank {step.peer} sent {data.nbytes} bytes for step "
                f"{step.step}, expected {nb}; the ranks disagree on the buffer layout",
                Result.E_INTERNAL, seq=seq, peer=step.peer, step=step.step)
        if nb:
            dst = views[step.buf][step.offset:step.offset + nb]
            if step.reduce:
                src = views[step.src] if step.src else None
                if step.payload_first:          # dst = payload op src, dst's first write
                    reduce3(dst.view(np_dtype), np.frombuffer(data, np_dtype),
                            src[step.offset:step.offset + nb].view(np_dtype), op)
                elif src is None or src is views[step.buf]:
                    reduce_into(dst.view(np_dtype), np.frombuffer(data, np_dtype), op)
                else:                           # dst = src op payload, dst's first write
                    reduce3(dst.view(np_dtype), src[step.offset:step.offset + nb].view(np_dtype),
                            np.frombuffer(data, np_dtype), op)
            else:
                copy_bytes(dst, np.frombuffer(data, np.uint8))
    return consume


def _comm_rank(world: list[int], world_rank: int) -> int | None:
    try:
        return world.index(world_rank)
    except ValueError:
        return None


def _translate(e: TransportError, world: list[int], seq: int, fp, timeout, rank,
               step) -> HcclError:
    """The hccl error for a transport exception, with comm ranks and raw facts as fields."""
    tag = getattr(step, "step", None)
    if isinstance(e, PeerTimeout):
        peer = _comm_rank(world, e.peer)
        what = "a message from"
        if hasattr(e, "send_step"):
            what, tag = "delivery to", e.send_step
        msg = (f"seq {seq}: waited {e.waited:.1f} s for {what} rank {peer} (step {tag}); "
               f"rank {peer} has not reached this collective or is stuck; raise "
               "HCCL_EXEC_TIMEOUT if it is only slow")
        return HcclTimeoutError(msg, peer=peer, world_peer=e.peer, seq=seq, waited=e.waited,
                                timeout=timeout, rank=rank, step=tag)
    if isinstance(e, FingerprintMismatch):
        peer = _comm_rank(world, e.peer)
        calls = [_describe(e.mine), _describe(e.theirs)]
        return CollectiveMismatchError(seq=e.seq, ranks=[rank, peer], calls=calls)
    if isinstance(e, Aborted):
        peer = _comm_rank(world, e.peer)
        ab = abortrec.read(e.reason, e.peer)
        e.reason = ab["text"]       # the chained Aborted prints the text, not the record
        err = RemoteRankError(f"seq {seq}: communicator aborted by rank {peer}: {ab['text']}",
                              rank=peer, world_peer=e.peer, reason=ab["text"], seq=seq)
        err.abort = ab
        # whom this rank was waiting for when the abort came: when a peer times out waiting for
        # this rank, the chain goes on from here (the first rank to time out is often a victim)
        err.waiting_for = step.peer if type(step) is Recv else None
        return err
    if isinstance(e, PeerGone):
        peer = _comm_rank(world, e.peer)
        return RemoteRankError(f"seq {seq}: rank {peer}'s process has exited in the middle of the "
                               f"collective ({e.detail})", rank=peer, world_peer=e.peer,
                               reason=f"rank {peer}'s process has exited", seq=seq)
    if isinstance(e, TransportClosed):
        return HcclError(f"seq {seq}: the transport was closed during the collective ({e}); "
                         "the communicator was destroyed or the process is shutting down",
                         Result.E_UNAVAIL, seq=seq)
    return HcclError(f"seq {seq}: transport error: {e}", Result.E_INTERNAL, seq=seq)


def _describe(fp):
    """A Fingerprint (prints as ``ALLREDUCE(count=..., FP32, SUM)``) for 5 ints, else as given."""
    try:
        return Fingerprint.from_wire(fp)
    except (TypeError, ValueError):
        return fp
