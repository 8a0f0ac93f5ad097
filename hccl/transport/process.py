"""Ranks as processes: one transport that routes each peer's traffic through a pair.

Design note (gloo's Device / Pair). ``ProcessTransport`` is the router: ``pair(peer)`` hands
out one pair per peer (and a loopback pair for this rank), the executor binds a collective's
steps to those pairs once and calls them directly; the transport's own ``send`` /
``recv_into`` go to the same pairs. The router picks a pair by rank and never asks what kind it
is: the pairs are siblings with the same calls (``base.Pair``: ``send``, ``try_recv``,
``recv_into``, ``drain``):

- ``zmq.SocketPair``: authenticated ZeroMQ over TCP (``zmq.SocketDevice`` owns the sockets and
  the receiver thread that files inbound messages); every peer we talk to has one, for data to
  other nodes, aborts, and what a ring cannot take;
- ``local.LocalPair``: a peer of this node (equal ``runtime.ipc.node_id``) that published a
  shared-memory segment, when shared memory is on (``shm=True``: NPUSIM_SHM, and
  ``shm.available()``: x86-64 Linux): its ring for small messages, notices for device memory
  read in place, the socket pair as overflow (opened at the first message that needs it).

Connecting lazily. ``connect`` records what init learnt of every peer (address, node, segment,
process identity) and opens nothing. ``pair(peer)`` hands out a ``_LazyPair`` whose first call
makes the real pair (the socket's DEALER and its TCP connection, and for a peer of this node the
mapping of its inbox) and then forwards straight to it. A ``Call`` binds the pairs of every rank
of its communicator, so binding must not connect: only the peers a schedule sends to or receives
from are ever made (a ring: two; a star's root: all). What a first message needs is still fixed
before any rank sends, by the connect barrier of ``hccl.init`` (docs/transport.md): every
rank knows every peer's node (so a notice is accepted from a peer of this node), and the
peers of its node are watched by process identity from ``connect`` on. A peer's inbox is mapped
through ``/proc/<pid>/fd/<fd>`` (the owner keeps its segment open), so it can be mapped after
its name is unlinked at the barrier. A peer whose process exited before our first message to
it cannot be mapped: its pair still drains what it posted into our ring, sends go through the
socket, and a wait for more names it (``dead_peer``) within the usual bound.
An ABORT goes to every peer (``broadcast_abort`` makes the pairs it lacks).

Matching, fingerprints, aborts, deadlines and the liveness rule are ``base.Transport``'s; every
wait is its one loop, sleeping on the channel's futex bell when there is a channel (a peer's
post rings it; so does everything this process files), else on ``base.CondBell``.

Liveness (``dead_peer``): a peer of this node is dead once its process exits (its identity from
init, ``watch_processes``); any peer is gone once its socket pair, connected once, disconnects,
or when its address refuses our first connection.

Segments: created in ``__init__`` and kept open (``segment``: ``"<name>:<pid>:<fd>"`` to
publish), mapped at a peer's first use, and their names unlinked by ``unlink_segment`` once every rank has connected
(then no name is left in /dev/shm even if a rank is killed later; before that, npurun's janitor
removes ``npusim-<job>-*``). A segment's rings cost memory only where a sender wrote (its pages
are committed when touched), and a rank maps only the inboxes of the peers it talks to.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from hccl import config
from hccl.transport import shm
from hccl.transport.base import LoopbackPair, Pair, Transport
from hccl.transport.liveness import PeerProcess
from hccl.transport.local import LocalPair
from hccl.transport.zmq import MAX_MESSAGE, SocketDevice
from runtime import sched
from runtime.memory import ipc

log = logging.getLogger("hccl.transport")

SPIN_US = 200.0           # a waiter's spin when the node's ranks fit its cores
# ... and when they outnumber the cores at most CROWDED_RANKS_PER_CORE to one. A waiter's spin
# yields the core at every turn (shm.Channel.wait), so the rank that shares it runs at once;
# a futex sleep instead costs each hand-off a wake-up, and a small call its trip through the
# stream's worker (hccl/call.py, INLINE_SPIN is capped by this spin). Measured, 1 KiB
# all_reduce per call (npurun's default launch policy, idle machine, 2 cores), 0 -> 50 us:
# world 3 104 -> 36 us, 4 98 -> 44, 5 175 -> 90, 6 185 -> 130; but 7 251 -> 300 and 8
# 256 -> 308, where each yield goes to one of three or more waiting ranks: 0 there.
CROWDED_SPIN_US = 50.0
CROWDED_RANKS_PER_CORE = 3


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
        self._segment_fd = -1                  # kept open: peers map the inbox through /proc
        if shm:
            channel = _channel(rank, size, job, slots, slot_bytes)
            try:
                self._segment_fd = os.open(os.path.join("/dev/shm", channel.name),
                                           os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except BaseException:
                channel.close()
                raise
        super().__init__(rank, size, bell=channel)
        self.channel = channel
        self.segment = f"{channel.name}:{os.getpid()}:{self._segment_fd}" \
            if channel is not None else ""
        self.max_message = int(max_message)
        # a send to a peer of this node completes alone when it is copied into the ring (below
        # NPUSIM_SHM_MIN_BYTES and within a slot; a full ring overflows to the socket, which
        # copies or hands the payload to the OS); a socket's, whatever its size
        self.solo_bytes = self.max_message if channel is None else \
            min(channel.capacity, config.shm_min_bytes() - 1)
        self.node = ipc.node_id()
        self.peer_memory = ipc.PeerMemories()
        self.ring_sends = self.shm_sends = self.shm_recvs = 0
        self._pairs: dict[int, Any] = {rank: LoopbackPair(self)}   # made (real) pairs
        self._lazy: dict[int, _LazyPair] = {}           # what pair() handed out
        self._make_lock = threading.Lock()
        self._local: set[int] = set()                  # peers reached through the rings
        self._segments: dict[int, str] = {}             # their published segments
        self._idents: dict[int, str] = {}                # peers' process identities
        self._procs: dict[int, PeerProcess] = {}        # peers of this node: their processes
        self._broken: dict[int, str] = {}               # peers whose connection broke: why
        try:
            self.sockets = SocketDevice(self, secret, bind_host, self.max_message)
        except BaseException:
            if channel is not None:
                channel.close()
                os.close(self._segment_fd)
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
        """Learn every rank in ``addresses`` (``{rank: "tcp://host:port"}``; this rank and ranks
        already known are skipped). ``nodes`` (``{rank: node id}``) names the ranks of this
        node; those of them in ``segments`` (``{rank: segment}``, as published) are reached
        through shared memory when it is on. Opens nothing and never blocks: a pair is made at
        its first use (the module note).

        Links to other nodes (or of unknown node) carry heartbeats, so a cut cable or a frozen
        host breaks them after NPUSIM_HEARTBEAT_TIMEOUT; links within the node do not, so a
        stopped (SIGSTOP) peer of this node is only a timeout (HCCL_EXEC_TIMEOUT)."""
        nodes, segments = nodes or {}, segments or {}
        for peer in addresses:
            self.check_peer(peer)
        here = {p for p, n in nodes.items() if n == self.node and p != self.rank}
        for p in here & set(self._idents):
            self._procs.setdefault(p, PeerProcess(self._idents[p]))
        self.sockets.connect(addresses, set(addresses) - here)
        local = {p for p in here if self.channel is not None and segments.get(p)}
        for p in local:
            self._segments.setdefault(p, segments[p])
        self._local |= local
        self.sockets.acks_from = self.sockets.acks_from | frozenset(local)
        ranks, cores = len(self._local) + 1, sched.node_cores()
        if self.channel is not None:
            spin = config.shm_spin_us()
            if spin is None:
                # ranks fit cores: spin longer than the usual skew between two ranks (100-300
                # us of Python per call): a futex sleep costs the sleeper a 50-100 us wake-up
                # (1 KiB, 2 ranks, median: 460-540 us with 20 us of spin, 325-405 us with
                # 100-300 us); a few more ranks than cores: CROWDED_SPIN_US; many more: none,
                # a spinning waiter would hold back the very ranks it waits for
                spin = SPIN_US if ranks <= cores else CROWDED_SPIN_US \
                    if ranks <= CROWDED_RANKS_PER_CORE * cores else 0.0
            self.channel.spin = spin * 1e-6

    @property
    def local_peers(self) -> list[int]:
        """The peers reached through shared memory (made or not)."""
        return sorted(self._local)

    @property
    def paired(self) -> list[int]:
        """The peers whose pair has been made (first used), this rank excluded."""
        return sorted(p for p in self._pairs if p != self.rank)

    def unlink_segment(self) -> None:
        """Remove this rank's segment name (call after the connect barrier): peers map it
        through ``/proc/<pid>/fd`` from then on; mappings stay valid. Nothing to do without
        shared memory."""
        if self.channel is not None:
            self.channel.unlink()

    # -- data path -------------------------------------------------------------------------
    def pair(self, peer: int):
        """The pair of ``peer``: the real one once made, else a ``_LazyPair`` that makes it at
        its first call (binding a collective connects nothing)."""
        pair = self._pairs.get(peer)
        if pair is not None:
            return pair
        lazy = self._lazy.get(peer)
        if lazy is None:
            self.check_peer(peer)
            if peer not in self.sockets.addresses:
                raise ValueError(f"rank {self.rank}: no link to rank {peer}; call connect() "
                                 "with its address first")
            lazy = self._lazy.setdefault(peer, _LazyPair(self, peer))
        return lazy

    def make_pair(self, peer: int):
        """The real pair of ``peer``, made now if it is not yet (thread-safe, idempotent)."""
        pair = self._pairs.get(peer)
        if pair is not None:
            return pair
        with self._make_lock:
            pair = self._pairs.get(peer)
            if pair is None:
                pair = self._pairs[peer] = self._new_pair(peer)
        return pair

    def _new_pair(self, peer: int):
        if peer not in self._local:
            return self.sockets.pair(peer)
        try:
            name, pid, fd = self._segments[peer].rsplit(":", 2)
            self.channel.attach(peer, name, _open_segment(name, pid, fd, self._procs.get(peer)))
        except (OSError, ValueError, shm.ChannelError) as e:
            # Its process exited, or it closed its transport (the fd is gone), or procfs is
            # closed to us. What it posted before is still in this rank's ring (the pair below
            # drains it); what this rank sends goes through the socket (``post`` refuses an
            # unmapped inbox), and a wait for more fails naming why (``dead_peer``).
            if self.dead_peer(peer) is None:
                self.link_broken(peer, f"its shared-memory inbox cannot be mapped: {e}; it "
                                 "closed its transport, or this process may not open its "
                                 "/proc/<pid>/fd: set NPUSIM_SHM=0 to send over sockets only")
        return LocalPair(self, self.channel, peer, _Overflow(self.sockets, peer),
                         config.shm_min_bytes())

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

    def link_broken(self, peer: int, why: str = "") -> None:
        """The socket device saw ``peer``'s connection, up once, go down (or refused at first:
        ``why``)."""
        if peer not in self._broken:
            self._broken[peer] = why or "its connection to this rank broke (the peer closed "\
                "it, exited, or stopped answering heartbeats)"
            log.warning("rank %d: the connection to rank %d broke: %s", self.rank, peer,
                        self._broken[peer])
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
            with self._make_lock:
                fd, self._segment_fd = self._segment_fd, -1
            if fd >= 0:
                os.close(fd)


def _channel(rank: int, size: int, job: str, slots: int | None, slot_bytes: int | None):
    return shm.Channel(rank, size, job, slots=slots or config.shm_slots(),
                       slot_bytes=slot_bytes or config.shm_slot_bytes())


class _Overflow:
    """A peer of this node's socket pair, opened at its first use: what fits the rings needs
    none, so a star's root at world 256 opens no TCP connection (and its peers none to it) for a
    small collective; a peer of this node is watched by its process, not by its link."""

    __slots__ = ("device", "peer")

    def __init__(self, device: SocketDevice, peer: int):
        self.device, self.peer = device, peer

    def send(self, comm_id, seq, step, fp, mv):
        return self.device.pair(self.peer).send(comm_id, seq, step, fp, mv)

    def post(self, kind, **fields) -> None:
        self.device.pair(self.peer).post(kind, **fields)


class _LazyPair(Pair):
    """What ``pair(peer)`` hands out before the pair is made: its first call makes the real
    pair (``make_pair``) and puts the real pair's bound methods on this object, so every later
    call goes straight to them (no extra frame on the data path)."""

    provisional = True      # a Call bound to it binds again after its first run (executor)

    def __init__(self, t: ProcessTransport, peer: int):
        self.t, self.peer = t, peer

    def _real(self):
        real = self.t.make_pair(self.peer)
        self.send, self.try_recv = real.send, real.try_recv
        self.recv_into, self.drain = real.recv_into, real.drain
        return real

    def send(self, comm_id, seq, step, fp, mv):
        return self._real().send(comm_id, seq, step, fp, mv)

    def try_recv(self, comm_id, seq, step, fp, consume, spin=0.0) -> bool:
        return self._real().try_recv(comm_id, seq, step, fp, consume, spin)

    def recv_into(self, comm_id, seq, step, fp, timeout, consume) -> None:
        self._real().recv_into(comm_id, seq, step, fp, timeout, consume)

    def drain(self) -> None:
        self._real().drain()


def _open_segment(name: str, pid: str, fd: str, proc: PeerProcess | None) -> int:
    """An fd of a peer's inbox ``name``, as published (``"<name>:<pid>:<fd>"``): through
    ``/proc/<pid>/fd/<fd>`` (the owner keeps it open; its name is unlinked after the connect
    barrier), after checking that the link names that segment (a recycled pid or fd cannot alias
    another file) and, when the peer's process identity is known, that it still runs; else by its
    name while it has one. ``shm.Channel.attach`` checks the owner, mode and contents."""
    if pid.isdigit() and fd.isdigit():
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path) in (f"/dev/shm/{name}", f"/dev/shm/{name} (deleted)"):
                opened = os.open(path, os.O_RDWR | os.O_CLOEXEC)
                if proc is None or proc.gone() is None:   # the same process: its segment
                    return opened
                os.close(opened)
        except OSError:
            pass
    return os.open(os.path.join("/dev/shm", name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
