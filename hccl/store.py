"""The job's rendezvous key-value store (TCPStore semantics) over authenticated ZeroMQ.

Design note. ``StoreServer`` owns one ROUTER socket served by one daemon thread: it holds the
data, and a blocking ``get``/``wait`` whose keys are missing becomes a *waiter* parked
server-side (indexed by the keys it misses, plus a deadline heap) that a ``set``/``add``/
``compare_set`` of those keys wakes, or its deadline answers with TIMEOUT and the missing keys.
The thread sleeps in ``poll`` until a message, the next deadline or ``close`` (an inproc pair),
so an idle store costs no CPU; on close it answers parked waiters with an error.

Many clients (256 ranks at a barrier). No thread per client: one thread serves every request,
and a parked waiter costs nothing until a key it misses is set. A set of key k touches only the
waiters registered on k, and each of them only drops k from its own missing set; a waiter's keys
are looked at again only when that set is empty (to see none was deleted since). So a barrier
of N ranks, each waiting for the N keys of all, costs O(N^2) work in all, not O(N^3) (each of N
sets rescanning N waiters' N keys: 16 M key lookups at world 256 in the one serving thread).
``get`` of several keys (``multi_get``) answers them in one reply, so one rank can gather what
every rank published with one request instead of N round trips.

Every message is a ``hccl.wire`` message signed with the job secret. A message that fails
``wire.unpack``, whose ZeroMQ identity does not match its signed ``(sender, conn)``, or that
replays a serial, is dropped and logged (rate-limited) on ``hccl.store``: a stranger can neither
crash, block nor slow the server. An authenticated request the server cannot use (not a store
kind, several keys where one is expected, a newer wire version) is a member's: it is answered
with ERROR naming the reason, so the client raises ``StoreError`` instead of timing out. ``ZMQ_MAXMSGSIZE`` makes libzmq drop a connection that announces
a frame larger than ``max_message`` before allocating it.

The client (``StoreClient``) and the errors both sides raise live in ``hccl.store_client``;
this module re-exports them, so ``from hccl.store import StoreClient`` works as ever.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time

import zmq

from hccl import wire
from hccl.store_client import (CLIENT_TAG, MAX_MESSAGE, StoreClient, StoreError, StoreTimeout,
                               tcp_address)
from hccl.wire import Kind

__all__ = ["BACKLOG", "MAX_MESSAGE", "StoreClient", "StoreError", "StoreServer", "StoreTimeout"]

log = logging.getLogger("hccl.store")

BACKLOG = 1024             # pending connections a listening socket queues (libzmq's default: 100)
_MAX_POLL_MS = 60_000
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _peer(frame) -> str:
    """The remote address libzmq attached to a received frame (for logs)."""
    try:
        return frame.get("Peer-Address")
    except Exception:
        return "?"


class _Waiter:
    __slots__ = ("ident", "sender", "conn", "serial", "kind", "keys", "registered", "deadline",
                 "timeout", "done", "parked")

    def __init__(self, ident, h: wire.Header, keys, timeout: float):
        self.ident, self.sender, self.conn, self.serial = ident, h.sender, h.conn, h.serial
        self.kind, self.keys, self.timeout = h.kind, keys, timeout
        self.deadline = time.monotonic() + timeout
        self.registered: set[str] = set()
        self.done = self.parked = False


class StoreServer:
    """Serve the rendezvous store on ``host:port`` (port 0 = a free port), authenticated by ``secret``.

    Binds at construction (``.host``, ``.port``, ``.address`` are valid at once); ``start()``
    serves in a daemon thread; ``close()`` stops it. Usable as a context manager.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: bytes | None = None, *,
                 name: str = "store", max_message: int = MAX_MESSAGE):
        if secret is None:
            raise ValueError("StoreServer needs the job secret (bytes)")
        self._secret = wire.check_secret(secret)
        self.name, self.host = name, host
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_message)
        self._sock.sndhwm = 0          # replies are never blocked (ROUTER drops for gone peers)
        # every rank connects at once (two connections each at world 256: init and the diag
        # reporter); past libzmq's listen backlog of 100 the kernel drops SYNs and a client
        # waits out a 1 s retransmission (the kernel caps it at net.core.somaxconn)
        self._sock.setsockopt(zmq.BACKLOG, BACKLOG)
        if ":" in host:
            self._sock.ipv6 = True
        try:
            self._sock.bind(tcp_address(host, port if port else "*"))
        except zmq.ZMQError as e:
            self._sock.close()
            self._ctx.term()
            raise OSError(f"{name}: cannot bind {tcp_address(host, port)}: {e} (port in use? pick another "
                          f"MASTER_PORT or 0 for a free one)") from None
        self.port = int(self._sock.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
        self.address = tcp_address(host, self.port)
        self._data: dict[str, bytes] = {}
        self._waiting: dict[str, set[_Waiter]] = {}
        self._deadlines: list = []
        self._tick = itertools.count()
        self._serial = itertools.count(1)
        self._guard = wire.ReplayGuard()
        self.drops = wire.DropLog(log)
        self._parked = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        # close() wakes the serving thread through this pair, so it can answer parked waiters
        self._wake_rx = self._ctx.socket(zmq.PAIR)
        self._wake_tx = self._ctx.socket(zmq.PAIR)
        wake = f"inproc://hccl-store-wake-{id(self):x}"
        self._wake_rx.bind(wake)
        self._wake_tx.connect(wake)
        for s in (self._wake_rx, self._wake_tx):
            s.linger = 0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "StoreServer":
        """Serve in a daemon thread; returns self."""
        if self._closed:
            raise StoreError(f"{self.name}: start() after close()")
        if self._thread is None:
            tname = self.name if self.name.startswith("hccl") else f"hccl-{self.name}"
            self._thread = threading.Thread(target=self._serve, name=tname, daemon=True)
            self._thread.start()
            log.info("%s serving on %s", self.name, self.address)
        return self

    def close(self) -> None:
        """Stop serving: parked ``get``/``wait`` calls are answered with an error, then the
        sockets are released (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._wake_tx.send(b"close")
            self._thread.join()
        else:
            self._sock.close(linger=0)
            self._wake_rx.close()
        self._wake_tx.close()
        self._ctx.term()

    def stats(self) -> dict:
        """``{"keys", "waiters", "dropped"}``: stored keys, parked get/wait calls, dropped messages."""
        return {"keys": len(self._data), "waiters": self._parked, "dropped": self.drops.dropped}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # -- serving loop ----------------------------------------------------------------------
    def _serve(self) -> None:
        sock = self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        linger = 0
        try:
            while True:
                ready = dict(poller.poll(self._poll_timeout_ms()))
                if self._wake_rx in ready:
                    linger = self._answer_all_waiters()
                    break
                if sock in ready:
                    for _ in range(512):   # drain a batch, then look at deadlines again
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        try:
                            self._handle(frames)
                        except Exception:   # a bug here must not kill the store
                            log.exception("%s: internal error handling a request", self.name)
                self._expire()
        except zmq.ContextTerminated:
            pass
        except Exception:
            log.exception("%s: serving thread failed", self.name)
        finally:
            sock.close(linger=linger)
            self._wake_rx.close()

    def _answer_all_waiters(self) -> int:
        """On close: tell every parked request the store is gone; the linger (ms) to send it."""
        n = 0
        for _, _, w in self._deadlines:
            if not w.done:
                self._finish(w)
                n += 1
                missing = [k for k in w.keys if k not in self._data]
                self._reply(w.ident, w, Kind.ERROR,
                            text=f"{self.name} was closed while waiting for key(s) {missing}")
        self._deadlines.clear()
        self._waiting.clear()
        return 200 if n else 0

    def _poll_timeout_ms(self) -> int | None:
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        if not self._deadlines:
            return None
        # capped: a request may ask to wait ~2^63 ms, more than poll() takes
        return max(0, min(_MAX_POLL_MS, math.ceil((self._deadlines[0][0] - time.monotonic()) * 1000)))

    def _handle(self, frames) -> None:
        if len(frames) < 2:
            self.drops(self.name, f"{len(frames)}-frame message from {_peer(frames[-1])}")
            return
        ident = frames[0].bytes
        try:
            try:
                h = wire.unpack(frames[1:], self._secret, dest=wire.STORE_ID)
            except wire.UnusableFrame as e:
                h, refused = e, str(e)       # a member's: answered below, not dropped
            else:
                refused = _refusal(h)
            if ident != wire.routing_id(CLIENT_TAG, h.sender, h.conn):
                raise wire.BadFrame("socket identity does not match the signed sender")
            self._guard.accept(h.sender, h.conn, h.serial)
        except wire.BadFrame as e:
            self.drops(self.name, f"{e} (from {_peer(frames[-1])})")
            return
        if refused:
            log.warning("%s: refused a request of sender %d: %s", self.name, h.sender, refused)
            self._reply(ident, h, Kind.ERROR, text=f"{self.name} cannot use this request: {refused}")
            return
        _HANDLERS[h.kind](self, ident, h)

    def _reply(self, ident: bytes, h, kind: Kind, *, value: int = 0, text: str = "",
               payloads=()) -> None:
        frames = wire.pack(self._secret, kind, sender=wire.STORE_ID, dest=h.sender, conn=h.conn,
                           serial=next(self._serial), seq=h.serial, value=value, text=text,
                           payloads=payloads)
        try:
            self._sock.send_multipart([ident, *frames], copy=False)
        except zmq.ZMQError as e:   # peer gone or queue trouble: never stall the store
            log.debug("%s: reply dropped: %s", self.name, e)

    # -- requests --------------------------------------------------------------------------
    def _put(self, key: str, value: bytes) -> None:
        self._data[key] = value
        waiters = self._waiting.pop(key, None)
        if not waiters:
            return
        for w in waiters:
            if w.done:
                continue
            w.registered.discard(key)
            if not w.registered:       # the last key it missed: look at all of them once
                self._try_finish(w)

    def _try_finish(self, w: _Waiter) -> bool:
        """Answer ``w`` if all its keys are set, else register it on the missing ones."""
        data = self._data
        missing = [k for k in w.keys if k not in data]
        if missing:
            for k in missing:
                if k not in w.registered:
                    w.registered.add(k)
                    self._waiting.setdefault(k, set()).add(w)
            return False
        self._finish(w)
        if w.kind == Kind.GET:
            self._reply(w.ident, w, Kind.OK, payloads=[data[k] for k in w.keys])
        else:
            self._reply(w.ident, w, Kind.OK)
        return True

    def _finish(self, w: _Waiter) -> None:
        w.done = True
        self._unregister(w)
        if w.parked:
            self._parked -= 1

    def _unregister(self, w: _Waiter) -> None:
        for k in w.registered:
            s = self._waiting.get(k)
            if s is not None:
                s.discard(w)
                if not s:
                    del self._waiting[k]
        w.registered.clear()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            w = heapq.heappop(self._deadlines)[2]
            if w.done:
                continue
            self._finish(w)
            missing = [k for k in w.keys if k not in self._data]
            self._reply(w.ident, w, Kind.TIMEOUT, text="\0".join(missing),
                        value=int(w.timeout * 1000))

    def _blocking(self, ident, h, keys: list[str]) -> None:
        w = _Waiter(ident, h, keys, max(0, h.value) / 1000.0)
        if self._try_finish(w):
            return
        heapq.heappush(self._deadlines, (w.deadline, next(self._tick), w))
        w.parked = True
        self._parked += 1
        if h.value <= 0:
            self._expire()

    def _on_set(self, ident, h) -> None:
        if len(h.payloads) != 1:
            self._reply(ident, h, Kind.ERROR, text="SET needs exactly one value frame")
            return
        self._put(h.text, h.payloads[0].bytes)
        self._reply(ident, h, Kind.OK)

    def _on_get(self, ident, h) -> None:
        self._blocking(ident, h, h.text.split("\0"))

    def _on_wait(self, ident, h) -> None:
        self._blocking(ident, h, h.text.split("\0"))

    def _on_check(self, ident, h) -> None:
        ok = all(k in self._data for k in h.text.split("\0"))
        self._reply(ident, h, Kind.OK, value=int(ok))

    def _on_delete(self, ident, h) -> None:
        existed = self._data.pop(h.text, None) is not None
        self._reply(ident, h, Kind.OK, value=int(existed))

    def _on_add(self, ident, h) -> None:
        cur = self._data.get(h.text, b"0")
        try:
            n = int(cur.decode("ascii")) + h.value
        except (UnicodeDecodeError, ValueError):
            self._reply(ident, h, Kind.ERROR,
                        text=f"add({h.text!r}): the stored value {cur[:40]!r} is not an integer")
            return
        if not _INT64[0] <= n <= _INT64[1]:
            self._reply(ident, h, Kind.ERROR, text=f"add({h.text!r}): {n} overflows int64")
            return
        self._put(h.text, str(n).encode("ascii"))
        self._reply(ident, h, Kind.OK, value=n)

    def _on_compare_set(self, ident, h) -> None:
        if len(h.payloads) != 2:
            self._reply(ident, h, Kind.ERROR, text="COMPARE_SET needs expected and desired frames")
            return
        expected, desired = h.payloads[0].bytes, h.payloads[1].bytes
        cur = self._data.get(h.text)
        # TCPStore semantics: a missing key is created only when `expected` is empty.
        if (cur is None and expected == b"") or (cur is not None and cur == expected):
            self._put(h.text, desired)
            cur = desired
        elif cur is None:
            cur = expected
        self._reply(ident, h, Kind.OK, payloads=[cur])


def _refusal(h: wire.Header) -> str:
    """Why the store cannot serve an authenticated message, or "" if it can."""
    if h.kind not in _HANDLERS:
        return f"{h.kind.name} is not a store request kind"
    if h.kind in _ONE_KEY and "\0" in h.text:
        return f"{h.kind.name} takes one key, got {h.text.count(chr(0)) + 1} NUL-separated keys"
    return ""


_ONE_KEY = frozenset({Kind.SET, Kind.ADD, Kind.DELETE, Kind.COMPARE_SET})
_HANDLERS = {
    Kind.SET: StoreServer._on_set, Kind.GET: StoreServer._on_get, Kind.ADD: StoreServer._on_add,
    Kind.WAIT: StoreServer._on_wait, Kind.CHECK: StoreServer._on_check,
    Kind.DELETE: StoreServer._on_delete, Kind.COMPARE_SET: StoreServer._on_compare_set,
}


