"""Ranks as threads of one process: the transport behind the fast threaded collective tests.

One ``InprocPair`` per peer: its ``send`` copies the payload into the peer's mailbox at once, so
every handle is complete on return; its receives are ``base.MailboxPair``'s, and matching,
mismatch, abort and timeout semantics are those of ``base.Transport``.
"""
from __future__ import annotations

import threading
from typing import Any

from hccl.transport.base import DONE, LoopbackPair, MailboxPair, SendHandle, Transport


class InprocFabric:
    """The shared medium of ``size`` in-process ranks; ``transport(rank)`` is rank's endpoint."""

    def __init__(self, size: int):
        if not (isinstance(size, int) and size >= 1):
            raise ValueError(f"fabric size must be an int >= 1, got {size!r}")
        self.size = size
        self._lock = threading.Lock()
        self._endpoints: dict[int, InprocTransport] = {}

    def transport(self, rank: int) -> "InprocTransport":
        """The endpoint of ``rank`` (the same object on every call)."""
        if not (isinstance(rank, int) and 0 <= rank < self.size):
            raise ValueError(f"rank {rank!r} is not in [0, {self.size})")
        with self._lock:
            t = self._endpoints.get(rank)
            if t is None:
                t = self._endpoints[rank] = InprocTransport(self, rank)
            return t

    def close(self) -> None:
        """Close every endpoint."""
        with self._lock:
            endpoints = list(self._endpoints.values())
        for t in endpoints:
            t.close()


class InprocPair(MailboxPair):
    """Rank ``peer`` of the fabric, seen from ``t``."""

    __slots__ = ("t", "peer", "_to")

    def __init__(self, t: "InprocTransport", peer: int, to: "InprocTransport"):
        self.t, self.peer, self._to = t, peer, to

    def send(self, comm_id, seq, step, fp, mv) -> SendHandle:
        t = self.t
        t.check_open(comm_id)
        self._to.deliver(t.rank, comm_id, seq, step, fp, memoryview(bytearray(mv)))  # reusable
        return DONE


class InprocTransport(Transport):
    """One rank's endpoint on an ``InprocFabric``."""

    solo_bytes = 1 << 62        # every send is a copy into the peer's mailbox

    def __init__(self, fabric: InprocFabric, rank: int):
        super().__init__(rank, fabric.size)
        self._fabric = fabric
        self._pairs: dict = {rank: LoopbackPair(self)}

    def pair(self, peer: int):
        p = self._pairs.get(peer)
        if p is None:
            self.check_peer(peer)
            p = self._pairs[peer] = InprocPair(self, peer, self._fabric.transport(peer))
        return p

    def broadcast_abort(self, comm_id: int, reason: str) -> None:
        for r in range(self.size):
            if r != self.rank:
                self._fabric.transport(r).apply_abort(comm_id, self.rank, reason)
