"""Moved to hccl.torch.p2p (hccl/torch/p2p.py); this name keeps ``import hccl.torch_p2p`` working
and is the same module object (so patches and isinstance checks see one module)."""
import sys

from .torch import p2p

sys.modules[__name__] = p2p
