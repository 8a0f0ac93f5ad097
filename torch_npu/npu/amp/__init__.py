"""torch.npu.amp (torch_npu.npu.amp): autocast and GradScaler as torch_npu scripts spell them.

Its modules are torch_npu's (autocast_mode, grad_scaler, common), so transfer_to_npu can put
their names onto torch.cuda.amp's modules as the real one does.
"""
from __future__ import annotations

from . import common  # noqa: F401
from .autocast_mode import autocast, custom_bwd, custom_fwd
from .grad_scaler import GradScaler

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]
