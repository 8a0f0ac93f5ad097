"""torch_npu.contrib.module.deform_conv: modulated deformable convolution (DCNv2)."""
from __future__ import annotations

from ...npu.utils import unsupported_class

_WHY = "it runs torch_npu.npu_deformable_conv2d, a CANN kernel npusim does not implement"
ModulatedDeformConv = unsupported_class("ModulatedDeformConv", _WHY,
                                        "torch_npu.contrib.module.deform_conv")
DCNv2 = ModulatedDeformConv

__all__ = ["ModulatedDeformConv", "DCNv2"]
