"""``torch.autocast("npu", dtype=...)``: the matrix operators run in the autocast dtype.

torch's autocast lists are C++ and registered per backend; for npu the operators below cast
their floating-point tensor arguments to the autocast dtype (float16 by default, bfloat16 when
asked), as torch's CUDA list does for them; every other operator falls through unchanged.
"""
from __future__ import annotations

import torch

_LOWER = ("mm", "matmul", "bmm", "addmm", "baddbmm", "addbmm", "linear", "conv1d", "conv2d",
          "conv3d", "_convolution", "prelu")
_AUTOCAST = torch._C.DispatchKey.AutocastPrivateUse1


def _cast(x, dtype):
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def _kernel(op):
    def k(*args, **kwargs):
        dtype = torch.get_autocast_dtype("npu")
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_AUTOCAST)):
            return op(*_cast(args, dtype), **{n: _cast(v, dtype) for n, v in kwargs.items()})
    return k


def register(lib) -> None:
    for name in _LOWER:
        packet = getattr(torch.ops.aten, name)
        for ov in packet.overloads():
            lib.impl(f"{name}.{ov}" if ov != "default" else name, _kernel(getattr(packet, ov)),
                     "AutocastPrivateUse1")
