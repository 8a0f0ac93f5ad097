"""Moved to hccl.torch.work (hccl/torch/work.py); this name keeps ``import hccl.torch_work`` working
and is the same module object (so patches and isinstance checks see one module)."""
import sys

from .torch import work

sys.modules[__name__] = work
