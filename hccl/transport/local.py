"""A peer of this node: its messages through the shared-memory rings (``shm.Channel``).

Design note. A ``LocalPair`` is one peer's sibling of ``zmq.SocketPair`` behind the transport's
router (``process.ProcessTransport``), and the only shared-memory data path:

- a payload that fits a slot (and is not announced, below) is copied into the peer's ring
  (DATA);
- a larger one, or one of at least NPUSIM_SHM_MIN_BYTES, that lies in the sender's device
  memory is announced through the ring (SHM_DATA: offset, length, memory handle) and read in
  place by the receiver, which answers SHM_ACK through the ring. The acknowledgement is an
  ordinary message of the mailbox, tagged like the notice with ``zmq.ACK_STEP`` added to its
  step: the send's handle waits for it like a receive, so an abort, a close, a fingerprint
  mismatch or a dead peer ends that wait by the same rules (``base.Transport``);
- a payload that finds the ring full waits up to ``ROOM_WAIT`` for the receiver to free a
  slot (``shm.Channel.wait_room``), then goes through the socket. A rank that runs ahead of its
  peer by a full ring (a Broadcast root issuing call after call) so waits for it, as an MPI
  sender past the eager limit does, instead of paying a socket send for each message (a 64 KiB
  Broadcast root's calls that took the socket ran 180-260 us, the others ~30 us); the bound keeps two ranks whose rings are full
  both ways from waiting on each other for more than ``ROOM_WAIT``;
- anything else (a larger host or scratch buffer, a ring still full after ``ROOM_WAIT``) goes
  through the peer's ``SocketPair``. Matching is by exact tag, so the two may interleave.
  An acknowledgement that finds the ring full goes through the socket at once.

A step a collective call repeats is prepared once (``sender`` / ``receiver``, the pair's
siblings of ``send`` / ``try_recv``): a DATA payload through the ring's ``shm.RingWriter``, the
awaited DATA message through its ``shm.RingReader``; anything else (a closed or aborted
transport, a full ring, a message held in a mailbox or another one first) goes to the plain
calls, which decide as ever.

There is no receiver thread on the ring: the thread that waits for this peer drains its ring
into the mailboxes itself (``recv_into``: the awaited message goes from its slot straight into
the consumer when nothing else is held for its call). A ring message this rank cannot use
(unknown kind, sizes that contradict themselves, a malformed notice) is a member's protocol
error: ``fail`` aborts every communicator on every rank, naming the sender.
"""
from __future__ import annotations

import functools
import logging
import time

import numpy as np

from hccl import wire
from hccl.transport.base import DONE, Pair, PeerGone, SendHandle, TransportError
from hccl.transport.shm import SLICE
from hccl.transport.zmq import ACK_STEP, SocketPair
from runtime.memory import ipc
from runtime.errors import MemoryAccessError

log = logging.getLogger("hccl.transport")

_DATA, _NOTICE, _ACK = int(wire.Kind.DATA), int(wire.Kind.SHM_DATA), int(wire.Kind.SHM_ACK)
_TAKEN = object()          # recv_into's drain: the awaited message was consumed in its slot
_perf = time.perf_counter
ROOM_WAIT = 1e-3           # s a send waits for a free slot of a full ring before the socket


class ShmError(TransportError):
    """A payload announced in shared memory could not be read (the message says why)."""


class _Notice:
    """An inbound SHM_DATA held in a mailbox: where the payload is."""

    __slots__ = ("handle", "offset", "nbytes")

    def __init__(self, handle: str, offset: int, nbytes: int):
        self.handle, self.offset, self.nbytes = handle, offset, nbytes


class _AckHandle(SendHandle):
    """A SHM_DATA send: complete once the peer's acknowledgement arrived."""

    __slots__ = ("_pair", "_take", "_comm", "acked")

    def __init__(self, pair: "LocalPair", comm_id: int, seq: int, step: int, fp):
        t = pair.t
        self._pair, self._comm, self.acked = pair, comm_id, False
        self._take = t.taker(pair.peer, comm_id, seq, step | ACK_STEP, fp)

    def wait(self, timeout: float | None = None) -> None:
        if not self.acked:
            p = self._pair
            p.t.wait_for(self._take, self._comm, p.peer, timeout, p.drain)
            self.acked = True

    def done(self) -> bool:
        # no drain here: the ring's messages are left for the wait that can take them in place
        if not self.acked:
            try:
                self.acked = self._pair.t.take_now(self._take) is not None
            except TransportError:
                return False           # wait() raises it
        return self.acked


class LocalPair(Pair):
    """Rank ``peer`` of this node, reached through ``channel``; ``overflow`` (its socket pair)
    takes what the ring cannot. ``t`` is the transport whose mailboxes it fills."""

    __slots__ = ("t", "channel", "peer", "overflow", "min_notice", "capacity", "_handle")

    def __init__(self, t, channel, peer: int, overflow: SocketPair, min_notice: int):
        self.t, self.channel, self.peer, self.overflow = t, channel, peer, overflow
        self.min_notice = min_notice
        self.capacity = channel.capacity
        self._handle = self._handler()

    # -- sending ---------------------------------------------------------------------------
    def send(self, comm_id: int, seq: int, step: int, fp, mv: memoryview) -> SendHandle:
        ch, n, t = self.channel, mv.nbytes, self.t
        if t.troubled:                      # the usual case skips the call
            t.check_open(comm_id)
        where = None
        if n > self.capacity or n >= self.min_notice:
            where = ipc.export(np.frombuffer(mv, np.uint8))
        if where is None:
            if n <= self.capacity and (
                    ch.post(self.peer, _DATA, comm_id, seq, step, fp, 0, mv) or (
                    ch.wait_room(self.peer, _perf() + ROOM_WAIT) and
                    ch.post(self.peer, _DATA, comm_id, seq, step, fp, 0, mv))):
                t.ring_sends += 1
                return DONE
        elif ch.post(self.peer, _NOTICE, comm_id, seq, step, fp, where[1],
                     f"{n} {where[0]}".encode()):
            t.ring_sends += 1
            t.shm_sends += 1
            return _AckHandle(self, comm_id, seq, step, fp)
        return self.overflow.send(comm_id, seq, step, fp, mv)

    def sender(self, comm_id: int, step: int, fp, mv: memoryview):
        """``send`` of ``mv`` prepared for repeated calls (``base.Pair.sender``): a payload
        that goes into the ring as DATA is written by a ``shm.RingWriter``."""
        n = mv.nbytes
        if n > self.capacity or n >= self.min_notice:
            return None
        post = self.channel.writer(self.peer, _DATA, comm_id, step, 0, fp, mv)
        if post is None:
            return None
        return _Sender(self, post.post, comm_id, step, fp, mv).send

    def receiver(self, comm_id: int, step: int, fp, nbytes: int, consume, direct):
        """``try_recv`` prepared for repeated calls (``base.Pair.receiver``): the awaited
        DATA message is taken by a ``shm.RingReader``, which hands ``direct`` its slot as a
        typed array."""
        if direct is None:
            return None
        take = self.channel.reader(self.peer, _DATA, comm_id, step, fp, nbytes, direct[1],
                                   direct[0])
        if take is None:
            return None
        return functools.partial(_look, self.t, self.peer, self.channel, comm_id, take.take)

    def _ack(self, comm_id: int, seq: int, step: int, fp) -> None:
        if not self.channel.post(self.peer, _ACK, comm_id, seq, step | ACK_STEP, fp, 0, b""):
            self.overflow.post(wire.Kind.SHM_ACK, comm_id=comm_id, seq=seq,
                               step=step | ACK_STEP, fp=fp)

    # -- receiving -------------------------------------------------------------------------
    def drain(self) -> None:
        """File every message waiting in this peer's ring (None: ``wait_for``'s drain)."""
        self.channel.poll(self.peer, self._handle)

    def try_recv(self, comm_id: int, seq: int, step: int, fp, consume,
                 spin: float = 0.0) -> bool:
        """The awaited message straight from its slot into ``consume`` when it is the first in
        the ring and nothing is held for its call (``base.Transport.expects``); else False
        (``recv_into`` decides by the mailbox rules; see ``base.Pair``). With ``spin`` it
        watches the ring that long for a message (``shm.Channel.watch``: the channel's own
        spin caps it: hccl.transport.process), never sleeping in the kernel.

        ``consume`` then runs under this peer's ring lock: it must not wait (the executor
        settles its pending sends before a Recv, so its consumer never does)."""
        ch, peer = self.channel, self.peer
        return _look(self.t, peer, ch, comm_id, functools.partial(ch.take, peer, _DATA, comm_id),
                     seq, spin, step, fp, consume)

    def recv_into(self, comm_id: int, seq: int, step: int, fp, timeout: float | None,
                  consume) -> None:
        """Wait for the message tagged ``(comm_id, seq, step)``, then ``consume`` its payload
        (a view valid during the call); see ``base.Transport.recv_into``."""
        t, ch, peer = self.t, self.channel, self.peer
        # The fast path: the awaited message straight from its slot, waiting on the bell until
        # it comes, for at most SLICE. Whatever else happens (another message first in the
        # ring, one held in a mailbox, an abort, a close: each rings the bell) leaves it for
        # the full wait below, which files, raises and watches the peer's liveness.
        end = None
        while True:
            seen = ch.value()               # before the look: a post after it rings the bell
            if not t.expects(peer, comm_id, seq):
                break
            got = ch.take(peer, _DATA, comm_id, seq, step, fp, consume)
            if got:
                return
            if got is not None:             # the ring holds another message first
                break
            now = _perf()
            if end is None:
                end = now + (SLICE if timeout is None else min(timeout, SLICE))
            elif now >= end:
                break
            ch.wait(seen, end - now)
        handle, took = self._handle, []

        def direct(kind, n, c, s, st, f, value, view):
            """The awaited message goes from its slot straight into ``consume``, the rest (and
            this one when anything else is held for the same call) to the mailboxes (``consume``
            runs under the ring's lock, as in ``try_recv``)."""
            if not took and st == step and s == seq and c == comm_id and kind == _DATA \
                    and f == fp and n <= len(view) and t.expects(peer, c, s):
                took.append(True)
                consume(view[:n])
                return
            handle(kind, n, c, s, st, f, value, view)

        def drain():
            self.channel.poll(peer, direct)
            return _TAKEN if took else None

        data = t.wait_for(lambda: t.pop(peer, comm_id, seq, step, fp), comm_id, peer, timeout,
                          drain)
        if data is _TAKEN:
            return
        if type(data) is not _Notice:
            consume(data)
            return
        try:
            try:
                view = t.peer_memory.view(data.handle, data.offset, data.nbytes)
            except ipc.PeerGoneError as e:
                raise PeerGone(peer, str(e)) from None
            except MemoryAccessError as e:
                raise ShmError(f"rank {t.rank}: cannot read the payload rank {peer} put in "
                               f"shared memory: {e}") from None
            t.shm_recvs += 1
            try:
                consume(view)
            finally:
                view.release()
        finally:
            self._ack(comm_id, seq, step, fp)

    def _handler(self):
        t, peer = self.t, self.peer

        def handle(kind, n, comm_id, seq, step, fp, value, view):
            if n > len(view):
                self._error(kind, comm_id, seq, step, f"a {n}-byte payload in a "
                            f"{len(view)}-byte slot")
            elif kind == _DATA:
                t.deliver(peer, comm_id, seq, step, fp, memoryview(bytearray(view)))
            elif kind == _NOTICE:
                nb, _, where = bytes(view).decode("ascii", "replace").partition(" ")
                if not nb.isdigit() or not where or value < 0 or int(nb) > t.max_message:
                    self._error(kind, comm_id, seq, step, f"malformed notice {bytes(view)[:80]!r}")
                else:
                    t.deliver(peer, comm_id, seq, step, fp, _Notice(where, value, int(nb)))
            elif kind == _ACK and step & ACK_STEP:
                t.deliver(peer, comm_id, seq, step, fp, memoryview(b""))
            else:
                self._error(kind, comm_id, seq, step, f"unknown kind {kind}")
        return handle

    def _error(self, kind, comm_id, seq, step, why) -> None:
        t = self.t
        msg = (f"protocol error: rank {t.rank} cannot use a message (kind {kind}) from rank "
               f"{self.peer} in shared memory (comm {comm_id:#x}, seq {seq}, step {step}): {why}")
        log.error("rank %d: %s; aborting every communicator", t.rank, msg)
        t.fail(self.peer, msg)


class _Sender:
    """A prepared ``LocalPair.send`` (``LocalPair.sender``): the ring's writer while the
    transport is open and the ring has room, else the pair's own send (which raises, waits for
    room, or takes the socket)."""

    __slots__ = ("pair", "t", "post", "args", "mv")

    def __init__(self, pair: LocalPair, post, comm_id: int, step: int, fp, mv: memoryview):
        self.pair, self.t, self.post, self.mv = pair, pair.t, post, mv
        self.args = (comm_id, step, fp)

    def send(self, seq: int) -> SendHandle:
        t = self.t
        if not t.troubled and self.post(seq):
            t.ring_sends += 1
            return DONE
        comm_id, step, fp = self.args
        return self.pair.send(comm_id, seq, step, fp, self.mv)


def _look(t, peer: int, ch, comm_id: int, take, seq: int, spin: float = 0.0, *rest) -> bool:
    """``LocalPair.try_recv``'s rules, with ``take(seq, *rest)`` taking the message from the
    ring (the channel's ``take``, or a prepared ``shm.RingReader``'s: ``LocalPair.receiver``
    binds every argument before ``seq``)."""
    # t.expects(peer, comm_id, seq), inline: every receive of a small call
    while not ((t.troubled and t.stopped(comm_id)) or (peer, comm_id, seq) in t.held):
        got = take(seq, *rest)
        if got is not None:
            return got
        if spin > ch.spin:
            spin = ch.spin
        if spin <= 0 or not ch.watch(peer, _perf() + spin):
            return False
        spin = 0.0                          # one message came: look at it, then give up
    return False
