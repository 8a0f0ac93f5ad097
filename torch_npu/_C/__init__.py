"""torch_npu._C: the few names scripts reach in torch_npu's C extension (npusim has none).

``torch_npu._C._distributed_c10d.ProcessGroupHCCL`` (with ``.Options``), as MindSpeed and
torchtitan-npu build ``pg_options`` from it.
"""
from . import _distributed_c10d  # noqa: F401
