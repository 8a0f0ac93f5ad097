"""A torch device named ``npu`` backed by npusim (docs/torch.md, "The npu device").

``runtime.torch.register()`` (``import torch_npu`` calls it) renames torch's PrivateUse1 backend
to ``npu`` and registers, in pure Python: the device's module (``torch.npu``), its hooks and
device guard, a boxed fallback that runs every aten operator with torch's CPU kernels on views
of npusim device memory (ops.py), and the kernels that own storage or cross devices
(kernels.py). A tensor on ``npu:N`` keeps its bytes in simulated NPU N's memory (storage.py).

Needs torch's Python route to a PrivateUse1 backend (``torch._C._acc``,
``torch.utils.backend_registration._setup_privateuseone_for_python_backend``) and DLPack's
kDLExtDev mapping to it; ``register`` checks for the route and raises ImportError naming the
installed version without it. The route appeared in torch 2.10.0; the torch tests pass on
2.10.0, 2.13.0 (what CI pins) and 2.14.1 (docs/torch.md, "Which torch").
"""
from __future__ import annotations

_registered = False


def enable_pinned_factories() -> None:
    """Let ``torch.empty(..., pin_memory=True)`` and its C++ callers (``DDP(...,
    find_unused_parameters=True)``) allocate npusim's pinned host memory, at the cost of a
    Python call on every CPU allocation of the process (pinned.py; docs/torch.md, "Device
    contract"). Call it after ``import torch_npu``."""
    from . import pinned
    pinned.enable_factories()


def register(module=None) -> None:
    """Make ``npu`` a torch device backed by npusim; ``module`` becomes ``torch.npu``.

    Idempotent. Raises ImportError (naming the version) on a torch without the Python route,
    RuntimeError when PrivateUse1 already belongs to another backend (a real torch_npu).
    """
    global _registered
    if _registered:
        return
    import torch
    from torch.utils import backend_registration as br
    try:            # torch's Python route to a PrivateUse1 backend (torch >= 2.10's private names)
        torch._C._acc, br._setup_privateuseone_for_python_backend  # noqa: B018
    except AttributeError:
        raise ImportError(
            "npusim's npu device needs torch's Python route to a PrivateUse1 backend "
            f"(torch._C._acc), which torch {torch.__version__} lacks (it came in torch 2.10; CI "
            "tests 2.13): pip install 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cpu") from None
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "npu"):
        raise RuntimeError(f"torch's PrivateUse1 backend is already '{name}': npusim's npu device "
                           "cannot be registered next to it")
    if name == "npu" and getattr(torch, "npu", None) is not None and \
            not getattr(torch.npu, "NPUSIM", False):
        raise RuntimeError("torch already has an 'npu' backend (a real torch_npu?): npusim's npu "
                           "device is not registered over it")
    from . import guard, kernels
    if module is None:
        from . import module as _module
        module = _module
    br._setup_privateuseone_for_python_backend(
        "npu", backend_module=module, hook=guard.Hooks(), device_guard=guard.DeviceGuard())
    kernels.register()
    from . import compile as _compile
    _compile.skip_in_dynamo()
    _registered = True
