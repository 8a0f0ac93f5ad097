"""torch_npu.distributed: the "hccl" backend's extra names.

``is_hccl_available``; the uneven collectives torch_npu adds (``reduce_scatter_tensor_uneven``,
``all_gather_into_tensor_uneven``, ``all_to_all_vc``), here composed from torch.distributed's
collectives on the group (same results; more bytes on the wire than HCCL's own kernels: an
all-reduce of the whole input, an all-gather padded to the largest part); and
``reinit_process_group``, which rebuilds links after a hardware fault and raises
NotSupportedError here. The uneven collectives run synchronously: with ``async_op=True`` they
return a completed work.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import hccl.torch.backend  # noqa: F401 - registers "hccl"

from ..npu.utils import NotSupportedError

__all__ = ["is_hccl_available", "reinit_process_group", "reduce_scatter_tensor_uneven",
           "all_gather_into_tensor_uneven", "all_to_all_vc"]


def is_available() -> bool:
    return dist.is_available()


def is_hccl_available() -> bool:
    """True: npusim's "hccl" backend is registered."""
    return True


def reinit_process_group(group=None, rebuild_link: bool = True):
    raise NotSupportedError("torch_npu.distributed.reinit_process_group is not supported by "
                            "npusim: it rebuilds HCCL links after a device fault; npusim's "
                            "recovery is npurun's restart (docs/launcher.md)")


reinit_process_group._npusim_not_supported = True


class _Done:
    """The work of a collective that already finished."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _splits(total: int, sizes, n: int, what: str) -> list:
    if not sizes:
        if total % n:
            raise ValueError(f"{what}: dim 0 ({total}) is not divisible by the group size {n}; "
                             "pass the split sizes")
        return [total // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or sum(sizes) != total or min(sizes) < 0:
        raise ValueError(f"{what}: {len(sizes)} split sizes summing to {sum(sizes)}, expected "
                         f"{n} summing to dim 0 ({total})")
    return sizes


def _ret(async_op: bool):
    return _Done() if async_op else None


def reduce_scatter_tensor_uneven(output, input, input_split_sizes=None, op=dist.ReduceOp.SUM,
                                 group=None, async_op=False):
    """Reduce ``input`` over the group; rank i gets its ``input_split_sizes[i]`` rows of dim 0."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    sizes = _splits(input.shape[0], input_split_sizes, n, "reduce_scatter_tensor_uneven")
    if output.shape[0] != sizes[r]:
        raise ValueError(f"reduce_scatter_tensor_uneven: output has {output.shape[0]} rows, "
                         f"rank {r}'s split is {sizes[r]}")
    full = input.clone()
    dist.all_reduce(full, op=op, group=group)
    start = sum(sizes[:r])
    output.copy_(full[start:start + sizes[r]])
    return _ret(async_op)


def all_gather_into_tensor_uneven(output, input, output_split_sizes=None, group=None,
                                  async_op=False):
    """Gather each rank's ``input`` (``output_split_sizes[i]`` rows of dim 0) into ``output``."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    sizes = _splits(output.shape[0], output_split_sizes, n, "all_gather_into_tensor_uneven")
    if input.shape[0] != sizes[r]:
        raise ValueError(f"all_gather_into_tensor_uneven: input has {input.shape[0]} rows, "
                         f"rank {r}'s split is {sizes[r]}")
    most = max(sizes)
    padded = input.new_zeros((most,) + tuple(input.shape[1:]))
    padded[:sizes[r]].copy_(input)
    gathered = input.new_empty((most * n,) + tuple(input.shape[1:]))
    dist.all_gather_into_tensor(gathered, padded, group=group)
    at = 0
    for i, s in enumerate(sizes):
        output[at:at + s].copy_(gathered[i * most:i * most + s])
        at += s
    return _ret(async_op)


def all_to_all_vc(output, input, send_count_matrix, group=None, async_op=False):
    """All-to-all with ``send_count_matrix[i][j]`` elements from rank i to rank j (the same full
    matrix on every rank); buffers laid out contiguously per peer."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if len(send_count_matrix) != n or any(len(row) != n for row in send_count_matrix):
        raise ValueError(f"send_count_matrix must be a square [{n}][{n}] matrix (the group size)")
    send = [int(v) for v in send_count_matrix[r]]
    recv = [int(send_count_matrix[i][r]) for i in range(n)]
    if input.numel() != sum(send) or output.numel() != sum(recv):
        raise ValueError(f"all_to_all_vc: input has {input.numel()} elements and output "
                         f"{output.numel()}; rank {r}'s row sums to {sum(send)} and column to "
                         f"{sum(recv)}")
    out = output.reshape(-1)
    dist.all_to_all_single(out, input.reshape(-1).contiguous(), output_split_sizes=recv,
                           input_split_sizes=send, group=group)
    if out.data_ptr() != output.data_ptr():
        output.copy_(out.view_as(output))
    return _ret(async_op)
