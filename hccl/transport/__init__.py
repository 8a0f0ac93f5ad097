"""Transports under the collective executor: ``inproc`` (ranks as threads) and ``process``
(ranks as processes: a router over one pair per peer, ``zmq.SocketPair`` or, for a peer of this
node, ``local.LocalPair`` over the shared-memory rings of ``shm``).

See ``hccl.transport.base`` for the interface and its matching / mismatch / abort semantics.
"""
from hccl.transport.base import (Aborted, Fingerprint, FingerprintMismatch, PeerTimeout,
                                 SendHandle, Transport, TransportClosed, TransportError)
from hccl.transport.inproc import InprocFabric, InprocTransport
from hccl.transport.process import ProcessTransport

__all__ = ["Aborted", "Fingerprint", "FingerprintMismatch", "InprocFabric", "InprocTransport",
           "PeerTimeout", "ProcessTransport", "SendHandle", "Transport", "TransportClosed",
           "TransportError"]
