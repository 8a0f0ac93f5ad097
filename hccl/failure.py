"""What went wrong: one vocabulary of failure kinds for every layer that reports a failure.

The same words are a rank's error record (``launcher.worker``, the error file), an abort record
(``hccl.abortrec``, what travels between ranks and from npurun) and the class of npurun's job
verdict (``launcher.verdict``): a reader never translates between three lists. Standard library
only, so the worker bootstrap imports it before the user's code without slowing its start.
"""
from __future__ import annotations

import collections
import enum


class Failure(str, enum.Enum):
    """A failure kind; the value is the word written into records and reports."""

    #: the rank's own code raised (a bad argument, a user exception, out of memory, a call only
    #: members may make): the root cause of whatever waited for it
    ERROR = "error"
    #: a wait for a peer inside a collective ran past HCCL_EXEC_TIMEOUT
    TIMEOUT = "timeout"
    #: ranks called different collectives at the same seq of a communicator
    MISMATCH = "mismatch"
    #: a collective failed otherwise (the transport, a protocol error)
    FAILED = "failed"
    #: the rank's collective was aborted because another rank failed: an echo, never a cause
    RELEASED = "released"
    #: the rank's process died (a signal, or an exit without a Python exception)
    DEAD = "dead"
    #: ranks wait for each other across communicators
    DEADLOCK = "deadlock"
    #: the rank's published state stopped refreshing (a lost node, a cut link)
    UNREACHABLE = "unreachable"
    #: npurun stops the job (its verdict names the culprit)
    STOPPED = "stopped"

    def __str__(self) -> str:
        return self.value


# hccl's errors by class name (the bootstrap imports no numpy): what each one means for the
# rank that raised it; an ``InvalidArgumentError`` is raised at the call, by the caller's code
HCCL_ERRORS = (("HcclTimeoutError", Failure.TIMEOUT), ("CollectiveMismatchError", Failure.MISMATCH),
               ("RemoteRankError", Failure.RELEASED), ("InvalidArgumentError", Failure.ERROR),
               ("HcclError", Failure.FAILED))

#: kinds of a rank that failed inside a collective because of the job's state, not its own code
COLLECTIVE = frozenset({Failure.TIMEOUT, Failure.MISMATCH, Failure.FAILED, Failure.RELEASED})


# npusim errors the torch backend handed to torch's C++ as a failed Future (hccl.torch_work).
# torch carries such an error on as a RuntimeError holding only its text ("Got the following
# error when running the callback: RemoteRankError: [rank 0] ..."), and DDP raises that from
# backward(): ``origin`` names the npusim error behind it, so a rank released by a dead peer
# is recorded as released, not as its own code's error. A few suffice: a rank raises one.
_HANDED: collections.deque = collections.deque(maxlen=16)


def handed_to_torch(exc: BaseException) -> None:
    """Note that ``exc`` went into torch's C++ as a Future's error (see ``origin``)."""
    if not _HANDED or _HANDED[-1] is not exc:
        _HANDED.append(exc)


def origin(exc: BaseException) -> BaseException:
    """The npusim error ``exc`` stands for: ``exc`` itself, or, for the RuntimeError torch made
    of an error the torch backend handed it, that error (its whole message is in the text)."""
    if type(exc) is not RuntimeError:
        return exc
    text = str(exc)
    for handed in reversed(_HANDED):
        message = str(handed)
        if message and f"{type(handed).__name__}: {message}" in text:
            return handed
    return exc


def of_exception(exc: BaseException) -> tuple[Failure, str]:
    """(kind, class name) of an exception a rank raised: hccl's own class for a failed stream
    task (the most derived, not the combined ``TaskError[...]``), else the exception's class;
    a RuntimeError torch made of an npusim error is that error (``origin``)."""
    exc = origin(exc)
    names = [c.__name__ for c in type(exc).__mro__]
    for cls_name, kind in HCCL_ERRORS:
        if cls_name in names:
            if kind is Failure.FAILED:
                cls_name = next((n for n in names if not n.startswith("TaskError[")), cls_name)
            return kind, cls_name
    return Failure.ERROR, next((n for n in names if not n.startswith("TaskError[")), names[0])


def parse(word) -> Failure | None:
    """The kind named by ``word`` (a record's field), or None if it names none."""
    try:
        return Failure(word)
    except ValueError:
        return None
