"""torch_npu.utils.npu_combine_tensors: several npu tensors as views of one flat buffer."""
from __future__ import annotations

import torch

__all__ = ["npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid"]


def npu_combine_tensors(list_of_tensor, require_copy_value: bool = True):
    """A flat npu tensor holding every tensor of ``list_of_tensor`` in order; each tensor is
    re-pointed into it (its values kept if ``require_copy_value``). None for an empty list."""
    tensors = list(list_of_tensor)
    if not tensors:
        return None
    if any(t is None for t in tensors):
        raise RuntimeError("Tensors to combine must not have `None`.")
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype:
            raise RuntimeError(f"Tensors to combine must have the same dtype ({dtype}, got "
                               f"{t.dtype}).")
        if t.device.type != "npu":
            raise RuntimeError(f"Tensors to combine must be on NPU, got {t.device.type}.")
        if not t.is_contiguous():
            raise RuntimeError("Tensors to combine must be contiguous.")
    total = sum(t.numel() for t in tensors)
    if total == 0:
        return None
    combined = torch.zeros(total, dtype=dtype, device=tensors[0].device)
    at = 0
    with torch.no_grad():
        for t in tensors:
            keep = t.clone() if require_copy_value else None
            t.set_(combined.untyped_storage(), at, t.shape, t.stride())
            if keep is not None:
                t.copy_(keep)
            at += t.numel()
    return combined


def get_part_combined_tensor(combined_tensor, index: int, size: int):
    """``size`` elements of the combined buffer from ``index`` on (a view)."""
    if index + size > combined_tensor.numel():
        raise RuntimeError(f"get_part_combined_tensor: {index} + {size} is past the buffer's "
                           f"{combined_tensor.numel()} elements")
    return combined_tensor[index:index + size]


def is_combined_tensor_valid(combined_tensor, list_of_tensor) -> bool:
    """True when the tensors lie in the buffer one after the other, in order."""
    if combined_tensor is None:
        return False
    base, item = combined_tensor.data_ptr(), combined_tensor.element_size()
    at = 0
    for t in list_of_tensor:
        if t.data_ptr() != base + at * item:
            return False
        at += t.numel()
    return at <= combined_tensor.numel()
