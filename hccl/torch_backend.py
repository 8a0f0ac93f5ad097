"""Moved to hccl.torch.backend (hccl/torch/backend.py); this name keeps ``import hccl.torch_backend`` working
and is the same module object (so patches and isinstance checks see one module)."""
import sys

from .torch import backend

sys.modules[__name__] = backend
