"""torch.distributed's "hccl" backend on npusim (docs/torch.md): ``import hccl.torch.backend``
registers it (``hccl.torch_backend``, its former name, still works).

backend (the ProcessGroup), work (Work objects, the completer thread, CPU tensors' staging),
npu (npu tensors on their own device memory, stream-ordered), p2p (point-to-point lanes),
rendezvous (how the world is found), sparse (sparse all_reduce).

This package is ``hccl.torch``; its modules import torch with absolute imports, which always
name the top-level torch, never this package.
"""
