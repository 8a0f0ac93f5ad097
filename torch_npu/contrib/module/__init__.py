"""torch_npu.contrib.module: torch_npu's modules, in plain torch where they have a meaning.

``FastBatchNorm1d/2d/3d`` are BatchNorm (torch_npu's keep an int32 batch count: the same
numbers), ``NpuPreGenDropout`` is Dropout (torch_npu pre-generates the masks: the same
distribution, drawn from the npu generator), ``Prefetcher``; ``ModulatedDeformConv`` needs a
CANN kernel and raises NotSupportedError.
"""
from __future__ import annotations

import torch

from . import deform_conv, prefetcher  # noqa: F401
from .deform_conv import DCNv2, ModulatedDeformConv
from .prefetcher import Prefetcher

__all__ = ["FastBatchNorm1d", "FastBatchNorm2d", "FastBatchNorm3d", "NpuPreGenDropout",
           "Prefetcher", "ModulatedDeformConv", "DCNv2"]


class FastBatchNorm1d(torch.nn.BatchNorm1d):
    pass


class FastBatchNorm2d(torch.nn.BatchNorm2d):
    pass


class FastBatchNorm3d(torch.nn.BatchNorm3d):
    pass


class NpuPreGenDropout(torch.nn.Dropout):
    """Dropout (torch_npu's pre-generates its masks; the values have the same distribution)."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__(p=p, inplace=inplace)
