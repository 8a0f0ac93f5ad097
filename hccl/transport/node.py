"""Ranks as processes, the node's ranks over shared-memory rings, the others over ZeroMQ.

Design note. ``NodeTransport`` is a ``ZmqTransport`` (rendezvous address, links to every rank,
aborts, the receiver thread for other nodes) plus a ``shm.Channel``: every peer that shares this
rank's node and published a segment is *local*, and messages to it go through the channel:

- a payload that fits a slot is copied into the peer's ring (DATA);
- a larger one (or one of at least NPUSIM_SHM_MIN_BYTES) that lies in the sender's device
  memory is announced (SHM_DATA: offset, length,
  notice id, memory handle) and read in place by the receiver, which answers SHM_ACK through the
  channel; the send's handle completes on it, exactly like the socket path's notice;
- anything else (a larger host or scratch buffer, a full ring) goes through the socket as before,
  so a send never blocks. Matching is by exact tag, so the two paths may interleave freely.

There is no receiver thread on the channel: the thread that waits (``_wait_until``, which serves
``recv``, ``recv_into`` and the acknowledgement waits) drains the peer's ring into the mailboxes
of ``base.Transport`` itself, checks close / abort / its message, then spins briefly and sleeps on
the channel's futex. Everything else that can end a wait rings the same bell: a message filed by
the socket receiver, an acknowledgement, an abort (local or announced by a peer), ``fail``,
``close``. It follows the liveness rule of ``base.Transport`` (``_dead_peer`` every
NPUSIM_LIVENESS_INTERVAL seconds, then the grace, then an abort naming the dead peer). A ring message this rank cannot use (unknown kind, sizes that contradict
themselves, a malformed notice) is a member's protocol error: ``fail`` aborts every communicator
on every rank, naming the sender.

Segments: created in ``__init__``, published by ``hccl.init`` through the authenticated store,
mapped in ``connect``, and unlinked by ``unlink_segment`` once every rank has connected (then no
name is left in /dev/shm even if a rank is killed later; before that, npurun's janitor removes
``npusim-<job>-*``).
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any

import numpy as np

from hccl import config, wire
from hccl.transport import shm
from hccl.transport.base import (DONE, Fingerprint, PeerTimeout, PeerWait, SendHandle, Transport,
                                 as_bytes_view, norm_fp)
from hccl.transport.zmq import MAX_MESSAGE, ZmqTransport, _AckHandle, _ShmRef
from runtime import ipc

log = logging.getLogger("hccl.transport")

SPIN_US = 200.0           # a waiter's spin when the node's ranks fit its cores
_NOTICE_BASE = 1 << 62    # channel notice ids, never equal to a socket link's serial
_TAKEN = object()         # _wait_until: the awaited message was consumed in its slot
_DATA, _NOTICE, _ACK = int(wire.Kind.DATA), int(wire.Kind.SHM_DATA), int(wire.Kind.SHM_ACK)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def batch_threads() -> int:
    """Move every thread of this process that is in the default class (SCHED_OTHER) to
    SCHED_BATCH, where a thread that wakes another does not lose its core to it at once;
    threads started later inherit the class. Returns how many threads moved (0 where Linux's
    classes are missing). Real-time or idle threads are left alone; no privilege is needed."""
    if not hasattr(os, "SCHED_BATCH"):
        return 0
    moved = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(tid)) == os.SCHED_OTHER:
                os.sched_setscheduler(int(tid), os.SCHED_BATCH, os.sched_param(0))
                moved += 1
        except OSError:       # the thread just ended, or a sandbox forbids it: a speed matter
            pass
    return moved


class NodeTransport(ZmqTransport):
    """A ``ZmqTransport`` whose peers on this node are reached through shared-memory rings.

    ``segment`` is the name to publish; ``connect(addresses, nodes, segments)`` maps the local
    peers' segments; ``unlink_segment()`` once every rank has connected.
    """

    def __init__(self, rank: int, size: int, secret: bytes, bind_host: str = "127.0.0.1", *,
                 job: str = "local", max_message: int = MAX_MESSAGE, slots: int | None = None,
                 slot_bytes: int | None = None):
        super().__init__(rank, size, secret, bind_host, max_message=max_message)
        try:
            self.channel = shm.Channel(rank, size, job,
                                       slots=slots or config.shm_slots(),
                                       slot_bytes=slot_bytes or config.shm_slot_bytes())
        except BaseException:
            ZmqTransport.close(self)
            raise
        self.segment = self.channel.name
        self._local: frozenset = frozenset()
        self._handlers: dict = {}
        self._ids = itertools.count(_NOTICE_BASE)
        self.ring_sends = 0

    # -- set-up ----------------------------------------------------------------------------
    def connect(self, addresses: dict[int, str], nodes: dict[int, str] | None = None,
                segments: dict[int, str] | None = None) -> None:
        """``ZmqTransport.connect``, then map the segment of every peer of this node that
        published one (``segments``: ``{rank: name}``, as read from the store)."""
        super().connect(addresses, nodes)
        local = set(self._local)
        for peer, name in (segments or {}).items():
            if name and nodes and nodes.get(peer) == self.node and peer != self.rank \
                    and peer not in local:
                self.channel.attach(peer, name)
                self._handlers[peer] = self._handler(peer)
                local.add(peer)
        self._local = frozenset(local)
        crowded = len(local) + 1 > _cores()
        spin = config.shm_spin_us()
        if spin is None:      # more ranks than cores here: a spinning waiter starves its peer
            # else spin longer than the usual skew between two ranks (100-300 us of Python per
            # call): a futex sleep costs the sleeper a 50-100 us wake-up (1 KiB, 2 ranks, median:
            # 460-540 us with 20 us of spin, 325-405 us with 100-300 us, same minute)
            spin = 0.0 if crowded else SPIN_US
        self.channel.spin = spin * 1e-6
        batch = config.sched_batch()
        if batch or (batch is None and crowded and local):
            # more ranks than cores: in the default class the peer a send wakes takes the
            # sender's core at once, before the sender has posted its other messages and
            # reached its own wait (1 KiB all_reduce, 4 ranks on 2 cores: ~2 involuntary
            # switches per call -> ~0.8, median 627 -> 550 us over 10 alternating jobs)
            moved = batch_threads()
            log.debug("rank %d: %d ranks on %d cores: %d thread(s) moved to SCHED_BATCH",
                      self.rank, len(local) + 1, _cores(), moved)

    def unlink_segment(self) -> None:
        """Remove this rank's segment name: every peer has mapped it (call after the connect
        barrier); mappings stay valid."""
        self.channel.unlink()

    # -- sending ---------------------------------------------------------------------------
    def send(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
             payload: Any) -> SendHandle:
        if peer not in self._local:
            return super().send(peer, comm_id, seq, step, fp, payload)
        self._check_send(peer, comm_id)
        fp = norm_fp(fp)
        mv = as_bytes_view(payload)
        ch = self.channel
        n = mv.nbytes
        where = None
        if (n > ch.capacity or n >= (self._shm_min or n + 1)) and n <= self.max_message:
            where = ipc.export(np.frombuffer(mv, np.uint8))
        if where is None and n <= ch.capacity:
            if ch.post(peer, _DATA, comm_id, seq, step, fp, 0, mv):
                self.ring_sends += 1
                return DONE
        elif where is not None:
            nid = next(self._ids)
            ack = _AckHandle(self, peer, comm_id)
            with self._cond:
                self._acks[(peer, nid)] = ack
            text = f"{n} {nid} {where[0]}".encode()
            if ch.post(peer, _NOTICE, comm_id, seq, step, fp, where[1], text):
                self.ring_sends += 1
                self.shm_sends += 1
                return ack
            with self._cond:
                self._acks.pop((peer, nid), None)
        return super().send(peer, comm_id, seq, step, fp, mv)

    def _send_ack(self, peer: int, serial: int) -> None:
        if peer not in self._local or not self.channel.post(
                peer, _ACK, 0, 0, 0, (0, 0, 0, 0, 0), serial, b""):
            super()._send_ack(peer, serial)

    # -- receiving -------------------------------------------------------------------------
    def _handler(self, peer: int):
        def handle(kind, n, comm_id, seq, step, fp, value, view):
            if n > len(view):
                self._ring_error(peer, kind, comm_id, seq, step, f"a {n}-byte payload in a "
                                 f"{len(view)}-byte slot")
            elif kind == _DATA:
                self._deliver(peer, comm_id, seq, step, fp, memoryview(bytearray(view)))
            elif kind == _NOTICE:
                parts = bytes(view).decode("ascii", "replace").split(" ", 2)
                nb, nid, handle_ = parts if len(parts) == 3 else ("", "", "")
                if not nb.isdigit() or not nid.isdigit() or not handle_ or value < 0 \
                        or int(nb) > self.max_message:
                    self._ring_error(peer, kind, comm_id, seq, step,
                                     f"malformed notice {bytes(view)[:80]!r}")
                else:
                    self._deliver(peer, comm_id, seq, step, fp,
                                  _ShmRef(handle_, value, int(nb), int(nid)))
            elif kind == _ACK:
                self._acked(peer, value)
            else:
                self._ring_error(peer, kind, comm_id, seq, step, f"unknown kind {kind}")
        return handle

    def _ring_error(self, peer, kind, comm_id, seq, step, why) -> None:
        msg = (f"protocol error: rank {self.rank} cannot use a message (kind {kind}) from rank "
               f"{peer} in shared memory (comm {comm_id:#x}, seq {seq}, step {step}): {why}")
        log.error("rank %d: %s; aborting every communicator", self.rank, msg)
        self.fail(peer, msg)

    def recv_into(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
                  timeout: float | None, consume) -> None:
        handle = self._handlers.get(peer)
        if handle is None:
            return super().recv_into(peer, comm_id, seq, step, fp, timeout, consume)
        fp = norm_fp(fp)
        key = (peer, comm_id, seq)
        took = []

        def direct(kind, n, c, s, st, f, value, view):
            """The awaited message goes from its slot straight into ``consume``, the rest (and
            this one when anything else is held for the same call) to the mailboxes.

            ``consume`` then runs under this peer's ring lock: it must not wait (the executor
            settles its pending sends before a Recv, so its consumer never does)."""
            if not took and st == step and s == seq and c == comm_id and kind == _DATA \
                    and f == fp and n <= len(view) and not self._closed \
                    and self._failed is None and comm_id not in self._aborted:
                box = self._boxes.get(key)
                if box is None or not (box.steps.get(step) or any(x != fp for x in box.fps)):
                    took.append(True)
                    consume(view[:n])
                    return
            handle(kind, n, c, s, st, f, value, view)

        data = self._wait_until(self._taker(peer, comm_id, seq, step, fp), comm_id, peer,
                                timeout, direct, took)
        if data is _TAKEN:
            return
        if type(data) is not _ShmRef:
            consume(data)
        else:
            self._consume_shm(peer, data, consume)

    def _wait_until(self, ready, comm_id: int, peer: int, timeout: float | None,
                    handle=None, took=()) -> Any:
        """The base's wait, the waiting thread draining ``peer``'s ring itself (through
        ``handle``, which may consume the awaited message in place and say so in ``took``:
        then the result is ``_TAKEN``)."""
        if peer not in self._handlers:
            return super()._wait_until(ready, comm_id, peer, timeout)
        handle = handle or self._handlers[peer]
        ch = self.channel
        wait = PeerWait(self, peer, timeout)          # the deadline and liveness rule of base
        while True:
            seen = ch.bell()
            ch.poll(peer, handle)
            if took:
                return _TAKEN
            with self._cond:
                value = self._take(ready, comm_id)
            if value is not None:
                return value
            pause = wait.pause()
            if pause is None:
                raise self._peer_gone(comm_id, peer, wait.gone)
            ch.wait(seen, pause)

    def first_arrived(self, comm_id: int, want: dict[int, int], timeout: float) -> int:
        """The base's, draining the rings of the peers in ``want`` into the mailboxes (a ring
        is otherwise drained only by a wait on its peer)."""
        ready, ch = self._arrival(comm_id, want), self.channel
        t0 = time.monotonic()
        while True:
            seen = ch.bell()
            for peer in want:
                handle = self._handlers.get(peer)
                if handle is not None:
                    ch.poll(peer, handle)
            with self._cond:
                value = self._take(ready, comm_id)
            if value is not None:
                return value
            left = t0 + timeout - time.monotonic()
            if left <= 0:
                raise PeerTimeout(-1, time.monotonic() - t0, self._timeout_note())
            ch.wait(seen, left)

    # -- everything that can end a wait rings the bell ------------------------------------
    def _deliver(self, peer, comm_id, seq, step, fp, payload) -> None:
        super()._deliver(peer, comm_id, seq, step, fp, payload)
        self.channel.poke()

    def _acked(self, peer: int, serial: int) -> None:
        super()._acked(peer, serial)
        self.channel.poke()

    def _mark_aborted(self, comm_id: int, peer: int, reason: str) -> bool:
        done = super()._mark_aborted(comm_id, peer, reason)
        self.channel.poke()
        return done

    def _mark_failed(self, peer: int, reason: str) -> bool:
        done = super()._mark_failed(peer, reason)
        self.channel.poke()
        return done

    def close(self, linger: float = 1.0) -> None:
        Transport.close(self)          # waiters see the close at once
        self.channel.poke()
        super().close(linger)
        self.channel.close()
