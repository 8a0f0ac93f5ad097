"""torch.npu.amp.sharded_grad_scaler: FSDP's ShardedGradScaler for npu tensors."""
from __future__ import annotations

from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

__all__ = ["_ShardedGradScaler"]


class _ShardedGradScaler(ShardedGradScaler):
    """``ShardedGradScaler(device="npu")``, torch_npu's name (``torch_npu._ShardedGradScaler``)."""

    def __init__(self, device: str = "npu", init_scale: float = 2.0 ** 16,
                 backoff_factor: float = 0.5, growth_factor: float = 2.0,
                 growth_interval: int = 2000, enabled: bool = True, process_group=None):
        kw = dict(init_scale=init_scale, backoff_factor=backoff_factor,
                  growth_factor=growth_factor, growth_interval=growth_interval, enabled=enabled)
        if process_group is not None:
            kw["process_group"] = process_group
        super().__init__(device=device, **kw)
