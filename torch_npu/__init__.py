"""npusim's torch_npu: ``import torch_npu`` gives torch an ``npu`` device backed by npusim.

A torch_npu script runs unchanged on simulated NPUs: tensors on ``npu:N`` live in npusim device
memory of simulated NPU N, their operators run on npusim streams with torch's CPU kernels, and
``torch.npu`` has torch_npu's names (docs/torch.md, "The npu device").

It never shadows a real torch_npu: when another ``torch_npu`` package is importable from
``sys.path`` (Huawei's, for real Ascend NPUs), importing this one loads that one in its place.
``NPUSIM_TORCH_NPU=1`` forces npusim's (e.g. to simulate on a machine that has both).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _real_torch_npu():
    """The spec of a torch_npu package other than this one on sys.path, or None."""
    if os.environ.get("NPUSIM_TORCH_NPU") == "1":
        return None
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("torch_npu", others)
    if spec is None or spec.origin is None:
        return None
    if os.path.dirname(os.path.dirname(os.path.abspath(spec.origin))) == _HERE:
        return None
    return spec


_spec = _real_torch_npu()
if _spec is not None:
    # the real torch_npu takes this module's place: ``import torch_npu`` returns it
    _real = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _real
    _spec.loader.exec_module(_real)
else:
    try:
        import torch
    except ImportError as e:            # pragma: no cover - the [torch] extra
        raise ImportError("torch_npu (npusim) needs torch: pip install torch --index-url "
                          "https://download.pytorch.org/whl/cpu") from e
    import runtime.torch as _rt

    from . import npu
    _rt.register(npu)
    from .fused import *  # noqa
    # as torch_npu registers ProcessGroupHCCL: "hccl" works, and is torch's default backend for
    # npu (get_default_backend_for_device), without importing npusim's backend by name
    import hccl.torch.backend  # noqa: E402,F401
    __version__ = "npusim-" + torch.__version__.split("+")[0]
    npu_device = "npu"

    def _ascend_environment() -> None:
        """What a library expects of an Ascend machine (docs/torch.md, "The Ascend environment"):
        ``torch.version.cann``, and ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME naming a directory
        (npusim's torch_npu/_ascend_home) when they are unset."""
        if getattr(torch.version, "cann", None) is None:
            torch.version.cann = npu.utils.CANN_VERSION
        home = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ascend_home")
        for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
            os.environ.setdefault(var, home)

    _ascend_environment()
    from . import dtypes as _dtypes  # noqa: E402
    for _n in _dtypes.NAMED:
        globals()[_n] = _dtypes.DType[_n]
    del _n
    from . import _C, contrib, distributed, profiler, utils  # noqa: E402,F401
    from . import _op_gaps  # noqa: E402
    _op_gaps.install(globals())

    def __getattr__(name):
        # torch_npu._ShardedGradScaler imports FSDP (1.6 s): only when asked for
        if name == "_ShardedGradScaler":
            from .npu.amp.sharded_grad_scaler import _ShardedGradScaler
            return _ShardedGradScaler
        raise AttributeError(f"module 'torch_npu' has no attribute {name!r}")
    HiFloat8Tensor = npu.utils.unsupported_class(
        "HiFloat8Tensor", "HiFloat8 is an Ascend-only number format torch's CPU kernels cannot "
        "compute in (torch_npu.dtypes)", "torch_npu")
