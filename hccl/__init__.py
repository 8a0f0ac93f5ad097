"""npusim hccl: HCCL-style collectives enqueued on runtime streams, over ZeroMQ between processes.

See docs/api.md and docs/algorithms.md. Every collective validates at the call and returns at once;
the result is there when the stream (or an event recorded after it) completes.

Names are imported lazily (PEP 562): ``import hccl.store`` (what npurun needs for the job's
rendezvous) loads ``hccl.store`` and ``hccl.wire`` over pyzmq and the standard library, and of
the runtime only its light package (``runtime.aliases``, ``config``, ``log``): no numpy
(``tests/unit/test_call_path_imports.py``). The first
collective name loads the call path: collectives -> call -> algo.executor -> transport, each
module once, top to bottom (no import cycles in hccl).

Old module paths are aliases, not files: ``import hccl.schedule`` (now ``hccl.algo.schedule``)
or ``import hccl.torch_backend`` (now ``hccl.torch.backend``) gives the module at its new path,
the same object (so patches and isinstance checks see one module), imported when first asked
for (``_ALIASES``, resolved by runtime's one alias finder, ``runtime/aliases.py``).
"""
from __future__ import annotations

import importlib

from runtime import aliases as _aliases

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

_SUBMODULES = {"algo", "bench", "call", "collectives", "comm", "config", "diag", "errors",
               "executor", "flight", "fusion", "init", "plan", "reduction", "result", "schedule",
               "store", "transport", "types", "wire"}

# old path -> the module's path now (moved into hccl/algo/ and hccl/torch/), served by runtime's
# one alias finder (runtime/aliases.py)
_ALIASES = {
    "executor": "algo.executor", "fusion": "algo.fusion", "plan": "algo.plan",
    "reduction": "algo.reduction", "rooted": "algo.rooted", "schedule": "algo.schedule",
    "steps": "algo.steps",
    "torch_backend": "torch.backend", "torch_p2p": "torch.p2p",
    "torch_rendezvous": "torch.rendezvous", "torch_sparse": "torch.sparse",
    "torch_work": "torch.work"}
_aliases.install(__name__, _ALIASES)

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
    return _aliases.bind(globals(), name, mod)


def __dir__():
    return __all__
