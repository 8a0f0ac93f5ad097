"""torch.npu.amp.common: whether amp can run (always, on npusim's npu device)."""
from __future__ import annotations

__all__ = ["amp_definitely_not_available"]


def amp_definitely_not_available() -> bool:
    """False: the npu device is always there on npusim, so amp is available."""
    return False
