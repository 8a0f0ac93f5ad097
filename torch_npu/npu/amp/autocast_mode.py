"""torch.npu.amp.autocast_mode: ``autocast`` and the custom_fwd / custom_bwd decorators."""
from __future__ import annotations

import functools

import torch

__all__ = ["autocast", "custom_fwd", "custom_bwd"]


class autocast(torch.amp.autocast):
    """``torch.npu.amp.autocast(dtype=torch.float16)`` = ``torch.autocast("npu", ...)``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                 cache_enabled: bool = True):
        super().__init__("npu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs) if fwd \
        else functools.partial(custom_fwd, cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    return torch.amp.custom_bwd(bwd, device_type="npu") if bwd else custom_bwd
