"""torch_npu.contrib.function.index_op: ``x[condition] = value`` as torch_npu's helper spells it."""
from __future__ import annotations

import torch

__all__ = ["npu_fast_condition_index_put"]


def npu_fast_condition_index_put(x: torch.Tensor, condition: torch.Tensor, value):
    """``x`` with ``value`` where ``condition`` (a bool tensor of x's shape) is True, written into
    ``x`` and returned (torch_npu's replacement for ``x[condition] = value``)."""
    if condition.dtype != torch.bool:
        raise TypeError(f"Expected condition.dtype in [torch.bool], got {condition.dtype}")
    return x.masked_fill_(condition, value)
