"""torch_npu._C._distributed_c10d: ``ProcessGroupHCCL`` is npusim's hccl process group.

``ProcessGroupHCCL.Options()`` with ``hccl_config`` goes to ``dist.new_group(...,
pg_options=...)`` or ``init_process_group(..., pg_options=...)``; hccl/torch/backend.py applies
``hccl_buffer_size`` and keeps the rest (HcclOptions).
"""
from hccl.torch.backend import HcclProcessGroup as ProcessGroupHCCL  # noqa: F401

__all__ = ["ProcessGroupHCCL"]
