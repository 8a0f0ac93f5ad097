"""Let PyPI's torchvision import on a CPU-only torch (both runs of a client that needs it).

PyPI's Linux torchvision wheels (0.28.0 for torch 2.13) are built against CUDA torch: their C++
ops library ``torchvision/_C.so`` links ``libtorch_cuda.so``, which a CPU-only torch (what CI
installs) does not have. torchvision then runs without its C++ ops, as it is designed to (nms,
roi_align etc. raise "Couldn't load custom C++ ops"), except that 0.28's
``_meta_registrations.py`` registers fake kernels for ``torchvision::nms`` and ``::qnms``
without checking that the ops exist, so ``import torchvision`` itself fails with "operator
torchvision::nms does not exist". ``prepare()`` defines those two operators' schemas (no kernel)
when the C++ library cannot load, and only then; everything pure-Python in torchvision (models,
transforms, datasets.FakeData) then works, and the C++ ops still refuse to run. With a CPU build
of torchvision (whose ``_C.so`` loads) it does nothing.

Test code, not npusim: the clients' runs (client_runner.py) and the test's skip check call it.
"""
from __future__ import annotations

import importlib.util
import os
import sys

_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_libs: list = []          # the Library must outlive the call, or its definitions go away


def prepare() -> str | None:
    """Make ``import torchvision`` work here; what was done ("ops", "schemas") or None if absent."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return None
    import torch
    try:
        torch.ops.torchvision.nms          # defined already: by _C.so or an earlier prepare()
        return "ops" if not _libs else "schemas"
    except (AttributeError, RuntimeError):
        pass
    lib_path = os.path.join(os.path.dirname(spec.origin), "_C.so")
    try:
        torch.ops.load_library(lib_path)
        return "ops"
    except (OSError, RuntimeError):
        pass
    # a CUDA build of torchvision beside a CUDA torch (PyPI's default on x86_64) loads its _C.so
    # only from its own import, which finds the libraries it links: defining the schemas first
    # would make that load abort the process on a duplicate definition
    try:
        import torchvision  # noqa: F401
        return "ops"
    except Exception:  # noqa: BLE001 - the schemas below are the remedy for any failure here
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    lib = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        lib.define(schema)
    _libs.append(lib)
    return "schemas"


def available() -> str:
    """'' when torchvision imports here (after ``prepare``), else why not."""
    try:
        if prepare() is None:
            return "torchvision is not installed"
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure to import is a reason to skip
        return f"torchvision does not import: {type(e).__name__}: {e}"
    return ""
