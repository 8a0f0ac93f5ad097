"""Ranks as processes: the transport over authenticated ZeroMQ TCP connections.

Design note. Each endpoint binds one ROUTER (inbound from every peer) and opens one DEALER per
peer (outbound), whose routing id encodes ``(rank, conn)`` with a random ``conn`` per link. A
receiver thread owns the ROUTER: it verifies every message with ``wire.unpack`` (MAC, sizes,
addressed to this rank), checks that the socket identity matches the signed sender, rejects
replayed serials, and files DATA into the mailboxes of ``base.Transport`` (waiters sleep on its
Condition) or applies ABORT. A message that fails any of these checks is a stranger's (or a
replay): it is dropped, counted and logged (WARNING, rate-limited) on ``hccl.transport``, and a
timeout on this rank mentions the count. A message that passes them comes from a member: if this
rank cannot use it (an unknown kind, a shared-memory notice from a rank of another node, a
malformed notice) that is a protocol error, never a drop: ``Transport.fail`` aborts every
communicator of the world on every rank with a reason naming the sender and the message.
Nothing received is ever unpickled.

Sends never block (SNDHWM/RCVHWM 0: the collectives post sends before their receives). Sends
from several threads to one peer are serialized by that link's lock, which also keeps the link's
serials in wire order. Payloads from ``zmq.COPY_THRESHOLD`` (64 KiB) up are sent zero-copy with
a tracker: the caller must leave the buffer untouched until ``handle.wait()``. Smaller ones are
copied (cheaper, and the handle is complete at once).

Shared memory. Between ranks of one node (``connect``'s ``nodes``: equal ``runtime.ipc.node_id``),
a payload of at least NPUSIM_SHM_MIN_BYTES that lies in the sender's device memory is not sent:
a SHM_DATA message names it (memory handle, offset, length) and the receiver's ``recv_into``
reads it in place from its read-only mapping of the sender's device memory, then answers SHM_ACK;
the send's handle completes on that acknowledgement (it waits on the transport's Condition, so an
abort or close wakes it too). One copy (or the reduction itself) instead of three, and no socket
buffers. A SHM_DATA from a rank of another node is a protocol error. Every rank knows which peers
share its node before its communicator is returned (``hccl.init`` waits until every rank has
called ``connect``), so a correct peer never sends one too early.

Liveness. A wait on a peer asks ``_dead_peer`` (``base.Transport``): a peer of this node is dead
once its process exits (pid and start time from init, ``liveness``); any peer is gone once its
link, connected once, disconnects (a socket monitor thread per ``connect``); links to other nodes
carry ZeroMQ heartbeats (NPUSIM_HEARTBEAT_TIMEOUT) so a cut link or a frozen host breaks them too.

Every socket has LINGER 0; ``close`` alone gives outbound links a bounded linger (1 s by default)
so a last ABORT still leaves, then discards what a dead peer never took: it never hangs. It
terminates the Context, which wakes the receiver thread with ETERM.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np
import zmq
from zmq.utils import monitor as zmq_monitor

from hccl import config, wire
from hccl.transport.base import (DONE, Fingerprint, PeerGone, PeerTimeout, SendHandle,
                                 Transport, TransportClosed, TransportError, as_bytes_view,
                                 norm_fp)
from hccl.transport.liveness import PeerProcess
from runtime import ipc
from runtime.errors import MemoryAccessError

log = logging.getLogger("hccl.transport")

MAX_MESSAGE = 256 << 20   # > HCCL_BUFFSIZE's default 200 MB; libzmq drops larger inbound frames
_RANK_TAG = b"R"
_MAX_REASON = 4000


class _TrackedHandle(SendHandle):
    __slots__ = ("_tracker", "_peer", "_t", "_comm")

    def __init__(self, tracker: zmq.MessageTracker, peer: int, transport: "ZmqTransport",
                 comm_id: int):
        self._tracker, self._peer, self._t, self._comm = tracker, peer, transport, comm_id

    def wait(self, timeout: float | None = None) -> None:
        # in ticks, so that a dead peer (whose link never drains) is noticed like in a recv
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + max(0.0, timeout)
        tick = self._t.liveness_interval
        while True:
            left = tick if deadline is None else min(tick, deadline - time.monotonic())
            try:
                self._tracker.wait(max(0.0, left))
                return
            except zmq.NotDone:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                raise PeerTimeout(self._peer, time.monotonic() - t0) from None
            with self._t._cond:
                gone = self._t._dead_peer(self._peer)
            if gone is not None:   # the common wait: grace, abort naming the peer, PeerGone
                self._t._wait_until(lambda: True if self._tracker.done else None, self._comm,
                                    self._peer, None if deadline is None
                                    else max(0.0, deadline - time.monotonic()))
                return

    def done(self) -> bool:
        return self._tracker.done


class ProtocolError(Exception):
    """An authenticated message from rank ``sender`` that this rank cannot use (the text says why)."""

    def __init__(self, message: str, sender: int):
        super().__init__(message)
        self.sender = sender


class ShmError(TransportError):
    """A payload announced in shared memory could not be read (the message says why)."""


class ShmRef:
    """An inbound SHM_DATA: where the payload is, and the serial to acknowledge."""

    __slots__ = ("handle", "offset", "nbytes", "serial")

    def __init__(self, handle: str, offset: int, nbytes: int, serial: int):
        self.handle, self.offset, self.nbytes, self.serial = handle, offset, nbytes, serial


class AckHandle(SendHandle):
    """A SHM_DATA send: complete once the peer acknowledged it."""

    __slots__ = ("_t", "_peer", "_comm", "acked")

    def __init__(self, transport: "ZmqTransport", peer: int, comm_id: int):
        self._t, self._peer, self._comm, self.acked = transport, peer, comm_id, False

    def wait(self, timeout: float | None = None) -> None:
        if not self.acked:
            self._t._wait_until(lambda: self.acked or None, self._comm, self._peer, timeout)

    def done(self) -> bool:
        return self.acked


class _Link:
    """The outbound DEALER to one peer."""

    __slots__ = ("sock", "conn", "serial", "lock", "closed", "connected")

    def __init__(self, sock: zmq.Socket, conn: int):
        self.sock, self.conn, self.serial = sock, conn, 0
        self.lock = threading.Lock()
        self.closed = False
        self.connected = False       # the TCP connection was up once (monitor thread)


class ZmqTransport(Transport):
    """Endpoint ``rank`` of ``size`` processes; binds at construction (``.address``), then
    ``connect(addresses)`` opens the links to the peers.

    ``max_message`` bounds one payload both ways (``send`` raises ValueError above it, the ROUTER
    drops a connection announcing more); the executor must slice below it.
    """

    def __init__(self, rank: int, size: int, secret: bytes, bind_host: str = "127.0.0.1", *,
                 max_message: int = MAX_MESSAGE):
        super().__init__(rank, size)
        self._secret = wire.check_secret(secret)
        self.max_message = int(max_message)
        self._ctx = zmq.Context()
        r = self._router = self._ctx.socket(zmq.ROUTER)
        r.linger = 0
        r.rcvhwm = 0
        r.setsockopt(zmq.MAXMSGSIZE, self.max_message + wire.MAX_HEADER)
        if ":" in bind_host:
            r.ipv6 = True
        host = f"[{bind_host}]" if ":" in bind_host else bind_host
        try:
            r.bind(f"tcp://{host}:*")
        except zmq.ZMQError as e:
            r.close()
            self._ctx.term()
            raise OSError(f"rank {rank}: cannot bind a transport socket on {bind_host!r}: {e} "
                          f"(check HCCL_IF_IP)") from None
        port = r.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
        self.address = f"tcp://{host}:{port}"
        self._links: dict[int, _Link] = {}
        self._links_lock = threading.Lock()
        self.node = ipc.node_id()
        self._shm_peers: frozenset = frozenset()        # ranks whose memory this one may read
        self._shm_min = config.shm_min_bytes() if config.shm() else None
        self._acks: dict[tuple[int, int], AckHandle] = {}   # (peer, serial) -> its send
        self._peer_mem = ipc.PeerMemories()
        self.shm_sends = self.shm_recvs = 0
        self._guard = wire.ReplayGuard()
        self.drops = wire.DropLog(log)
        self._closing = False
        self._idents: dict[int, str] = {}                # peers' process identities
        self._procs: dict[int, PeerProcess] = {}        # peers of this node: their processes
        self._broken: dict[int, str] = {}               # peers whose connection broke: why
        self._monitors: list[threading.Thread] = []
        self._rx = threading.Thread(target=self._receive, name=f"hccl-rx-rank{rank}", daemon=True)
        self._rx.start()

    # -- setup -----------------------------------------------------------------------------
    def watch_processes(self, idents: dict[int, str]) -> None:
        """Remember the peers' process identities (``{rank: liveness.identity()}``); ``connect``
        watches those of the peers that share this node. Call it before ``connect``."""
        self._idents.update(idents)

    def connect(self, addresses: dict[int, str], nodes: dict[int, str] | None = None) -> None:
        """Open a link to every rank in ``addresses`` (``{rank: "tcp://host:port"}``; this rank
        and already linked ranks are skipped). Never blocks: ZeroMQ connects in the background
        and queues what is sent meanwhile. ``nodes`` (``{rank: node id}``) names the ranks of
        this node: large payloads to and from them take the shared-memory path.

        Liveness (``_dead_peer``): a peer of this node is dead once its process (given to
        ``watch_processes``) has exited; any peer is gone once the link to it, up
        once, disconnects (ZeroMQ would reconnect and silently lose what was in flight). Links
        to other nodes (or of unknown node) carry ZeroMQ heartbeats, so a cut cable or a frozen
        host breaks them after NPUSIM_HEARTBEAT_TIMEOUT; links within the node do not, so a
        stopped (SIGSTOP) peer of this node is only a timeout (HCCL_EXEC_TIMEOUT)."""
        nodes = nodes or {}
        if self._shm_min is not None:
            self._shm_peers = self._shm_peers | {
                p for p, n in nodes.items() if n == self.node and p != self.rank}
        for p, ident in self._idents.items():
            if nodes.get(p) == self.node and p != self.rank:
                self._procs[p] = PeerProcess(ident)
        hb_ms = max(100, int(config.heartbeat_timeout() * 1000))
        monitors: dict[zmq.Socket, int] = {}
        with self._links_lock:
            if self._closing:
                raise TransportClosed(f"rank {self.rank}: transport closed")
            for peer, addr in addresses.items():
                self._check_peer(peer)
                if peer == self.rank or peer in self._links:
                    continue
                conn = wire.new_conn_id()
                s = self._ctx.socket(zmq.DEALER)
                s.linger = 0
                s.sndhwm = 0
                s.setsockopt(zmq.MAXMSGSIZE, 1 << 20)   # peers never send on this socket
                s.routing_id = wire.routing_id(_RANK_TAG, self.rank, conn)
                if addr.startswith("tcp://["):
                    s.ipv6 = True
                if nodes.get(peer) != self.node:
                    s.setsockopt(zmq.HEARTBEAT_IVL, max(20, hb_ms // 5))
                    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, hb_ms)
                monitors[s.get_monitor_socket(
                    zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED)] = peer
                s.connect(addr)
                self._links[peer] = _Link(s, conn)
            if monitors:
                t = threading.Thread(target=self._monitor, args=(monitors,), daemon=True,
                                     name=f"hccl-mon-rank{self.rank}")
                self._monitors.append(t)
                t.start()

    def _monitor(self, socks: dict) -> None:
        """Follow the links' connection events (see ``connect``) until every link is closed."""
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        try:
            while socks:
                for s, _ in poller.poll():
                    event = zmq_monitor.recv_monitor_message(s)["event"]
                    if event == zmq.EVENT_MONITOR_STOPPED:
                        poller.unregister(s)
                        s.close(linger=0)
                        del socks[s]
                    else:
                        self._link_event(socks[s], event)
        except zmq.ContextTerminated:
            pass
        except Exception:   # a bug here must not leave the context unterminable
            log.exception("rank %d: link monitor failed; dead peers of other nodes will only "
                          "time out", self.rank)
        finally:
            for s in socks:
                s.close(linger=0)

    def _link_event(self, peer: int, event: int) -> None:
        link = self._links.get(peer)
        if link is None:
            return
        if event == zmq.EVENT_CONNECTED:
            link.connected = True
        elif event == zmq.EVENT_DISCONNECTED and link.connected and not self._closing:
            with self._cond:
                if peer not in self._broken:
                    self._broken[peer] = "its connection to this rank broke (the peer closed it, "\
                        "exited, or stopped answering heartbeats)"
                    log.warning("rank %d: the connection to rank %d broke", self.rank, peer)
                self._cond.notify_all()

    def _dead_peer(self, peer: int) -> str | None:
        proc = self._procs.get(peer)   # an exited process is the more precise reason
        return (proc.gone() if proc is not None else None) or self._broken.get(peer)

    # -- data path -------------------------------------------------------------------------
    def send(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
             payload: Any) -> SendHandle:
        self._check_send(peer, comm_id)
        fp = norm_fp(fp)
        mv = as_bytes_view(payload)
        if mv.nbytes > self.max_message:
            raise ValueError(f"rank {self.rank}: a {mv.nbytes}-byte message exceeds the transport "
                             f"limit of {self.max_message} bytes; slice it (HCCL_BUFFSIZE)")
        if peer == self.rank:
            self._deliver(peer, comm_id, seq, step, fp, memoryview(bytearray(mv)))
            return DONE
        link = self._link(peer)
        if peer in self._shm_peers and mv.nbytes >= self._shm_min:
            where = ipc.export(np.frombuffer(mv, np.uint8))
            if where is not None:
                return self._send_shm(link, peer, comm_id, seq, step, fp, mv.nbytes, *where)
        with link.lock:
            if link.closed:
                raise TransportClosed(f"rank {self.rank}: transport closed")
            link.serial += 1
            frames = wire.pack(self._secret, wire.Kind.DATA, sender=self.rank, dest=peer,
                               conn=link.conn, serial=link.serial, comm_id=comm_id, seq=seq,
                               step=step, fp=fp, payloads=(mv,))
            if mv.nbytes < zmq.COPY_THRESHOLD:
                link.sock.send_multipart(frames)
                return DONE
            link.sock.send(frames[0], zmq.SNDMORE)
            tracker = link.sock.send(mv, copy=False, track=True)
        return _TrackedHandle(tracker, peer, self, comm_id)

    def _send_shm(self, link: _Link, peer: int, comm_id: int, seq: int, step: int, fp,
                  nbytes: int, handle: str, offset: int) -> AckHandle:
        ack = AckHandle(self, peer, comm_id)
        with link.lock:
            if link.closed:
                raise TransportClosed(f"rank {self.rank}: transport closed")
            with self._cond:                     # before the peer can possibly answer
                self._acks[(peer, link.serial + 1)] = ack
            self._post(link, peer, wire.Kind.SHM_DATA, comm_id=comm_id, seq=seq, step=step, fp=fp,
                       value=offset, text=f"{nbytes} {handle}")
        self.shm_sends += 1
        return ack

    def recv(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
             timeout: float | None) -> memoryview:
        data = Transport.recv(self, peer, comm_id, seq, step, fp, timeout)
        if type(data) is not ShmRef:
            return data
        out = []                                 # a copy the caller owns, as recv promises
        self._consume_shm(peer, data, lambda view: out.append(memoryview(bytearray(view))))
        return out[0]

    def recv_into(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
                  timeout: float | None, consume) -> None:
        data = Transport.recv(self, peer, comm_id, seq, step, fp, timeout)
        if type(data) is not ShmRef:
            consume(data)
        else:
            self._consume_shm(peer, data, consume)

    def _consume_shm(self, peer: int, data: ShmRef, consume) -> None:
        """``consume`` a view of the payload in ``peer``'s memory, then acknowledge it."""
        try:
            try:
                view = self._peer_mem.view(data.handle, data.offset, data.nbytes)
            except ipc.PeerGoneError as e:
                raise PeerGone(peer, str(e)) from None
            except MemoryAccessError as e:
                raise ShmError(f"rank {self.rank}: cannot read the payload rank {peer} put in "
                               f"shared memory: {e}") from None
            self.shm_recvs += 1
            try:
                consume(view)
            finally:
                view.release()
        finally:
            self._send_ack(peer, data.serial)

    def _send_ack(self, peer: int, serial: int) -> None:
        link = self._link(peer)
        with link.lock:
            if not link.closed:
                self._post(link, peer, wire.Kind.SHM_ACK, value=serial)

    def _post(self, link: _Link, peer: int, kind: int, **fields) -> None:
        """Send a header-only message on ``link`` (the caller holds ``link.lock``)."""
        link.serial += 1
        link.sock.send_multipart(wire.pack(self._secret, kind, sender=self.rank, dest=peer,
                                           conn=link.conn, serial=link.serial, **fields))

    def _acked(self, peer: int, serial: int) -> None:
        with self._cond:
            ack = self._acks.pop((peer, serial), None)
            if ack is not None:                  # None: its comm was aborted meanwhile
                ack.acked = True
                self._cond.notify_all()

    def _mark_aborted(self, comm_id: int, peer: int, reason: str) -> bool:
        with self._cond:
            for key in [k for k, a in self._acks.items() if a._comm == comm_id]:
                del self._acks[key]             # their waiters raise Aborted
        return super()._mark_aborted(comm_id, peer, reason)

    def _mark_failed(self, peer: int, reason: str) -> bool:
        with self._cond:
            self._acks.clear()                  # their waiters raise Aborted
        return super()._mark_failed(peer, reason)

    def _timeout_note(self) -> str:
        n = self.drops.dropped
        return (f"; meanwhile this rank dropped {n} unauthenticated message(s), see the "
                "hccl.transport warnings" if n else "")

    def _link(self, peer: int) -> _Link:
        link = self._links.get(peer)
        if link is None:
            raise ValueError(f"rank {self.rank}: no link to rank {peer}; call connect() with its "
                             f"address first")
        return link

    def _broadcast_abort(self, comm_id: int, reason: str) -> None:
        text = reason.encode("utf-8")[:_MAX_REASON].decode("utf-8", errors="ignore")
        with self._links_lock:
            links = list(self._links.items())
        for peer, link in links:
            with link.lock:
                if not link.closed:
                    self._post(link, peer, wire.Kind.ABORT, comm_id=comm_id, text=text)

    # -- receiver thread -------------------------------------------------------------------
    def _receive(self) -> None:
        sock = self._router
        try:
            while True:
                frames = sock.recv_multipart(copy=False)
                try:
                    self._dispatch(frames)
                except wire.UnusableFrame as e:
                    self._on_protocol_error(ProtocolError(
                        f"protocol error: rank {self.rank} cannot use a message from rank "
                        f"{e.sender}: {e}", e.sender))
                except wire.BadFrame as e:
                    self.drops(f"rank {self.rank}", f"{e} (from {_peer(frames[-1])})")
                except ProtocolError as e:
                    self._on_protocol_error(e)
                except Exception:   # a bug here must not kill the receiver
                    log.exception("rank %d: internal error handling a message", self.rank)
        except zmq.ContextTerminated:
            pass
        except Exception:
            log.exception("rank %d: transport receiver failed; closing the transport", self.rank)
            Transport.close(self)
        finally:
            sock.close(linger=0)

    def _dispatch(self, frames: list) -> None:
        if len(frames) < 2:
            raise wire.BadFrame(f"{len(frames)}-frame message")
        h = wire.unpack(frames[1:], self._secret, dest=self.rank)
        if not 0 <= h.sender < self.size or h.sender == self.rank:
            raise wire.BadFrame(f"sender {h.sender} is not a peer rank of this world")
        if frames[0].bytes != wire.routing_id(_RANK_TAG, h.sender, h.conn):
            raise wire.BadFrame("socket identity does not match the signed sender")
        self._guard.accept(h.sender, h.conn, h.serial)
        # authenticated from here on: what cannot be used is a member's protocol error
        if h.kind == wire.Kind.DATA and len(h.payloads) == 1:
            self._deliver(h.sender, h.comm_id, h.seq, h.step, h.fp, h.payloads[0].buffer)
        elif h.kind == wire.Kind.SHM_DATA and not h.payloads:
            if h.sender not in self._shm_peers:
                self._protocol_error(h, f"rank {h.sender} is not on this node (or shared memory "
                                        "is off here: NPUSIM_SHM)")
            n, _, handle = h.text.partition(" ")
            if not n.isdigit() or not handle or int(n) > self.max_message or h.value < 0:
                self._protocol_error(h, f"malformed notice {h.text[:80]!r}")
            self._deliver(h.sender, h.comm_id, h.seq, h.step, h.fp,
                          ShmRef(handle, h.value, int(n), h.serial))
        elif h.kind == wire.Kind.SHM_ACK and not h.payloads:
            self._acked(h.sender, h.value)
        elif h.kind == wire.Kind.ABORT:
            self._apply_abort(h.comm_id, h.sender, h.text)
        else:
            self._protocol_error(h, f"not expected with {len(h.payloads)} payload frame(s)")

    def _on_protocol_error(self, e: ProtocolError) -> None:
        if not 0 <= e.sender < self.size or e.sender == self.rank:
            self.drops(f"rank {self.rank}", f"{e} (not a peer rank of this world)")
            return
        log.error("rank %d: %s; aborting every communicator", self.rank, e)
        self.fail(e.sender, str(e))

    def _protocol_error(self, h: wire.Header, why: str):
        raise ProtocolError(f"protocol error: rank {self.rank} cannot use a {h.kind.name} message "
                            f"from rank {h.sender} (comm {h.comm_id:#x}, seq {h.seq}, step "
                            f"{h.step}): {why}", h.sender)

    # -- teardown --------------------------------------------------------------------------
    def close(self, linger: float = 1.0) -> None:
        """Close every socket and stop the receiver (idempotent).

        Messages still queued (e.g. an ABORT just sent) get up to ``linger`` seconds to leave;
        what a dead peer never takes is then discarded, so this never hangs.
        """
        with self._links_lock:
            if self._closing:
                return
            self._closing = True
            links = list(self._links.values())
        Transport.close(self)
        with self._cond:
            self._acks.clear()
        for link in links:
            with link.lock:
                link.closed = True
                link.sock.close(linger=max(0, int(linger * 1000)))
        self._ctx.term()   # waits out the lingers; the receiver's recv raises ETERM and exits
        self._rx.join()
        for t in self._monitors:
            t.join()
        self._peer_mem.close()


def _peer(frame) -> str:
    """The remote address libzmq attached to a received frame (for logs)."""
    try:
        return frame.get("Peer-Address")
    except Exception:
        return "?"
