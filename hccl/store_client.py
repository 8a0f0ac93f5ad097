"""The client of the job's rendezvous store (``hccl.store.StoreServer``), and the errors both
sides raise.

``StoreClient`` is thread-safe by giving each calling thread its own DEALER connection (one
outstanding request per connection, replies matched by request serial), so a thread blocked in
``get`` never holds up another thread's ``set`` on the same client.
Every request is a ``hccl.wire`` message signed with the job secret; a reply that fails
``wire.unpack`` or answers another request is dropped and logged on ``hccl.store``. Like
``hccl.store``, this module loads pyzmq and the standard library only (no numpy, no runtime).
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Iterable

import zmq

from hccl import wire
from hccl.wire import Kind

log = logging.getLogger("hccl.store")

MAX_MESSAGE = 64 << 20
CLIENT_TAG = b"C"          # the first byte of a client's ZeroMQ identity


class StoreError(RuntimeError):
    """The store refused a request (e.g. ``add`` on a non-integer value) or the client is closed."""


class StoreTimeout(TimeoutError):
    """A store request ran out of time; ``missing`` lists the keys that were not there."""

    def __init__(self, message: str, missing: Iterable[str] = ()):
        super().__init__(message)
        self.missing = list(missing)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "store timeout"


def tcp_address(host: str, port) -> str:
    """The ZeroMQ endpoint of ``host:port`` (an IPv6 host in brackets)."""
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class _Conn:
    """One thread's DEALER connection to the store."""

    __slots__ = ("sock", "conn", "serial", "busy", "closed", "thread")

    def __init__(self, sock, conn: int):
        self.sock, self.conn, self.serial = sock, conn, 0
        self.busy = self.closed = False
        self.thread = threading.current_thread()


class StoreClient:
    """A thread-safe client of the rendezvous store at ``host:port``.

    ``timeout`` (s) bounds every request and is the default of ``get``/``wait``. Blocking
    requests are held by the server; when they run out they raise ``StoreTimeout`` whose
    ``.missing`` lists the keys that were not set. Server-side refusals raise ``StoreError``.
    """

    def __init__(self, host: str, port: int, secret: bytes, *, timeout: float):
        if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
            raise ValueError(f"StoreClient timeout must be a positive number of seconds, "
                             f"got {timeout!r}")
        self._secret = wire.check_secret(secret)
        self.address = tcp_address(host, port)
        self._ipv6 = ":" in host
        self.timeout = float(timeout)
        self._sender = os.getpid() & 0xFFFFFFFF
        self._pid = os.getpid()
        self._ctx: zmq.Context | None = None
        self._local = threading.local()
        self._conns: list[_Conn] = []
        self._reg = threading.Lock()
        self._closed = False
        self.drops = wire.DropLog(log)

    # -- public API ------------------------------------------------------------------------
    def set(self, key: str, value: bytes, timeout: float | None = None) -> None:
        """Store ``value`` (bytes, or str as utf-8) under ``key``, waking waiters of ``key``;
        ``StoreTimeout`` after ``timeout`` s without a reply (default: the client's)."""
        self._request(Kind.SET, [key], payloads=[_as_bytes(value)], budget=timeout)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting up to ``timeout`` (default: the client's) for it."""
        t = self._timeout(timeout)
        h = self._request(Kind.GET, [key], value=int(t * 1000), wait=t)
        return h.payloads[0].bytes

    def multi_get(self, keys: list[str], timeout: float | None = None) -> list[bytes]:
        """The values of ``keys`` (in order) in one request, waiting up to ``timeout`` (default:
        the client's) until every one is set; ``StoreTimeout`` lists the missing ones."""
        keys = list(keys)
        if not keys:
            return []
        t = self._timeout(timeout)
        h = self._request(Kind.GET, keys, value=int(t * 1000), wait=t)
        if len(h.payloads) != len(keys):
            raise StoreError(f"rendezvous store at {self.address} answered {len(h.payloads)} "
                             f"values for {len(keys)} keys (an older npusim store?)")
        return [f.bytes for f in h.payloads]

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (0 if missing); return the new value."""
        return self._request(Kind.ADD, [key], value=int(amount)).value

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` is set; ``StoreTimeout`` lists the missing ones."""
        keys = list(keys)
        if keys:
            t = self._timeout(timeout)
            self._request(Kind.WAIT, keys, value=int(t * 1000), wait=t)

    def check(self, keys: list[str]) -> bool:
        """True if every key in ``keys`` is set (does not wait)."""
        keys = list(keys)
        return not keys or bool(self._request(Kind.CHECK, keys).value)

    def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        return bool(self._request(Kind.DELETE, [key]).value)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is
        empty); return the value after the operation (TCPStore semantics)."""
        h = self._request(Kind.COMPARE_SET, [key],
                          payloads=[_as_bytes(expected), _as_bytes(desired)])
        return h.payloads[0].bytes

    def close(self) -> None:
        """Close every connection of this client (idempotent). Blocked requests raise StoreError."""
        with self._reg:
            if self._closed:
                return
            self._closed = True
            for c in self._conns:
                if not c.busy and not c.closed:
                    c.sock.close(linger=0)
                    c.closed = True
            ctx = self._ctx
        if ctx is not None:
            ctx.term()   # interrupts busy connections; their threads close them

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals -------------------------------------------------------------------------
    def _timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.timeout
        if not 0 <= timeout < math.inf:
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        return float(timeout)

    def _acquire(self) -> _Conn:
        if os.getpid() != self._pid:
            raise StoreError("StoreClient used in a forked child; create a new client there")
        c = getattr(self._local, "conn", None)
        with self._reg:
            if self._closed:
                raise StoreError(f"store client of {self.address} is closed")
            if c is None or c.closed:
                if self._ctx is None:
                    self._ctx = zmq.Context()
                self._reap()
                conn = wire.new_conn_id()
                s = self._ctx.socket(zmq.DEALER)
                s.linger = 0
                s.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE + (1 << 20))
                s.routing_id = wire.routing_id(CLIENT_TAG, self._sender, conn)
                if self._ipv6:
                    s.ipv6 = True
                s.connect(self.address)
                c = _Conn(s, conn)
                self._conns.append(c)
                self._local.conn = c
            c.busy = True
        return c

    def _reap(self) -> None:
        """Close connections of threads that have exited (called with ``_reg`` held)."""
        keep = []
        for c in self._conns:
            if not c.closed and not c.busy and not c.thread.is_alive():
                c.sock.close(linger=0)
                c.closed = True
            if not c.closed:
                keep.append(c)
        self._conns = keep

    def _release(self, c: _Conn) -> None:
        with self._reg:
            c.busy = False
            if self._closed and not c.closed:
                c.sock.close(linger=0)
                c.closed = True

    def _request(self, kind: Kind, keys: list[str], *, value: int = 0, payloads=(),
                 wait: float = 0.0, budget: float | None = None) -> wire.Header:
        for k in keys:
            if not isinstance(k, str) or "\0" in k:
                raise ValueError(f"store keys are str without NUL characters, got {k!r}")
        if sum(len(p) for p in payloads) > MAX_MESSAGE - wire.MAX_HEADER:
            raise ValueError(f"store values are limited to {MAX_MESSAGE >> 20} MiB")
        c = self._acquire()
        try:
            c.serial += 1
            frames = wire.pack(self._secret, kind, sender=self._sender, dest=wire.STORE_ID,
                               conn=c.conn, serial=c.serial, value=value, text="\0".join(keys),
                               payloads=payloads)
            if budget is None:
                budget = wait + max(1.0, 0.05 * wait) if wait else self.timeout
            deadline = time.monotonic() + budget
            c.sock.send_multipart(frames, copy=False)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeout(
                        f"no reply from the rendezvous store at {self.address} within "
                        f"{budget:.1f} s to {kind.name} {keys}: is it running and reachable, and "
                        f"does this process have the job's secret?",
                        keys if kind in (Kind.GET, Kind.WAIT) else ())
                if not c.sock.poll(max(1, math.ceil(left * 1000))):
                    continue
                reply = c.sock.recv_multipart(copy=False)
                try:
                    h = wire.unpack(reply, self._secret, dest=self._sender)
                except wire.UnusableFrame as e:    # the job's store, so an error, not noise
                    raise StoreError(f"rendezvous store at {self.address} sent a reply this "
                                     f"client cannot use ({e}) to {kind.name} {keys}") from None
                except wire.BadFrame as e:
                    self.drops(f"store client of {self.address}", e)
                    continue
                if h.sender != wire.STORE_ID or h.conn != c.conn or h.seq != c.serial:
                    continue   # a late answer to an earlier request that timed out
                break
        except zmq.ContextTerminated:
            raise StoreError(f"store client of {self.address} was closed during {kind.name}") \
                from None
        finally:
            self._release(c)
        if h.kind == Kind.OK:
            return h
        if h.kind == Kind.TIMEOUT:
            missing = h.text.split("\0")   # a TIMEOUT always names at least one key
            raise StoreTimeout(f"rendezvous store at {self.address}: key(s) {missing} not set "
                               f"within {h.value / 1000:.1f} s", missing)
        raise StoreError(f"rendezvous store at {self.address}: {h.text}")


def _as_bytes(value) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    return bytes(memoryview(value).cast("B"))
