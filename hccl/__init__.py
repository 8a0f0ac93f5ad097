"""npusim hccl: HCCL-style collectives enqueued on runtime streams, over ZeroMQ between processes.

See SPEC §2 and docs/algorithms.md. Every collective validates at the call and returns at once;
the result is there when the stream (or an event recorded after it) completes.
"""
import os as _os

from runtime import callsite as _callsite
from runtime.log import setup as _setup_log

from . import errors
from .collectives import (all_gather, all_reduce, all_to_all, barrier, broadcast, recv, reduce,
                          reduce_scatter, send)
from .comm import Comm
from .errors import (CollectiveMismatchError, HcclError, HcclTimeoutError, InvalidArgumentError,
                     RemoteRankError)
from .flight import recorder as flight_recorder
from .init import comm_init_root_info, get_root_info, init_comm
from .types import DataType, ReduceOp, Result

# collective failures surface from stream synchronize with their own type (and as TaskError)
HcclError.npusim_surface = True
_callsite.add_internal(_os.path.dirname(_os.path.abspath(__file__)))
_setup_log("hccl")

__all__ = [
    "CollectiveMismatchError", "Comm", "DataType", "HcclError", "HcclTimeoutError",
    "InvalidArgumentError", "ReduceOp", "RemoteRankError", "Result", "all_gather", "all_reduce",
    "all_to_all", "barrier", "broadcast", "comm_init_root_info", "errors", "flight_recorder",
    "get_root_info", "init_comm", "recv", "reduce", "reduce_scatter", "send",
]
