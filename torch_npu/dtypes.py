"""torch_npu's named dtypes: ``torch_npu.hifloat8``, ``torch_npu.float8_e4m3fn``, ...

In torch_npu these are members of a C++ enum (``torch_npu._C._cd.DType``) that the quantized
fused operators take as arguments (``x1_dtype=torch_npu.float8_e4m3fn``), with the integer
values torch_npu's meta registrations map (TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP); they are
not ``torch.dtype``s, so no tensor has one. Here they are an IntEnum with those values.
``storage_dtype(d)`` says which torch dtype holds a tensor of that format, and ``compute_dtype(d)``
the torch dtype npusim computes it in, raising ``NotSupportedError`` naming the format where
npusim has no arithmetic for it (HiFloat8, int4, the fp4 formats: Ascend-only encodings that
torch's CPU kernels do not know).
"""
from __future__ import annotations

import enum

import torch

from .npu.utils import NotSupportedError


class DType(enum.IntEnum):
    """torch_npu's DType values (the ones its Python sources name)."""
    uint8 = 0
    int8 = 1
    int16 = 2
    int32 = 3
    int64 = 4
    float16 = 5
    float32 = 6
    float64 = 7
    bool = 11
    bfloat16 = 15
    int4 = 285
    hifloat8 = 290
    float8_e5m2 = 291
    float8_e4m3fn = 292
    float8_e8m0fnu = 293
    float4_e2m1 = 294          # 294 / 295: between the values the meta registrations name
    float4_e1m2 = 295
    float4_e2m1fn_x2 = 296
    float4_e1m2fn_x2 = 297


_STORAGE = {DType.int4: torch.uint8, DType.hifloat8: torch.uint8,
            DType.float8_e5m2: torch.float8_e5m2, DType.float8_e4m3fn: torch.float8_e4m3fn,
            DType.float8_e8m0fnu: getattr(torch, "float8_e8m0fnu", torch.uint8),
            DType.float4_e2m1: torch.uint8, DType.float4_e1m2: torch.uint8,
            DType.float4_e2m1fn_x2: torch.uint8, DType.float4_e1m2fn_x2: torch.uint8}
_NO_ARITHMETIC = {DType.int4, DType.hifloat8, DType.float4_e2m1, DType.float4_e1m2,
                  DType.float4_e2m1fn_x2, DType.float4_e1m2fn_x2}

NAMED = ("int4", "hifloat8", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1",
         "float4_e1m2", "float4_e2m1fn_x2", "float4_e1m2fn_x2")


def _as_dtype(d, what: str) -> "DType":
    try:
        return DType(int(d))
    except (TypeError, ValueError):
        raise TypeError(f"{what}: expected a torch_npu dtype (torch_npu.hifloat8, ...), got "
                        f"{d!r}") from None


def storage_dtype(d, what: str = "dtype") -> torch.dtype:
    """The torch dtype a tensor of torch_npu format ``d`` is stored as (uint8 for HiFloat8 ...)."""
    d = _as_dtype(d, what)
    if d in _STORAGE:
        return _STORAGE[d]
    return getattr(torch, d.name)


def compute_dtype(d, what: str = "dtype") -> torch.dtype:
    """The torch dtype npusim computes format ``d`` in; NotSupportedError for the formats it has
    no arithmetic for."""
    d = _as_dtype(d, what)
    if d in _NO_ARITHMETIC:
        raise NotSupportedError(f"{what}=torch_npu.{d.name} is not supported by npusim: it is an "
                                "Ascend-only number format that torch's CPU kernels cannot "
                                "compute in (float8_e4m3fn / float8_e5m2 are supported)")
    return storage_dtype(d, what)
