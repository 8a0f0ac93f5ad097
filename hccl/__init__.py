"""npusim hccl: HCCL-style collectives enqueued on runtime streams, over ZeroMQ between processes.

See docs/api.md and docs/algorithms.md. Every collective validates at the call and returns at once;
the result is there when the stream (or an event recorded after it) completes.

Names are imported lazily (PEP 562): ``import hccl.store`` (what npurun needs for the job's
rendezvous) loads ``hccl.store`` and ``hccl.wire`` over pyzmq and the standard library, nothing
else of npusim: no numpy, no runtime (``tests/unit/test_call_path_imports.py``). The first
collective name loads the call path: collectives -> call -> algo.executor -> transport, each
module once, top to bottom (no import cycles in hccl).

Old module paths are aliases, not files: ``import hccl.schedule`` (now ``hccl.algo.schedule``)
or ``import hccl.torch_backend`` (now ``hccl.torch.backend``) gives the module at its new path,
the same object (so patches and isinstance checks see one module), imported when first asked
for (``_ALIASES``, resolved by the finder ``_Alias`` this package puts on ``sys.meta_path``).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

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

# old path -> the module's path now (moved into hccl/algo/ and hccl/torch/)
_ALIASES = {f"{__name__}.{old}": f"{__name__}.{new}" for old, new in {
    "executor": "algo.executor", "fusion": "algo.fusion", "plan": "algo.plan",
    "reduction": "algo.reduction", "rooted": "algo.rooted", "schedule": "algo.schedule",
    "steps": "algo.steps",
    "torch_backend": "torch.backend", "torch_p2p": "torch.p2p",
    "torch_rendezvous": "torch.rendezvous", "torch_sparse": "torch.sparse",
    "torch_work": "torch.work"}.items()}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path of ``_ALIASES`` as the module at its new path (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _ALIASES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(_ALIASES[spec.name])
        spec.loader_state = module.__spec__     # the import system sets __spec__ to ``spec``
        return module

    def exec_module(self, module):              # the module at the new path ran already:
        module.__spec__ = module.__spec__.loader_state  # only its own spec is put back


if not any(type(f).__name__ == "_Alias" and f.__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.append(_Alias())

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
