"""Moved to hccl.torch.rendezvous (hccl/torch/rendezvous.py); this name keeps ``import hccl.torch_rendezvous`` working
and is the same module object (so patches and isinstance checks see one module)."""
import sys

from .torch import rendezvous

sys.modules[__name__] = rendezvous
