"""npusim hccl: HCCL-style collectives enqueued on runtime streams, over ZeroMQ between processes.

See docs/api.md and docs/algorithms.md. Every collective validates at the call and returns at once;
the result is there when the stream (or an event recorded after it) completes.

Names are imported lazily (PEP 562): ``import hccl.store`` (what npurun needs for the job's
rendezvous) loads ``hccl.store`` and ``hccl.wire`` over pyzmq and the standard library, nothing
else of npusim: no numpy, no runtime (``tests/unit/test_call_path_imports.py``). The first
collective name loads the call path: collectives -> call -> executor -> transport, each module
once, top to bottom (no import cycles in hccl).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "all_gather": "collectives", "all_reduce": "collectives", "all_to_all": "collectives",
    "barrier": "collectives", "broadcast": "collectives", "recv": "collectives",
    "reduce": "collectives", "reduce_scatter": "collectives", "send": "collectives",
    "Comm": "comm",
    "CollectiveMismatchError": "errors", "HcclError": "errors", "HcclTimeoutError": "errors",
    "InvalidArgumentError": "errors", "RemoteRankError": "errors",
    "comm_init_root_info": "init", "get_root_info": "init", "init_comm": "init",
    "DataType": "types", "ReduceOp": "types", "Result": "types",
}

_SUBMODULES = {"bench", "call", "collectives", "comm", "config", "diag", "errors", "executor",
               "flight", "fusion", "init", "plan", "reduction", "result", "schedule", "store",
               "transport", "types", "wire"}

__all__ = sorted([*_EXPORTS, "errors", "flight_recorder"])


def __getattr__(name: str):
    if name == "flight_recorder":
        from .flight import recorder
        return recorder
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'hccl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
