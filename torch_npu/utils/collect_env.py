"""torch_npu.utils.collect_env: the versions an environment report shows."""
from __future__ import annotations

from ..npu.utils import get_cann_version as _cann


def get_cann_version() -> str:
    """The CANN version npusim answers for (``torch.version.cann``)."""
    return _cann()


def get_torch_npu_version() -> str:
    import torch_npu
    return torch_npu.__version__
