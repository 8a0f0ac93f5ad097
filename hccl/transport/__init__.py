"""Transports under the collective executor: ``inproc`` (ranks as threads), ``zmq`` (processes)
and ``node`` (processes; the node's ranks over the shared-memory channel of ``shm``).

See ``hccl.transport.base`` for the interface and its matching / mismatch / abort semantics.
"""
from hccl.transport.base import (Aborted, Fingerprint, FingerprintMismatch, PeerTimeout,
                                 SendHandle, Transport, TransportClosed, TransportError)
from hccl.transport.inproc import InprocFabric, InprocTransport
from hccl.transport.node import NodeTransport
from hccl.transport.zmq import ZmqTransport

__all__ = ["Aborted", "Fingerprint", "FingerprintMismatch", "InprocFabric", "InprocTransport",
           "NodeTransport", "PeerTimeout", "SendHandle", "Transport", "TransportClosed",
           "TransportError", "ZmqTransport"]
