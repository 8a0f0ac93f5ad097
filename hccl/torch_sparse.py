"""Moved to hccl.torch.sparse (hccl/torch/sparse.py); this name keeps ``import hccl.torch_sparse`` working
and is the same module object (so patches and isinstance checks see one module)."""
import sys

from .torch import sparse

sys.modules[__name__] = sparse
