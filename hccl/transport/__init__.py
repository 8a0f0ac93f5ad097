"""Transports under the collective executor: ``inproc`` (ranks as threads) and ``zmq`` (processes).

See ``hccl.transport.base`` for the interface and its matching / mismatch / abort semantics.
"""
from hccl.transport.base import (Aborted, Fingerprint, FingerprintMismatch, PeerTimeout,
                                 SendHandle, Transport, TransportClosed, TransportError)
from hccl.transport.inproc import InprocFabric, InprocTransport
from hccl.transport.zmq import ZmqTransport

__all__ = ["Aborted", "Fingerprint", "FingerprintMismatch", "InprocFabric", "InprocTransport",
           "PeerTimeout", "SendHandle", "Transport", "TransportClosed", "TransportError",
           "ZmqTransport"]
