"""The socket device: authenticated ZeroMQ TCP connections to the peers (one ``SocketPair`` each).

Design note. The device binds one ROUTER (inbound from every peer) and opens one DEALER per
peer it talks to (outbound, a ``SocketPair``), whose routing id encodes ``(rank, conn)`` with a
random ``conn`` per pair. ``connect`` only records the peers' addresses; a pair (its socket, its
TCP connection, its link monitor) is made at the first ``pair(peer)``, so a rank of a ring at
world 256 opens two connections, not 255 (an ABORT goes to every peer: ``broadcast_abort``
makes the pairs it lacks). A receiver thread owns the ROUTER: it verifies every message with
``wire.unpack`` (MAC, sizes, addressed to this rank), checks that the socket identity matches
the signed sender, rejects replayed serials, and hands DATA to its transport's ``deliver`` or
applies ABORT. A message that fails any of these checks is a stranger's (or a replay): it is
dropped, counted and logged (WARNING, rate-limited) on ``hccl.transport``, and a timeout on
this rank mentions the count. A message that passes them comes from a member: if this rank
cannot use it (an unknown kind, a shared-memory acknowledgement from a rank that has no ring
here, a notice: those travel only through the rings) that is a protocol error, never a drop:
``Transport.fail`` aborts every communicator of the world on every rank with a reason naming
the sender and the message. Nothing received is ever unpickled.

Sends never block (SNDHWM/RCVHWM 0: the collectives post sends before their receives). Sends
from several threads to one peer are serialized by the pair's lock, which also keeps its
serials in wire order. Payloads from ``zmq.COPY_THRESHOLD`` (64 KiB) up are sent zero-copy with
a tracker: the caller must leave the buffer untouched until ``handle.wait()``. Smaller ones are
copied (cheaper, and the handle is complete at once).

Liveness: one monitor thread follows every pair's connection (a pair made later hands it its
monitor socket through a queue and an inproc wake-up); once up, a disconnect tells the
transport (``link_broken``: ZeroMQ would reconnect and silently lose what was in flight). A
connection refused before it was ever up tells it too: the peer bound its ROUTER before it
published its address and keeps it until it closes its transport, so a refusal means the peer
is gone (a pair made lazily may meet a peer that died before our first message). Pairs
to other nodes carry ZeroMQ heartbeats (NPUSIM_HEARTBEAT_TIMEOUT) so a cut link or a frozen
host breaks them too. A heartbeat alone misses a link cut while a large message is leaving
(libzmq produces its PING only once the bytes before it are written, and they never are), so
the same pairs limit how long sent data may stay unacknowledged (``TCP_MAXRT``, Linux's
TCP_USER_TIMEOUT) to the same NPUSIM_HEARTBEAT_TIMEOUT.

Every socket has LINGER 0; ``close`` alone gives outbound pairs a bounded linger (1 s by default)
so a last ABORT still leaves, then discards what a dead peer never took: it never hangs. It
terminates the Context, which wakes the receiver thread with ETERM.
"""
from __future__ import annotations

import logging
import threading
from collections import deque

import zmq
from zmq.utils import monitor as zmq_monitor

from hccl import config, wire
from hccl.store import BACKLOG
from hccl.transport.base import DONE, MailboxPair, SendHandle, TransportClosed

log = logging.getLogger("hccl.transport")

MAX_MESSAGE = 256 << 20   # > HCCL_BUFFSIZE's default 200 MB; libzmq drops larger inbound frames
ACK_STEP = 1 << 31        # an acknowledgement's step: the notice's | ACK_STEP (wire: u32)
_RANK_TAG = b"R"
_MAX_REASON = 4000
_RELEASE_AFTER_CLOSE = 5.0   # s: a closed transport's dropped sends are released within this


class _TrackedHandle(SendHandle):
    """A zero-copy send: complete once libzmq no longer reads the payload. Its wait is the
    transport's wait loop (deadline, liveness, abort), sleeping on the tracker instead of the
    bell: nothing rings the bell when libzmq lets go of a buffer."""

    __slots__ = ("_tracker", "_peer", "_t", "_comm")

    def __init__(self, tracker: zmq.MessageTracker, peer: int, transport, comm_id: int):
        self._tracker, self._peer, self._t, self._comm = tracker, peer, transport, comm_id

    def wait(self, timeout: float | None = None) -> None:
        if not self._tracker.done:
            tracker = self._tracker
            try:
                self._t.wait_for(lambda: True if tracker.done else None, self._comm, self._peer,
                                 timeout, sleep=self._sleep)
            except TransportClosed:
                # Closing drops what a peer never took: libzmq frees the buffer as the context
                # ends, and pyzmq marks the tracker done a moment later on its own thread. The
                # buffer is then free; only a tracker still busy after that says otherwise.
                try:
                    tracker.wait(_RELEASE_AFTER_CLOSE if timeout is None else timeout)
                except zmq.NotDone:
                    raise TransportClosed(f"rank {self._t.rank}: transport closed while "
                                          f"libzmq still held a send to rank {self._peer}") from None

    def _sleep(self, seen: int, seconds: float) -> None:
        try:
            self._tracker.wait(seconds)
        except zmq.NotDone:
            pass

    def done(self) -> bool:
        return self._tracker.done


class ProtocolError(Exception):
    """An authenticated message from rank ``sender`` that this rank cannot use (the text says why)."""

    def __init__(self, message: str, sender: int):
        super().__init__(message)
        self.sender = sender


class SocketPair(MailboxPair):
    """One peer through ZeroMQ: the outbound DEALER (``send`` a payload, ``post`` a header-only
    message); its receives are the mailboxes the device's receiver thread files into
    (``base.MailboxPair``)."""

    __slots__ = ("t", "device", "peer", "sock", "conn", "serial", "lock", "closed", "connected",
                 "watched", "late")

    def __init__(self, device: "SocketDevice", peer: int, sock: zmq.Socket, conn: int):
        self.t = device.owner
        self.device, self.peer, self.sock, self.conn, self.serial = device, peer, sock, conn, 0
        self.lock = threading.Lock()
        self.closed = False
        self.connected = False       # the TCP connection was up once (monitor thread)
        self.watched = False         # its link monitor runs (not for a pair made for an ABORT)
        self.late = False            # watched only after it was opened: CONNECTED may be missed

    def send(self, comm_id: int, seq: int, step: int, fp, mv: memoryview) -> SendHandle:
        """Send ``mv`` (at most the device's ``max_message`` bytes, else ValueError) without
        blocking."""
        d = self.device
        self.t.check_open(comm_id)
        if mv.nbytes > d.max_message:
            raise ValueError(f"rank {d.rank}: a {mv.nbytes}-byte message exceeds the transport "
                             f"limit of {d.max_message} bytes; slice it (HCCL_BUFFSIZE)")
        with self.lock:
            if self.closed:
                raise TransportClosed(f"rank {d.rank}: transport closed")
            self.serial += 1
            frames = wire.pack(d.secret, wire.Kind.DATA, sender=d.rank, dest=self.peer,
                               conn=self.conn, serial=self.serial, comm_id=comm_id, seq=seq,
                               step=step, fp=fp, payloads=(mv,))
            if mv.nbytes < zmq.COPY_THRESHOLD:
                self.sock.send_multipart(frames)
                return DONE
            self.sock.send(frames[0], zmq.SNDMORE)
            tracker = self.sock.send(mv, copy=False, track=True)
        return _TrackedHandle(tracker, self.peer, d.owner, comm_id)

    def post(self, kind: int, **fields) -> None:
        """Send a header-only message (an ABORT, an acknowledgement); nothing once closed."""
        d = self.device
        with self.lock:
            if not self.closed:
                self.serial += 1
                self.sock.send_multipart(wire.pack(d.secret, kind, sender=d.rank, dest=self.peer,
                                                   conn=self.conn, serial=self.serial, **fields))

    def abort(self, comm_id: int, reason: str) -> None:
        text = reason.encode("utf-8")[:_MAX_REASON].decode("utf-8", errors="ignore")
        self.post(wire.Kind.ABORT, comm_id=comm_id, text=text)


class SocketDevice:
    """The sockets of ``owner`` (a ``ProcessTransport``): binds at construction (``.address``),
    ``connect`` opens the pairs; what arrives goes to ``owner.deliver`` / ``apply_abort`` /
    ``fail`` / ``link_broken``.

    ``max_message`` bounds one payload both ways (the ROUTER drops a connection announcing
    more); the executor must slice below it.
    """

    def __init__(self, owner, secret: bytes, bind_host: str, max_message: int):
        self.owner, self.rank, self.size = owner, owner.rank, owner.size
        self.secret = wire.check_secret(secret)
        self.max_message = int(max_message)
        self._ctx = zmq.Context()
        r = self._router = self._ctx.socket(zmq.ROUTER)
        r.linger = 0
        r.rcvhwm = 0
        r.setsockopt(zmq.MAXMSGSIZE, self.max_message + wire.MAX_HEADER)
        r.setsockopt(zmq.BACKLOG, BACKLOG)   # a star's root: every rank connects at once
        if ":" in bind_host:
            r.ipv6 = True
        host = f"[{bind_host}]" if ":" in bind_host else bind_host
        try:
            r.bind(f"tcp://{host}:*")
        except zmq.ZMQError as e:
            r.close()
            self._ctx.term()
            raise OSError(f"rank {self.rank}: cannot bind a transport socket on {bind_host!r}: "
                          f"{e} (check HCCL_IF_IP)") from None
        port = r.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1]
        self.address = f"tcp://{host}:{port}"
        self.pairs: dict[int, SocketPair] = {}
        self.addresses: dict[int, str] = {}       # recorded by connect; pairs made at first use
        self.remote: set[int] = set()             # peers whose links carry heartbeats
        self.acks_from: frozenset = frozenset()   # peers whose rings may overflow acknowledgements
        self._lock = threading.Lock()
        self._guard = wire.ReplayGuard()
        self.drops = wire.DropLog(log)
        self._closing = False
        self._monitor_thread: threading.Thread | None = None
        self._new_monitors: deque = deque()       # (monitor socket, peer) for the monitor thread
        self._wake_tx = self._wake_rx = None      # inproc PAIR: "look at _new_monitors"
        self._rx = threading.Thread(target=self._receive, name=f"hccl-rx-rank{self.rank}",
                                    daemon=True)
        self._rx.start()

    # -- set-up ----------------------------------------------------------------------------
    def connect(self, addresses: dict[int, str], remote: set) -> None:
        """Record the address of every rank in ``addresses`` (``{rank: "tcp://host:port"}``;
        this rank and ranks already known are skipped); pairs to the ranks in ``remote`` (other
        or unknown nodes) will carry heartbeats. Opens nothing: ``pair`` does, at first use."""
        with self._lock:
            if self._closing:
                raise TransportClosed(f"rank {self.rank}: transport closed")
            for peer, addr in addresses.items():
                if peer != self.rank and peer not in self.addresses:
                    self.addresses[peer] = addr
                    if peer in remote:
                        self.remote.add(peer)

    def pair(self, peer: int, watch: bool = True) -> SocketPair:
        """The pair of ``peer``, opened now if this is its first use. Never blocks: ZeroMQ
        connects in the background and queues what is sent meanwhile. ``watch=False`` (an ABORT
        to a peer never used) leaves out the link monitor, which costs as much again; a later
        use with ``watch`` adds it."""
        p = self.pairs.get(peer)
        if p is not None and (p.watched or not watch):
            return p
        with self._lock:
            if self._closing:
                raise TransportClosed(f"rank {self.rank}: transport closed")
            p = self.pairs.get(peer)
            if p is None:
                p = self._open(peer, watch)
            elif watch and not p.watched:      # opened for an ABORT, used now
                with p.lock:       # the socket's own thread rule: no send meanwhile
                    self._watch(_monitor_socket(p.sock), peer)
                p.late = p.watched = True
            self.pairs[peer] = p          # published last: a reader without the lock sees it whole
        return p

    def _open(self, peer: int, watch: bool) -> SocketPair:
        """A new pair's DEALER, its monitor (``watch``) attached before it connects to
        ``peer``'s address, so that no event is missed; call with ``_lock`` held."""
        addr = self.addresses.get(peer)
        if addr is None:
            raise ValueError(f"rank {self.rank}: no address of rank {peer}; call connect() "
                             "with it first")
        conn = wire.new_conn_id()
        s = self._ctx.socket(zmq.DEALER)
        s.linger = 0
        s.sndhwm = 0
        s.setsockopt(zmq.MAXMSGSIZE, 1 << 20)   # peers never send on this socket
        s.routing_id = wire.routing_id(_RANK_TAG, self.rank, conn)
        if addr.startswith("tcp://["):
            s.ipv6 = True
        if peer in self.remote:
            hb_ms = max(100, int(config.heartbeat_timeout() * 1000))
            s.setsockopt(zmq.HEARTBEAT_IVL, max(20, hb_ms // 5))
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, hb_ms)
            # libzmq queues its PING behind unsent bytes, so a link cut while a large message
            # is leaving sends no PING and never times out; the kernel's limit on unacknowledged
            # data (TCP_USER_TIMEOUT) breaks that connection instead, after the same time
            s.setsockopt(zmq.TCP_MAXRT, hb_ms)
        if watch:
            self._watch(_monitor_socket(s), peer)
        s.connect(addr)
        p = SocketPair(self, peer, s, conn)
        p.watched = watch
        return p

    def _watch(self, mon: zmq.Socket, peer: int) -> None:
        """Hand a pair's monitor socket to the monitor thread (started at the first); call with
        ``_lock`` held. The socket moves threads once, through the queue's lock and the wake-up
        (a full barrier), as libzmq allows."""
        self._new_monitors.append((mon, peer))
        if self._monitor_thread is None:
            wake = f"inproc://hccl-mon-wake-{id(self):x}"
            self._wake_rx = self._ctx.socket(zmq.PAIR)
            self._wake_rx.linger = 0
            self._wake_rx.bind(wake)
            self._wake_tx = self._ctx.socket(zmq.PAIR)
            self._wake_tx.linger = 0
            self._wake_tx.sndhwm = 0
            self._wake_tx.connect(wake)
            t = threading.Thread(target=self._monitor, daemon=True,
                                 name=f"hccl-mon-rank{self.rank}")
            self._monitor_thread = t
            t.start()
        else:
            self._wake_tx.send(b"", zmq.NOBLOCK)

    def _monitor(self) -> None:
        """Follow the pairs' connection events (see the module note) until the context ends."""
        poller = zmq.Poller()
        wake = self._wake_rx
        poller.register(wake, zmq.POLLIN)
        socks: dict[zmq.Socket, int] = {}
        try:
            while True:
                while self._new_monitors:
                    mon, peer = self._new_monitors.popleft()
                    socks[mon] = peer
                    poller.register(mon, zmq.POLLIN)
                for s, _ in poller.poll():
                    if s is wake:
                        while wake.poll(0):
                            wake.recv()
                        continue
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
            while self._new_monitors:
                self._new_monitors.popleft()[0].close(linger=0)
            wake.close(linger=0)

    def _link_event(self, peer: int, event: int) -> None:
        pair = self.pairs.get(peer)
        if pair is None:               # pair() is still publishing it (it holds the lock)
            with self._lock:
                pair = self.pairs.get(peer)
        if pair is None or self._closing:
            return
        if event == zmq.EVENT_CONNECTED:
            pair.connected = True
        elif event == zmq.EVENT_DISCONNECTED and (pair.connected or pair.late):
            self.owner.link_broken(peer)
        elif event == zmq.EVENT_CONNECT_RETRIED and not pair.connected:
            self.owner.link_broken(peer, "its address refused the connection: its process "
                                         "exited or closed its transport")

    def broadcast_abort(self, comm_id: int, reason: str) -> None:
        """ABORT to every peer (an abort must reach every rank): first the peers already paired
        (those most likely waiting for this rank), then the others through pairs opened for it
        without a link monitor."""
        with self._lock:
            made = set(self.pairs)
        for peer in sorted(made) + sorted(set(self.addresses) - made):
            try:
                pair = self.pair(peer, watch=False)
            except TransportClosed:
                return
            pair.abort(comm_id, reason)

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
            self.owner.close_now()
        finally:
            sock.close(linger=0)

    def _dispatch(self, frames: list) -> None:
        if len(frames) < 2:
            raise wire.BadFrame(f"{len(frames)}-frame message")
        h = wire.unpack(frames[1:], self.secret, dest=self.rank)
        if not 0 <= h.sender < self.size or h.sender == self.rank:
            raise wire.BadFrame(f"sender {h.sender} is not a peer rank of this world")
        if frames[0].bytes != wire.routing_id(_RANK_TAG, h.sender, h.conn):
            raise wire.BadFrame("socket identity does not match the signed sender")
        self._guard.accept(h.sender, h.conn, h.serial)
        # authenticated from here on: what cannot be used is a member's protocol error
        if h.kind == wire.Kind.DATA and len(h.payloads) == 1:
            self.owner.deliver(h.sender, h.comm_id, h.seq, h.step, h.fp, h.payloads[0].buffer)
        elif h.kind == wire.Kind.SHM_ACK and not h.payloads:
            if h.sender not in self.acks_from or not h.step & ACK_STEP:
                self._protocol_error(h, f"rank {h.sender} has no shared-memory ring to this rank "
                                        "(another node, or shared memory is off: NPUSIM_SHM)")
            self.owner.deliver(h.sender, h.comm_id, h.seq, h.step, h.fp, memoryview(b""))
        elif h.kind == wire.Kind.SHM_DATA:
            self._protocol_error(h, "shared-memory notices travel only through the rings")
        elif h.kind == wire.Kind.ABORT:
            self.owner.apply_abort(h.comm_id, h.sender, h.text)
        else:
            self._protocol_error(h, f"not expected with {len(h.payloads)} payload frame(s)")

    def _on_protocol_error(self, e: ProtocolError) -> None:
        if not 0 <= e.sender < self.size or e.sender == self.rank:
            self.drops(f"rank {self.rank}", f"{e} (not a peer rank of this world)")
            return
        log.error("rank %d: %s; aborting every communicator", self.rank, e)
        self.owner.fail(e.sender, str(e))

    def _protocol_error(self, h: wire.Header, why: str):
        raise ProtocolError(f"protocol error: rank {self.rank} cannot use a {h.kind.name} message "
                            f"from rank {h.sender} (comm {h.comm_id:#x}, seq {h.seq}, step "
                            f"{h.step}): {why}", h.sender)

    # -- teardown --------------------------------------------------------------------------
    def close(self, linger: float = 1.0) -> None:
        """Close every socket and stop the threads (idempotent).

        Messages still queued (e.g. an ABORT just sent) get up to ``linger`` seconds to leave;
        what a dead peer never takes is then discarded, so this never hangs.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
            pairs = list(self.pairs.values())
        for pair in pairs:
            with pair.lock:
                pair.closed = True
                pair.sock.close(linger=max(0, int(linger * 1000)))
        if self._wake_tx is not None:
            self._wake_tx.close(linger=0)
        self._ctx.term()   # waits out the lingers; the receiver's recv raises ETERM and exits
        self._rx.join()
        if self._monitor_thread is not None:
            self._monitor_thread.join()


def _monitor_socket(sock: zmq.Socket) -> zmq.Socket:
    return sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
                                   | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_MONITOR_STOPPED)


def _peer(frame) -> str:
    """The remote address libzmq attached to a received frame (for logs)."""
    try:
        return frame.get("Peer-Address")
    except Exception:
        return "?"
