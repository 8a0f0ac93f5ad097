"""The one error translation: what a failed step (``executor.StepFailed``) becomes for the user.

A transport exception, a consumer's or any other hccl error raised while a collective runs
becomes the user's exception here, once (``failure``), with the op, the communicator, the seq and
the raw facts as fields; the peers are told (the communicator is aborted) in the same place.
Nothing above rebuilds it (the stream only surfaces it as a ``TaskError`` of the same type,
naming the task).
"""
from __future__ import annotations

from hccl import abortrec
from hccl.errors import (CollectiveMismatchError, HcclError, HcclTimeoutError, RemoteRankError)
from hccl.failure import Failure
from hccl.flight import recorder
from hccl.transport.base import (Aborted, FingerprintMismatch, PeerGone, PeerTimeout,
                                 TransportClosed, TransportError)
from hccl.types import Fingerprint, Result, describe_call


def _comm_rank(world: list[int], world_rank: int) -> int | None:
    try:
        return world.index(world_rank)
    except ValueError:
        return None


class Context:
    """What ``failure`` says about the collective that failed, and whom it tells: ``comm``
    (its name, rank, comm_id, world), ``op``, ``cid`` (the id its messages carry) and
    ``timeout_by_comm`` (whether ``comm.set_exec_timeout`` set the timeout). A
    ``hccl.call.Call`` is one."""

    __slots__ = ()


def failure(f, world: list[int], seq: int, fp, timeout, rank,
            ctx: Context | None = None) -> HcclError:
    """The user's exception for ``f`` (an ``executor.StepFailed``; see the module note).

    With ``ctx`` the message starts ``[rank r] OP(comm=..., seq=..., ...)`` and the peers are
    told through an abort of the communicator where the failure is this rank's (a timeout, a
    mismatch, a local error); without it (``run``) the message is the bare facts."""
    e, tag = f.error, (f.op.step if f.is_recv else None)
    call = None
    if ctx is not None:
        c = ctx.comm
        rank = c.rank
        call = describe_call(ctx.op, fp.count, fp.dtype, fp.redop, fp.root, comm=c.name, seq=seq)
    if isinstance(e, PeerTimeout):
        peer = _comm_rank(world, e.peer)
        what = "a message from"
        if hasattr(e, "send_step"):
            what, tag = "delivery to", e.send_step
        facts = (f"seq {seq}: waited {e.waited:.1f} s for {what} rank {peer} (step {tag}); "
                 f"rank {peer} has not reached this collective or is stuck; raise "
                 "HCCL_EXEC_TIMEOUT if it is only slow")
        if ctx is None:
            msg = facts
        else:
            source = (f"comm.set_exec_timeout({timeout:g})" if ctx.timeout_by_comm else
                      f"HCCL_EXEC_TIMEOUT={timeout:g}")
            last_enq, last_done = recorder.last(c.comm_id, c.rank)
            msg = (f"[rank {rank}] {call} timed out after {timeout:.1f} s (the timeout set by "
                   f"{source}); last enqueued seq {last_enq}, last completed seq {last_done}"
                   f"\n  {facts}")
            _abort(ctx, Failure.TIMEOUT, f"rank {rank} timed out in {call} waiting for rank "
                   f"{peer}", waited_for=peer)
        return HcclTimeoutError(msg, peer=peer, world_peer=e.peer, seq=seq, waited=e.waited,
                                timeout=timeout, rank=rank, step=tag)
    if isinstance(e, FingerprintMismatch):
        peer = _comm_rank(world, e.peer)
        calls = [_describe(e.mine), _describe(e.theirs)]
        inner = CollectiveMismatchError(seq=e.seq, ranks=[rank, peer], calls=calls)
        if ctx is None:
            return inner
        _abort(ctx, Failure.MISMATCH, str(inner))
        return CollectiveMismatchError(f"[rank {rank}] {call}: collective mismatch: {inner}",
                                       seq=seq, ranks=[rank, peer], calls=[str(x) for x in calls])
    if isinstance(e, Aborted):
        peer = _comm_rank(world, e.peer)
        ab = abortrec.read(e.reason, e.peer)
        e.reason = ab["text"]       # the chained Aborted prints the text, not the record
        waiting = f.peer if f.is_recv else None
        err = _remote(ab, peer, waiting, seq, rank, call, e.peer)
        err.abort = ab              # the typed record, for the launcher's error file
        # whom this rank was waiting for when the abort came: when a peer times out waiting for
        # this rank, the chain goes on from here (the first rank to time out is often a victim)
        err.waiting_for = waiting
        return err
    if isinstance(e, PeerGone):
        peer = _comm_rank(world, e.peer)
        # why it is gone, as the transport found it: its process exited, or its link broke
        reason = f"rank {peer} is gone: {e.detail}"
        if ctx is None:
            return RemoteRankError(f"seq {seq}: {reason}, in the middle of the collective",
                                   rank=peer, world_peer=e.peer, reason=reason, seq=seq)
        err = RemoteRankError(f"[rank {rank}] {call} aborted: {reason}", rank=peer,
                              world_peer=e.peer, reason=reason, seq=seq)
        err.abort = abortrec.read(abortrec.record(Failure.DEAD, e.peer, reason,
                                                  seen_by=world[rank]))
        return err
    if isinstance(e, TransportClosed):
        err = HcclError(f"seq {seq}: the transport was closed during the collective ({e}); "
                        "the communicator was destroyed or the process is shutting down",
                        Result.E_UNAVAIL, seq=seq)
    elif isinstance(e, TransportError):
        err = HcclError(f"seq {seq}: transport error: {e}", Result.E_INTERNAL, seq=seq)
    else:
        err = e                     # an hccl error of a step (a consumer's, a bad buffer)
        if getattr(err, "seq", None) is None:
            err.seq = seq
    if ctx is None:
        return err
    msg = f"[rank {rank}] {call} failed: {err}"
    out = type(err).__new__(type(err))
    Exception.__init__(out, msg)
    out.__dict__.update(err.__dict__)
    _abort(ctx, Failure.FAILED, f"rank {rank} failed in {call}: {str(err).splitlines()[0]}")
    return out


def _remote(ab: dict, peer, waiting, seq, rank, call, world_peer) -> HcclError:
    """The error of an abort a peer (or the launcher) announced, by the abort's kind."""
    text, kind = ab["text"], ab["kind"]
    if call is None:
        return RemoteRankError(f"seq {seq}: communicator aborted by rank {peer}: {text}",
                               rank=peer, world_peer=world_peer, reason=text, seq=seq)
    if kind == Failure.DEAD:     # seen by a rank's transport, or by the launcher
        stopping = "" if "seen_by" in ab else "; the job is being stopped"
        return RemoteRankError(f"[rank {rank}] {call} failed: {text}{stopping}",
                               rank=ab["rank"], world_peer=world_peer, reason=text, seq=seq)
    if kind in (Failure.DEADLOCK, Failure.STOPPED, Failure.ERROR):  # the text: the cause
        return RemoteRankError(f"[rank {rank}] {call} failed: {text}", rank=ab["rank"],
                               world_peer=world_peer, reason=text, seq=seq)
    if kind == Failure.MISMATCH:
        return CollectiveMismatchError(
            f"[rank {rank}] {call}: collective mismatch reported by rank {peer}: {text}",
            seq=seq, ranks=[peer], calls=[])
    if kind in (Failure.TIMEOUT, Failure.FAILED):   # the text names who waited for whom
        chain = (f"; rank {rank} was itself waiting for rank {waiting}"
                 if kind == Failure.TIMEOUT and waiting is not None else "")
        return RemoteRankError(f"[rank {rank}] {call} aborted: {text}{chain}", rank=peer,
                               world_peer=world_peer, reason=text, seq=seq)
    return RemoteRankError(f"[rank {rank}] {call} failed: rank {peer} failed or aborted the "
                           f"communicator: {text}", rank=peer, world_peer=world_peer,
                           reason=text, seq=seq)


def _abort(ctx: Context, kind: Failure, text: str, **extra) -> None:
    """Tell every peer that this rank's collective failed (an abort of its communicator)."""
    c = ctx.comm
    c.world.transport.abort(ctx.cid, abortrec.record(kind, c.world.rank, text, **extra))


def _describe(fp):
    """A Fingerprint (prints as ``ALLREDUCE(count=..., FP32, SUM)``) for 5 ints, else as given."""
    try:
        return Fingerprint.from_wire(fp)
    except (TypeError, ValueError):
        return fp
