"""The thin transport interface under the executor, and the mailbox matching every transport shares.

Design note. A transport connects the ``size`` ranks of one world; this endpoint is ``rank``.
A message is tagged ``(comm_id, seq, step)`` and carries the collective's fingerprint
``(op, count, dtype, redop, root)``. Inbound messages go into a mailbox per
``(peer, comm_id, seq)`` holding a FIFO per ``step`` (messages with the same tag are received in
the order they were sent) and every fingerprint that peer used for that ``(comm_id, seq)``.
``recv`` waits (see Waiting below) until, in this order of precedence:

1. the transport was closed                        -> ``TransportClosed``
2. ``comm_id`` was aborted, here or by any peer,  -> ``Aborted`` (sticky for that comm_id)
   or the whole world failed (``fail``: a member sent a message this rank cannot use)
3. any message from ``peer`` for ``(comm_id, seq)`` carries another fingerprint
                                                   -> ``FingerprintMismatch`` (also when it arrived
                                                      before ``recv`` was called)
4. the message for the exact tag is there           -> its payload (popped)
5. ``peer`` is dead (``dead_peer``, checked every NPUSIM_LIVENESS_INTERVAL s; what it sent
   before dying is still taken for DEAD_PEER_GRACE s) -> ``PeerGone``, and the comm_id is
   aborted on every rank with a reason naming ``peer``
6. ``timeout`` passed                               -> ``PeerTimeout``

Memory: ``recv`` pops what it returns and drops emptied mailboxes; ``forget`` drops leftovers
(e.g. after a mismatch); messages for an aborted comm_id are discarded on arrival.

Waiting. Every wait is one loop (``wait_for``): read the *bell*'s value, let the transport
``drain`` what waits for this thread (a shared-memory ring has no receiver thread), look under
the lock, then sleep on the bell until it moves from the value read. Everything that can end a
wait rings the bell after changing the state: a message filed, an abort, ``fail``, ``close``;
so no wake-up falls between the look and the sleep. The bell is a counter under a Condition
(``CondBell``) unless the transport brings another one (the shared-memory channel's futex word,
which a peer's process can ring).

Pairs (gloo's Device / Pair). A transport reaches each peer through one *pair*
(``pair(peer)``), and every pair has the same calls: ``send``, ``try_recv`` (take the message if
it is there, never wait), ``recv_into`` (wait for it, then hand its payload to a consumer) and
``drain``. The executor binds a collective's steps to its peers' pairs once and calls them
directly; ``Transport.send`` / ``recv_into`` / ``recv`` route to the same pairs. Pairs whose
messages are filed into the mailboxes by someone else (a receiver thread, another in-process
rank) share ``MailboxPair``'s receives; a pair with its own medium (``local.LocalPair``: a
shared-memory ring that the waiting thread drains) brings its own and ends in the same wait
loop. The pair interface lives in ``hccl.transport.pair``.

Implementations. A transport subclasses ``Transport`` and implements ``pair`` (one pair per
peer, made at connect or at first use: a pair may be made lazily), ``broadcast_abort`` and, if
it owns resources, ``close``; it files what arrives with ``deliver`` and ``apply_abort``, and
may answer ``dead_peer`` and ``timeout_note``. Nothing else is meant to be overridden.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping

import numpy as np

from hccl import abortrec, config
from hccl.algo import plan
# the pair interface lives in hccl.transport.pair; these names are re-exported from here
from hccl.transport.pair import (DONE, Fingerprint, LoopbackPair, MailboxPair,  # noqa: F401
                                 Pair, SendHandle)

ALL_COMMS = (1 << 64) - 1   # the comm_id of an abort that fails every communicator of the world
DEAD_PEER_GRACE = 2.0       # s a wait still takes what a dead peer sent (in flight when it died)


class TransportError(Exception):
    """Base of the transport's exceptions (the executor translates them into hccl errors).

    A subclass names its constructor arguments in ``fields`` (kept as attributes of the same
    names) and its message in ``template``, formatted with those attributes."""

    fields: tuple[str, ...] = ()
    template = ""

    def __init__(self, *args):
        super().__init__(*args)
        for name, value in zip(self.fields, args):
            setattr(self, name, value)

    def __str__(self) -> str:
        if not self.template:
            return super().__str__()
        return self.template.format(**{f: getattr(self, f) for f in self.fields})


class PeerTimeout(TransportError, TimeoutError):
    """Nothing arrived from ``peer`` for the awaited tag within ``waited`` seconds; ``note`` says
    what else the transport saw meanwhile (e.g. unauthenticated messages it dropped)."""

    fields = ("peer", "waited", "note")
    template = "no message from rank {peer} after {waited:.1f} s{note}"

    def __init__(self, peer: int, waited: float, note: str = ""):
        super().__init__(peer, waited, note)


class FingerprintMismatch(TransportError):
    """Rank ``peer`` sent, for the same ``seq``, a message of another collective (``theirs``)."""

    fields = ("peer", "seq", "theirs", "mine")
    template = ("seq {seq}: rank {peer} is in collective {theirs}, this rank in {mine} "
                "(op, count, dtype, redop, root)")

    def __init__(self, peer: int, seq: int, theirs: Fingerprint, mine: Fingerprint):
        super().__init__(peer, seq, tuple(theirs), tuple(mine))


class Aborted(TransportError):
    """``comm_id`` was aborted by rank ``peer`` (this rank for a local abort) because of ``reason``."""

    fields = ("peer", "reason")
    template = "aborted by rank {peer}: {reason}"


class PeerGone(TransportError):
    """Rank ``peer``'s process has exited: what it announced can no longer be read."""

    fields = ("peer", "detail")
    template = "rank {peer}'s process has exited ({detail})"


class TransportClosed(TransportError):
    """The transport was closed (locally) while or before it was used."""


class CondBell:
    """The default bell (module note): a counter that waiters sleep on until it moves."""

    __slots__ = ("_cond", "_n")

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._n = 0

    def value(self) -> int:
        return self._n

    def ring(self) -> None:
        with self._cond:
            self._n += 1
            self._cond.notify_all()

    def wait(self, seen: int, seconds: float) -> None:
        """Return once the counter differs from ``seen``, or after ``seconds``."""
        with self._cond:
            if self._n == seen:
                self._cond.wait(seconds)


class _Mailbox:
    __slots__ = ("fps", "steps")

    def __init__(self):
        self.fps: list[tuple] = []                 # distinct fingerprints seen, usually one
        self.steps: dict[int, deque] = {}


class Transport:
    """Endpoint ``rank`` of a world of ``size`` ranks (see the module note for what an
    implementation provides); matching, abort and timeouts live here. ``bell``: how waiters
    sleep (default ``CondBell``); any object with ``value()``, ``ring()`` and ``wait(seen, s)``.
    """

    # The largest payload whose send completes without the peer receiving it (copied into a
    # ring slot, a mailbox or the OS): a schedule may write the buffer of such a send at its
    # next step (the executor waits for the completion), and two ranks that both do so never
    # wait for each other (hccl.algo.schedule.one_shot_all_reduce). 0: none is assumed to.
    solo_bytes = 0

    def __init__(self, rank: int, size: int, bell=None):
        if not (isinstance(size, int) and size >= 1 and isinstance(rank, int)
                and 0 <= rank < size):
            raise ValueError(f"transport rank {rank!r} must be in [0, {size!r}) with size >= 1")
        self.rank, self.size = rank, size
        self.liveness_interval = config.liveness_interval()   # s between two dead_peer checks
        self.bell = bell if bell is not None else CondBell()
        self._lock = threading.Lock()
        self._boxes: dict[tuple[int, int, int], _Mailbox] = {}
        self._aborted: dict[int, tuple[int, str]] = {}
        self._failed: tuple[int, str] | None = None   # (rank, reason): every comm_id is aborted
        self._closed = False
        # Public, read-only (the pairs' lock-free fast paths read them; only this class writes):
        # ``held``: the mailboxes, keyed by (peer, comm_id, seq): a key is there while a
        # message of that call is held; ``troubled``: False until the transport is closed, a
        # communicator aborted or the world failed (then ``stopped(comm_id)`` says for whom).
        self.held: Mapping[tuple[int, int, int], Any] = self._boxes
        self.troubled = False

    # -- the interface -------------------------------------------------------------------
    def pair(self, peer: int) -> "Pair":
        """The pair that reaches ``peer`` (this rank included: a loopback). ValueError for a
        rank this transport has no link to."""
        raise NotImplementedError

    def send(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
             payload: Any) -> SendHandle:
        """Send ``payload`` (a C-contiguous buffer) to ``peer`` without blocking.

        The caller must not modify ``payload`` until ``handle.wait()`` returns. Raises
        ``Aborted`` if ``comm_id`` is aborted, ``TransportClosed`` after ``close``.
        """
        self.check_peer(peer)
        return self.pair(peer).send(comm_id, seq, step, norm_fp(fp), as_bytes_view(payload))

    def recv(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
             timeout: float | None) -> memoryview:
        """Wait for the message tagged ``(comm_id, seq, step)`` from ``peer``; return its payload
        as a flat byte memoryview that the caller now owns (writable, valid while referenced).

        Raises ``FingerprintMismatch``, ``Aborted``, ``PeerTimeout`` (after ``timeout`` s; None
        waits forever) or ``TransportClosed``, see the module note for precedence.
        """
        out = []
        self.recv_into(peer, comm_id, seq, step, fp, timeout,
                       lambda view: out.append(memoryview(bytearray(view))))
        return out[0]

    def recv_into(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
                  timeout: float | None, consume: Callable[[memoryview], None]) -> None:
        """``recv``, then ``consume(payload)``: the payload is valid only during the call.

        Lets a pair hand out a view of the sender's memory instead of a copy (and tell the
        sender once ``consume`` returns); raises what ``recv`` raises, and what ``consume`` does.
        """
        self.check_peer(peer)
        self.pair(peer).recv_into(comm_id, seq, step, norm_fp(fp), timeout, consume)

    def pop(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint):
        """The payload filed for the tag ``(comm_id, seq, step)`` from ``peer``, popped, or None;
        ``FingerprintMismatch`` if ``peer`` used another fingerprint for ``(comm_id, seq)``
        (``fp`` normalized). Call with the lock held."""
        key = (peer, comm_id, seq)
        box = self._boxes.get(key)
        if box is None:
            return None
        for theirs in box.fps:
            if theirs != fp:
                raise FingerprintMismatch(peer, seq, theirs, fp)
        q = box.steps.get(step)
        if not q:
            return None
        payload = q.popleft()
        if not q:
            del box.steps[step]
            if not box.steps:
                del self._boxes[key]
        return payload

    def taker(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint):
        """``ready`` for ``wait_for``: ``pop`` of that tag (``fp`` normalized)."""
        return lambda: self.pop(peer, comm_id, seq, step, fp)

    def wait_for(self, ready: Callable[[], Any], comm_id: int, peer: int,
                 timeout: float | None, drain: Callable[[], Any] | None = None,
                 sleep: Callable[[int, float], None] | None = None) -> Any:
        """Wait until ``ready()`` (called with the lock held) returns a value other than None,
        and return that; ``TransportClosed`` / ``Aborted`` (``comm_id``) take precedence,
        ``PeerTimeout`` (naming ``peer``) after ``timeout`` seconds. ``drain()``, called before
        each look without the lock, files what arrived for this thread to find; a value other
        than None from it ends the wait with that value.

        Every NPUSIM_LIVENESS_INTERVAL seconds the wait asks ``dead_peer(peer)``. Once it names a
        reason, what ``peer`` sent before dying still counts for ``DEAD_PEER_GRACE`` seconds (it
        may be in flight); then ``comm_id`` is aborted on every rank with a reason naming ``peer``
        and this wait raises ``PeerGone``.

        ``sleep(seen, seconds)`` replaces the bell's wait where the awaited event does not ring
        the bell (a socket's zero-copy send completing inside libzmq): it returns at the event or
        after ``seconds``, and the loop looks again.
        """
        wait = None             # made at the first miss: most waits find their message at once
        bell, lock = self.bell, self._lock
        while True:
            seen = bell.value()
            if drain is not None:
                value = drain()
                if value is not None:
                    return value
            with lock:
                value = self._take(ready, comm_id)
            if value is not None:
                return value
            if wait is None:
                wait = PeerWait(self, peer, timeout)
            pause = wait.pause()
            if pause is None:
                raise self._peer_gone(comm_id, peer, wait.gone)
            (sleep or bell.wait)(seen, pause)

    def take_now(self, ready: Callable[[], Any]) -> Any:
        """``ready()`` (a ``taker``) under the lock, without waiting: None if nothing is there."""
        with self._lock:
            return ready()

    def expects(self, peer: int, comm_id: int, seq: int) -> bool:
        """Whether a message for ``(comm_id, seq)`` from ``peer``, handed to this thread now, is
        one its wait would take as it is: nothing is held for that call (so no other
        fingerprint was seen for it), nothing was closed or aborted. Lock-free: each read is
        atomic, and a message filed just after the look is found by the next one."""
        return not ((self.troubled and self.stopped(comm_id)) or (peer, comm_id, seq) in self.held)

    def stopped(self, comm_id: int) -> bool:
        """Whether a call of ``comm_id`` can no longer run: the transport was closed, ``comm_id``
        aborted or the world failed. Lock-free (each read is atomic); the pairs call it only
        when ``troubled`` is set."""
        return self._closed or self._failed is not None or comm_id in self._aborted

    def pop_now(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint):
        """``pop`` under the lock: the payload of the message tagged ``(comm_id, seq, step)``
        from ``peer`` if it is held (raising ``FingerprintMismatch`` as ``pop`` does), else
        None; never waits."""
        with self._lock:
            return self.pop(peer, comm_id, seq, step, fp)

    def _take(self, ready: Callable[[], Any], comm_id: int) -> Any:
        """``ready()``; if nothing is ready, raise when the transport was closed or ``comm_id``
        aborted. Call with the lock held.

        A message that arrived before the abort is still taken: a rank that was only slow to
        consume the last messages of a collective completes it (its peers have), so the abort
        fails the collectives that cannot finish, not the ones already delivered. That keeps
        the report's picture right: the slow rank goes on to its next call, which is recorded.
        """
        if self._closed:
            raise TransportClosed(f"rank {self.rank}: transport closed")
        value = ready()
        if value is not None:
            return value
        ab = self._aborted.get(comm_id) or self._failed
        if ab is not None:
            raise Aborted(*ab)
        return None

    def _peer_gone(self, comm_id: int, peer: int, gone: str) -> PeerGone:
        """Abort ``comm_id`` on every rank naming the dead ``peer``; the wait raises the result."""
        self.abort(comm_id, abortrec.record("dead", peer, f"rank {peer} is gone: {gone} (seen by "
                                            f"rank {self.rank})", seen_by=self.rank))
        return PeerGone(peer, gone)

    def dead_peer(self, peer: int) -> str | None:
        """Why rank ``peer`` can no longer send to this rank (its process exited, its connection
        broke), or None while it may. Every wait on ``peer`` calls it periodically: it must be
        quick and must not block. This base knows nothing: None."""
        return None

    def first_arrived(self, comm_id: int, want: dict[int, int], timeout: float,
                      drain: Callable[[], Any] | None = None) -> int:
        """The first peer ``p`` of ``want`` (peer -> seq) with a message for
        ``(comm_id, want[p])`` filed, without taking it: receive-from-any-source picks its
        sender with it. ``drain`` as for ``wait_for``. Raises ``TransportClosed`` / ``Aborted``,
        or ``PeerTimeout`` (peer -1: no one in particular) after ``timeout`` s."""
        boxes = self._boxes
        return self.wait_for(
            lambda: next((p for p, seq in want.items() if (p, comm_id, seq) in boxes), None),
            comm_id, -1, timeout, drain)

    def abort(self, comm_id: int, reason: str) -> None:
        """Abort ``comm_id``: wake local waiters with ``Aborted`` and tell every peer (once)."""
        if self._mark_aborted(comm_id, self.rank, reason):
            self.broadcast_abort(comm_id, reason)

    def fail(self, peer: int, reason: str) -> None:
        """Abort every comm_id of this world, here and (once) on every peer: rank ``peer`` sent a
        message this rank cannot use, so no collective between them can be trusted to finish."""
        if self._mark_failed(peer, reason):
            self.broadcast_abort(ALL_COMMS, reason)

    def aborted(self, comm_id: int) -> tuple[int, str] | None:
        """``(rank, reason)`` if ``comm_id`` (or the whole world) was aborted, else None."""
        with self._lock:
            return self._aborted.get(comm_id) or self._failed

    def forget(self, comm_id: int, seq: int | None = None, peer: int | None = None) -> int:
        """Drop messages still held for ``comm_id`` (only ``seq`` / only from ``peer`` if given).

        With ``seq=None`` and ``peer=None`` the comm's abort state is cleared too (comm destroyed).
        Returns the number of messages dropped.
        """
        dropped = 0
        with self._lock:
            for key in [k for k in self._boxes if k[1] == comm_id
                        and (seq is None or k[2] == seq) and (peer is None or k[0] == peer)]:
                dropped += sum(len(q) for q in self._boxes.pop(key).steps.values())
            if seq is None and peer is None:
                self._aborted.pop(comm_id, None)
                self.troubled = self._closed or bool(self._aborted) or self._failed is not None
        return dropped

    def pending(self) -> int:
        """Number of received messages not yet taken by ``recv`` (leak checks, statistics)."""
        with self._lock:
            return sum(len(q) for b in self._boxes.values() for q in b.steps.values())

    def close(self) -> None:
        """Release the transport; blocked and later calls raise ``TransportClosed``."""
        with self._lock:
            self._closed = True
            self.troubled = True
            self._boxes.clear()
        self.bell.ring()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- for implementations -------------------------------------------------------------
    def broadcast_abort(self, comm_id: int, reason: str) -> None:
        """Tell every peer that ``comm_id`` (``ALL_COMMS``: every comm) was aborted."""
        raise NotImplementedError

    def check_peer(self, peer: int) -> None:
        """ValueError unless ``peer`` is a rank of this world."""
        if not (isinstance(peer, int) and 0 <= peer < self.size):
            raise ValueError(f"rank {self.rank}: peer {peer!r} is not in [0, {self.size})")

    def check_open(self, comm_id: int) -> None:
        """What every pair's ``send`` checks first: ``close``, an abort of ``comm_id``."""
        # without the lock: each read is atomic, and an abort that lands just after the check
        # fails the receiver's wait anyway (messages to an aborted comm_id are dropped)
        if self._closed:
            raise TransportClosed(f"rank {self.rank}: transport closed")
        ab = self._aborted.get(comm_id) or self._failed
        if ab is not None:
            raise Aborted(*ab)

    def timeout_note(self) -> str:
        """Appended to a ``PeerTimeout``: what this transport saw that may explain the wait."""
        return ""

    def deliver(self, peer: int, comm_id: int, seq: int, step: int, fp: tuple,
                payload: Any) -> None:
        """File an inbound message from ``peer`` (``fp`` normalized) and wake waiters."""
        with self._lock:
            if self._closed or comm_id in self._aborted or self._failed:
                return
            key = (peer, comm_id, seq)
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = _Mailbox()
            if fp not in box.fps:
                box.fps.append(fp)
            q = box.steps.get(step)
            if q is None:
                q = box.steps[step] = deque()
            q.append(payload)
        self.bell.ring()

    def _mark_aborted(self, comm_id: int, peer: int, reason: str) -> bool:
        """Record the abort of ``comm_id``; False if it already was aborted."""
        with self._lock:
            if comm_id in self._aborted:
                return False
            self._aborted[comm_id] = (peer, reason)
            self.troubled = True
            for key in [k for k in self._boxes if k[1] == comm_id]:
                del self._boxes[key]
        self.bell.ring()
        return True

    def apply_abort(self, comm_id: int, peer: int, reason: str) -> None:
        """An abort that rank ``peer`` announced (``ALL_COMMS``: the whole world failed)."""
        if comm_id == ALL_COMMS:
            self._mark_failed(peer, reason)
        else:
            self._mark_aborted(comm_id, peer, reason)

    def _mark_failed(self, peer: int, reason: str) -> bool:
        """Record that the whole world failed (``fail``); False if it already had."""
        with self._lock:
            if self._failed is not None:
                return False
            self._failed = (peer, reason)
            self.troubled = True
            self._boxes.clear()
        self.bell.ring()
        return True


class PeerWait:
    """The deadline and the liveness rule of one wait on ``peer``, for every transport's wait loop.

    ``pause()`` gives the seconds to sleep before looking again, raises ``PeerTimeout`` once the
    deadline passed, and returns None once ``dead_peer`` named a reason (``gone``) and the grace
    for what the peer sent before dying ran out.
    """

    __slots__ = ("t", "peer", "t0", "deadline", "tick", "look", "gone", "gone_at")

    def __init__(self, t: "Transport", peer: int, timeout: float | None):
        self.t, self.peer = t, peer
        self.t0 = time.monotonic()
        self.deadline = math.inf if timeout is None else self.t0 + max(0.0, timeout)
        self.tick = t.liveness_interval
        self.look, self.gone, self.gone_at = self.t0 + self.tick, None, math.inf

    def pause(self) -> float | None:
        now = time.monotonic()
        if now >= self.deadline:
            raise PeerTimeout(self.peer, now - self.t0, self.t.timeout_note())
        if self.gone is None and now >= self.look:
            self.look = now + self.tick
            self.gone = self.t.dead_peer(self.peer)
            if self.gone is not None:
                self.gone_at = now + DEAD_PEER_GRACE
        if now >= self.gone_at:
            return None
        return min(self.deadline, self.look if self.gone is None else self.gone_at) - now


_NORMED = plan.FINGERPRINTS     # fingerprints seen, normalized: every message of a call carries the same


def norm_fp(fp: Any) -> Fingerprint:
    """``fp`` as a tuple of 5 Python ints; ValueError otherwise.

    A fingerprint equal to one seen before (a tuple subclass such as ``hccl.Fingerprint``, or
    numpy ints: equal values hash alike) is looked up, not rebuilt: every message pays this.
    """
    try:
        t = _NORMED.get(fp)
    except TypeError:                   # unhashable, e.g. a list
        t = None
    if t is not None:
        return t
    t = tuple(int(x) for x in fp)
    if len(t) != 5:
        raise ValueError(f"a fingerprint is 5 ints (op, count, dtype, redop, root), got {fp!r}")
    return _NORMED.put(t, t)


def as_bytes_view(payload: Any) -> memoryview:
    """A flat byte memoryview of a C-contiguous buffer (numpy arrays of any dtype, bfloat16 and
    zero-size included); raises ValueError for a non-contiguous one."""
    if isinstance(payload, np.ndarray):
        if not payload.flags.c_contiguous:
            raise ValueError("transport payloads must be C-contiguous buffers")
        return memoryview(payload.reshape(-1).view(np.uint8))
    mv = memoryview(payload)
    if not mv.c_contiguous:
        raise ValueError("transport payloads must be C-contiguous buffers")
    if mv.ndim == 1 and mv.format == "B":
        return mv
    if mv.nbytes == 0:
        return memoryview(b"")
    return mv.cast("B")
