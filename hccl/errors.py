"""Exceptions of the collective library.

Every error is an ``HcclError`` carrying ``.result`` (an HcclResult code) and a message that says
what happened, with numbers, and what to do. Errors carry their facts as fields (``seq``, ``peer``,
``ranks``, ...): the executor builds the user's error once, with its context (op name,
communicator, seq; ``executor.failure``), and the launcher
can classify ranks without parsing text. All classes pickle cleanly across processes: fields travel
in the instance ``__dict__``, rebuilt without calling ``__init__``.
"""
from __future__ import annotations

from hccl.result import Result


class HcclError(Exception):
    """Base class of every hccl error; ``result`` is the HcclResult code."""

    result: Result = Result.E_INTERNAL

    def __init__(self, message: str = "", result: Result | int | None = None, **fields):
        super().__init__(message)
        if result is not None:
            self.result = Result(result)
        for name, value in fields.items():
            setattr(self, name, value)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


def _rebuild(cls, message, state):
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class InvalidArgumentError(HcclError, ValueError):
    """A bad argument (E_PARA), raised at the call before anything is enqueued."""

    result = Result.E_PARA


class HcclTimeoutError(HcclError, TimeoutError):
    """A wait for a peer inside a collective ran out (E_TIMEOUT; HCCL_EXEC_TIMEOUT bounds a wait).

    Fields: ``peer`` (comm rank waited for, or None), ``world_peer``, ``seq``, ``waited`` (s),
    ``timeout`` (s), ``rank`` (this rank in the comm, if known), ``step`` (message tag, if known).
    """

    result = Result.E_TIMEOUT

    def __init__(self, message: str = "", *, peer=None, world_peer=None, seq=None, waited=None,
                 timeout=None, rank=None, step=None, result=None):
        if not message:
            message = (f"seq {seq}: waited {_secs(waited)} for rank {peer}"
                       f" (timeout {_secs(timeout)}); check that rank {peer} reached the same"
                       " collective, or raise HCCL_EXEC_TIMEOUT")
        super().__init__(message, result, peer=peer, world_peer=world_peer, seq=seq,
                         waited=waited, timeout=timeout, rank=rank, step=step)


class CollectiveMismatchError(HcclError):
    """Ranks called different collectives at the same seq of a communicator (E_PARA).

    Fields: ``seq``; ``ranks`` (list of comm ranks) and ``calls`` (the call of each of those ranks,
    same order: a ``Fingerprint`` or its text). The default message reads
    ``seq 12: rank 0 ALLREDUCE(count=1024, FP32, SUM) vs rank 1 ALLGATHER(count=512, FP32)``.
    """

    result = Result.E_PARA

    def __init__(self, message: str = "", *, seq=None, ranks=(), calls=(), result=None):
        ranks, calls = list(ranks), list(calls)
        if not message:
            pairs = " vs ".join(f"rank {r} {c}" for r, c in zip(ranks, calls))
            message = (f"seq {seq}: {pairs}; every rank of a communicator must call the same"
                       " collectives in the same order with the same count, dtype, op and root")
        super().__init__(message, result, seq=seq, ranks=ranks, calls=calls)


class RemoteRankError(HcclError):
    """A peer died or aborted the communicator (E_REMOTE).

    Fields: ``rank`` (the remote comm rank, or None), ``world_peer``, ``reason`` (text), ``seq``.
    """

    result = Result.E_REMOTE

    def __init__(self, message: str = "", *, rank=None, world_peer=None, reason: str = "",
                 seq=None, result=None):
        if not message:
            message = f"seq {seq}: rank {rank} failed or aborted: {reason or 'no reason given'}"
        super().__init__(message, result, rank=rank, world_peer=world_peer, reason=reason, seq=seq)


def _secs(x) -> str:
    return "?" if x is None else f"{float(x):.1f} s"
