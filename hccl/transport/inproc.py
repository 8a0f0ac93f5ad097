"""Ranks as threads of one process: the transport behind the fast threaded collective tests.

``send`` copies the payload into the peer's mailbox at once, so every handle is complete on
return; matching, mismatch, abort and timeout semantics are those of ``base.Transport``.
"""
from __future__ import annotations

import threading
from typing import Any

from hccl.transport.base import DONE, Fingerprint, SendHandle, Transport, as_bytes_view, norm_fp


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


class InprocTransport(Transport):
    """One rank's endpoint on an ``InprocFabric``."""

    def __init__(self, fabric: InprocFabric, rank: int):
        super().__init__(rank, fabric.size)
        self._fabric = fabric

    def send(self, peer: int, comm_id: int, seq: int, step: int, fp: Fingerprint,
             payload: Any) -> SendHandle:
        self.check_send(peer, comm_id)
        data = memoryview(bytearray(as_bytes_view(payload)))   # the copy: payload is reusable
        self._fabric.transport(peer).deliver(self.rank, comm_id, seq, step, norm_fp(fp), data)
        return DONE

    def broadcast_abort(self, comm_id: int, reason: str) -> None:
        for r in range(self.size):
            if r != self.rank:
                self._fabric.transport(r).apply_abort(comm_id, self.rank, reason)
