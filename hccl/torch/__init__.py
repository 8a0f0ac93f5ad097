"""torch.distributed's "hccl" backend on npusim (docs/torch.md): ``import hccl.torch.backend``
registers it (``hccl.torch_backend``, its former name, still works).

backend (the ProcessGroup: checks the arguments, picks the op), ops (every collective written
once: npu tensors on their own device memory, stream-ordered; CPU tensors staged through the
same code), npu (the npu tensors' NPU, communication streams, and one dense tensor's all_reduce
on a short branch), work (Work objects, the completer thread, staging buffers), p2p
(point-to-point lanes), rendezvous (how the world is found), sparse (sparse all_reduce).

This package is ``hccl.torch``; its modules import torch with absolute imports, which always
name the top-level torch, never this package.
"""
