"""A transport's pair: the calls that reach one peer (see ``hccl.transport.base``'s note).

``Pair`` is the interface every sibling has (``send``, ``try_recv``, ``recv_into``, ``drain``,
and ``sender`` / ``receiver``, the same prepared for a step a call repeats); ``MailboxPair``
the receives of a pair whose messages someone else files into the transport's mailboxes;
``LoopbackPair`` this rank itself. ``SendHandle`` is a send's completion (``DONE``: already
complete). A pair reaches its transport only through the transport's public calls and
attributes (``held``, ``troubled``, ``pop_now``, ``wait_for``, ``deliver``, ``check_open``).
"""
from __future__ import annotations

from typing import Callable

Fingerprint = tuple[int, int, int, int, int]   # (op, count, dtype, redop, root) as ints


class SendHandle:
    """Completion of one ``send``: after ``wait`` returns, the payload buffer may be reused."""

    def wait(self, timeout: float | None = None) -> None:
        """Return once the transport no longer reads the payload; ``PeerTimeout`` if it took
        longer than ``timeout`` seconds (None = no limit)."""

    def done(self) -> bool:
        """True if ``wait`` would return at once."""
        return True


DONE = SendHandle()   # the handle of a send whose payload was already copied


class Pair:
    """One peer of a transport (see the module note): the calls every sibling has. ``t`` is
    the transport whose mailboxes, aborts and wait loop it shares; ``peer`` the rank."""

    __slots__ = ()

    def send(self, comm_id: int, seq: int, step: int, fp: Fingerprint,
             mv: memoryview) -> SendHandle:
        """Send ``mv`` (flat bytes) tagged ``(comm_id, seq, step)`` without blocking (``fp``
        normalized); see ``Transport.send``."""
        raise NotImplementedError

    def try_recv(self, comm_id: int, seq: int, step: int, fp: Fingerprint,
                 consume: Callable[[memoryview], None], spin: float = 0.0) -> bool:
        """If the message tagged ``(comm_id, seq, step)`` is there and may be taken at once,
        ``consume`` its payload and return True; else False, having waited for nothing (the
        caller then calls ``recv_into``, which raises whatever ends the wait). ``spin``: seconds
        the pair may spin for a message not there yet, never sleeping in the kernel; a pair
        whose messages another thread of this process files looks once (spinning would hold
        the GIL that thread needs)."""
        raise NotImplementedError

    def recv_into(self, comm_id: int, seq: int, step: int, fp: Fingerprint,
                  timeout: float | None, consume: Callable[[memoryview], None]) -> None:
        """Wait for the message tagged ``(comm_id, seq, step)`` (the transport's wait loop and
        precedence), then ``consume`` its payload, valid during the call."""
        raise NotImplementedError

    def drain(self) -> None:
        """File into the mailboxes what waits for this thread to take it (nothing by default)."""

    # A Call sends and receives the same messages at every issue, the sequence number aside:
    # a pair may prepare them once (the executor's ``bind``, given the tag's fixed parts).
    provisional = False     # a stand-in for a pair not made yet: bind again once it is

    def sender(self, comm_id: int, step: int, fp: Fingerprint,
               mv: memoryview) -> "Callable[[int], SendHandle] | None":
        """``send(comm_id, seq, step, fp, mv)`` prepared as ``fn(seq)``, with the same
        result and errors; None (the default): call ``send``."""
        return None

    def receiver(self, comm_id: int, step: int, fp: Fingerprint, nbytes: int,
                 consume: Callable[[memoryview], None],
                 direct: tuple | None) -> "Callable[..., bool] | None":
        """``try_recv(comm_id, seq, step, fp, consume, spin)`` prepared as
        ``fn(seq, spin=0.0)``, with the same result and errors; None (the default): call
        ``try_recv``. ``direct``: (numpy dtype, fn) where ``fn(arr)`` does what ``consume``
        does with a payload given as an array of that dtype and ``nbytes``, or None."""
        return None


class MailboxPair(Pair):
    """A pair whose inbound messages are filed into the transport's mailboxes by someone else
    (another in-process rank, a socket receiver thread): its receives look there."""

    __slots__ = ()

    def try_recv(self, comm_id, seq, step, fp, consume, spin=0.0) -> bool:
        t = self.t
        if (self.peer, comm_id, seq) not in t.held:       # lock-free: the usual miss
            return False
        payload = t.pop_now(self.peer, comm_id, seq, step, fp)
        if payload is None:
            return False
        consume(payload)
        return True

    def recv_into(self, comm_id, seq, step, fp, timeout, consume) -> None:
        t, peer = self.t, self.peer
        consume(t.wait_for(lambda: t.pop(peer, comm_id, seq, step, fp), comm_id, peer, timeout))


class LoopbackPair(MailboxPair):
    """This rank itself: a send files a copy into its own mailbox."""

    __slots__ = ("t", "peer")

    def __init__(self, t):
        self.t, self.peer = t, t.rank

    def send(self, comm_id, seq, step, fp, mv) -> SendHandle:
        t = self.t
        t.check_open(comm_id)
        t.deliver(t.rank, comm_id, seq, step, fp, memoryview(bytearray(mv)))
        return DONE
