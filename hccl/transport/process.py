"""Ranks as processes: one transport that routes each peer's traffic through a pair.

Design note (gloo's Device / Pair). ``ProcessTransport`` is the router: at ``connect`` it makes
one pair per peer (and a loopback pair for this rank), ``pair(peer)`` hands it out, and the
executor binds a collective's steps to those pairs once and calls them directly; the
transport's own ``send`` / ``recv_into`` go to the same pairs. The router picks a pair by rank
and never asks what kind it is: the pairs are siblings with the same calls (``base.Pair``:
``send``, ``try_recv``, ``recv_into``, ``drain``):

- ``zmq.SocketPair``: authenticated ZeroMQ over TCP (``zmq.SocketDevice`` owns the sockets and
  the receiver thread that files inbound messages); every peer has one, for data to other
  nodes, aborts, and what a ring cannot take;
- ``local.LocalPair``: a peer of this node (equal ``runtime.ipc.node_id``) that published a
  shared-memory segment, when shared memory is on (``shm=True``: NPUSIM_SHM, and
  ``shm.available()``: x86-64 Linux): its ring for small messages, notices for device memory
  read in place, the socket pair as overflow.

Matching, fingerprints, aborts, deadlines and the liveness rule are ``base.Transport``'s; every
wait is its one loop, sleeping on the channel's futex bell when there is a channel (a peer's
post rings it; so does everything this process files), else on ``base.CondBell``.

Connecting lazily (a rank that talks to few peers): ``pair`` is the only way to a peer, so a
``connect`` that records the addresses and makes each pair at its first ``pair(peer)`` (the
socket's DEALER, the ring's mapping) would change nothing above it; the connect barrier of
``hccl.init`` is what makes a first message usable (docs/transport.md), and it would then have
to cover the segment of a peer mapped late (the segment names are unlinked after it).

Liveness (``dead_peer``): a peer of this node is dead once its process exits (its identity from
init, ``watch_processes``); any peer is gone once its socket pair, connected once, disconnects.

Segments: created in ``__init__`` (``segment``: the name to publish), mapped in ``connect``, and
unlinked by ``unlink_segment`` once every rank has connected (then no name is left in /dev/shm
even if a rank is killed later; before that, npurun's janitor removes ``npusim-<job>-*``).
Every rank knows which peers share its node before its communicator is returned (``hccl.init``
waits until every rank has called ``connect``), so a correct peer never posts too early.
"""
from __future__ import annotations

import logging
from typing import Any

from hccl import config
from hccl.transport import shm
from hccl.transport.base import LoopbackPair, Transport
from hccl.transport.liveness import PeerProcess
from hccl.transport.local import LocalPair
from hccl.transport.zmq import MAX_MESSAGE, SocketDevice
from runtime import ipc, sched

log = logging.getLogger("hccl.transport")

SPIN_US = 200.0           # a waiter's spin when the node's ranks fit its cores


class ProcessTransport(Transport):
    """Endpoint ``rank`` of ``size`` processes; binds at construction (``.address``), then
    ``connect`` makes the pairs. ``shm``: reach the peers of this node through shared-memory
    rings (``slots`` x ``slot_bytes`` each, defaults from NPUSIM_SHM_SLOTS / _SLOT_BYTES; the
    segment names carry ``job``). ``max_message`` bounds one payload (``send`` raises
    ValueError above it); the executor must slice below it.
    """

    def __init__(self, rank: int, size: int, secret: bytes, bind_host: str = "127.0.0.1", *,
                 shm: bool = False, job: str = "local", max_message: int = MAX_MESSAGE,
                 slots: int | None = None, slot_bytes: int | None = None):
        channel = None
        if shm:
            channel = _channel(rank, size, job, slots, slot_bytes)
        super().__init__(rank, size, bell=channel)
        self.channel = channel
        self.segment = channel.name if channel is not None else ""
        self.max_message = int(max_message)
        self.node = ipc.node_id()
        self.peer_memory = ipc.PeerMemories()
        self.ring_sends = self.shm_sends = self.shm_recvs = 0
        self._pairs: dict[int, Any] = {rank: LoopbackPair(self)}
        self._local: set[int] = set()                  # peers reached through the rings
        self._idents: dict[int, str] = {}                # peers' process identities
        self._procs: dict[int, PeerProcess] = {}        # peers of this node: their processes
        self._broken: dict[int, str] = {}               # peers whose connection broke: why
        try:
            self.sockets = SocketDevice(self, secret, bind_host, self.max_message)
        except BaseException:
            if channel is not None:
                channel.close()
            raise
        self.address = self.sockets.address
        self.drops = self.sockets.drops

    # -- set-up ----------------------------------------------------------------------------
    def watch_processes(self, idents: dict[int, str]) -> None:
        """Remember the peers' process identities (``{rank: liveness.identity()}``); ``connect``
        watches those of the peers that share this node. Call it before ``connect``."""
        self._idents.update(idents)

    def connect(self, addresses: dict[int, str], nodes: dict[int, str] | None = None,
                segments: dict[int, str] | None = None) -> None:
        """Make a pair for every rank in ``addresses`` (``{rank: "tcp://host:port"}``; this rank
        and ranks already paired are skipped). ``nodes`` (``{rank: node id}``) names the ranks
        of this node; those of them in ``segments`` (``{rank: segment name}``, as published)
        are reached through shared memory when it is on. Never blocks.

        Links to other nodes (or of unknown node) carry heartbeats, so a cut cable or a frozen
        host breaks them after NPUSIM_HEARTBEAT_TIMEOUT; links within the node do not, so a
        stopped (SIGSTOP) peer of this node is only a timeout (HCCL_EXEC_TIMEOUT)."""
        nodes, segments = nodes or {}, segments or {}
        for peer in addresses:
            self.check_peer(peer)
        here = {p for p, n in nodes.items() if n == self.node and p != self.rank}
        for p in here & set(self._idents):
            self._procs[p] = PeerProcess(self._idents[p])
        self.sockets.connect(addresses, set(addresses) - here)
        local = [p for p in here if self.channel is not None and segments.get(p)]
        min_notice = config.shm_min_bytes()
        for p in local:
            if p not in self._local:
                self.channel.attach(p, segments[p])
        self.sockets.acks_from = self.sockets.acks_from | frozenset(local)
        for p, pair in self.sockets.pairs.items():
            if p in local:
                if p not in self._local:
                    self._pairs[p] = LocalPair(self, self.channel, p, pair, min_notice)
                    self._local.add(p)
            else:
                self._pairs.setdefault(p, pair)
        crowded = len(self._local) + 1 > sched.cores()
        if self.channel is not None:
            spin = config.shm_spin_us()
            if spin is None:  # more ranks than cores here: a spinning waiter starves its peer
                # else spin longer than the usual skew between two ranks (100-300 us of Python
                # per call): a futex sleep costs the sleeper a 50-100 us wake-up (1 KiB, 2
                # ranks, median: 460-540 us with 20 us of spin, 325-405 us with 100-300 us)
                spin = 0.0 if crowded else SPIN_US
            self.channel.spin = spin * 1e-6

    @property
    def local_peers(self) -> list[int]:
        """The peers reached through shared memory."""
        return sorted(self._local)

    def unlink_segment(self) -> None:
        """Remove this rank's segment name: every peer has mapped it (call after the connect
        barrier); mappings stay valid. Nothing to do without shared memory."""
        if self.channel is not None:
            self.channel.unlink()

    # -- data path -------------------------------------------------------------------------
    def pair(self, peer: int):
        pair = self._pairs.get(peer)
        if pair is None:
            self.check_peer(peer)
            raise ValueError(f"rank {self.rank}: no link to rank {peer}; call connect() with its "
                             f"address first")
        return pair

    def first_arrived(self, comm_id: int, want: dict[int, int], timeout: float,
                      drain=None) -> int:
        """The base's, draining the pairs of the peers in ``want`` into the mailboxes first (a
        ring is otherwise drained only by a wait on its peer)."""
        pairs = [self.pair(p) for p in want]

        def drain_pairs():
            for pair in pairs:
                pair.drain()
        return Transport.first_arrived(self, comm_id, want, timeout, drain_pairs)

    # -- what ends waits -------------------------------------------------------------------
    def dead_peer(self, peer: int) -> str | None:
        proc = self._procs.get(peer)   # an exited process is the more precise reason
        return (proc.gone() if proc is not None else None) or self._broken.get(peer)

    def link_broken(self, peer: int) -> None:
        """The socket device saw ``peer``'s connection, up once, go down."""
        if peer not in self._broken:
            self._broken[peer] = "its connection to this rank broke (the peer closed it, "\
                "exited, or stopped answering heartbeats)"
            log.warning("rank %d: the connection to rank %d broke", self.rank, peer)
        self.bell.ring()

    def timeout_note(self) -> str:
        n = self.drops.dropped
        return (f"; meanwhile this rank dropped {n} unauthenticated message(s), see the "
                "hccl.transport warnings" if n else "")

    def broadcast_abort(self, comm_id: int, reason: str) -> None:
        self.sockets.broadcast_abort(comm_id, reason)

    # -- teardown --------------------------------------------------------------------------
    def close_now(self) -> None:
        """Refuse every later call and wake the waiters, leaving the sockets alone (the
        receiver thread calls this when it fails)."""
        Transport.close(self)

    def close(self, linger: float = 1.0) -> None:
        """Close the pairs and stop the threads (idempotent); waiters see the close at once.
        Messages still queued (an ABORT just sent) get up to ``linger`` seconds to leave."""
        Transport.close(self)
        self.sockets.close(linger)
        self.peer_memory.close()
        if self.channel is not None:
            self.channel.close()


def _channel(rank: int, size: int, job: str, slots: int | None, slot_bytes: int | None):
    return shm.Channel(rank, size, job, slots=slots or config.shm_slots(),
                       slot_bytes=slot_bytes or config.shm_slot_bytes())
