"""torch.npu.amp: autocast and GradScaler as torch_npu scripts spell them."""
from __future__ import annotations

import functools

import torch


class autocast(torch.amp.autocast):
    """``torch.npu.amp.autocast(dtype=torch.float16)`` = ``torch.autocast("npu", ...)``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                 cache_enabled: bool = True):
        super().__init__("npu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.npu.amp.GradScaler()`` = ``torch.amp.GradScaler("npu")``."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, **_ignored):
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs) if fwd \
        else functools.partial(custom_fwd, cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    return torch.amp.custom_bwd(bwd, device_type="npu") if bwd else custom_bwd
