"""Layout, softmax and small operators: the storage-format tag (``npu_format_cast`` /
``npu_format_cast_`` / ``get_npu_format``), reshapes and slices (``npu_confusion_transpose``,
``npu_transpose``, ``npu_broadcast``, ``npu_slice``, ``npu_indexing``, ``npu_pad``), matmuls
(``npu_linear``, ``npu_bmmV2``, ``npu_transpose_batchmatmul``), ``npu_dtype_cast``,
``npu_one_hot``, ``npu_max`` / ``npu_min``, softmax and dropout (``npu_scaled_masked_softmax``,
``npu_dropout_with_add_softmax``, ``_npu_dropout``, ``npu_softmax_cross_entropy_with_logits``),
1-bit packing (``npu_sign_bits_pack`` / ``unpack``) and the scatter writes (``scatter_update``,
``npu_scatter_nd_update`` and their in-place forms).

Storage formats: an Ascend tensor has a storage format (ND, NCHW, FRACTAL_NZ...) that decides its
bytes' order on the card. npusim keeps every tensor in torch's strided layout, so a format is a
tag: ``npu_format_cast(x, 29)`` returns x's data (an alias, differentiable) tagged 29 and
``get_npu_format`` reads the tag; an untagged tensor reports torch_npu's base format for its rank
(NCHW=0 for 4-d, NCDHW=30 for 5-d, ND=2 otherwise). Nothing computes differently by format.
"""
from __future__ import annotations

import torch

from ._common import check, compute_dtype, generator_of

# torch_npu.npu._format.Format's values
FORMATS = {"UNDEFINED": -1, "NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4,
           "NC1HWC0_C04": 12, "HWCN": 16, "NDHWC": 27, "FRACTAL_NZ": 29, "NCDHW": 30,
           "NDC1HWC0": 32, "FRACTAL_Z_3D": 33, "NC": 35, "NCL": 47, "FRACTAL_NZ_C0_16": 50,
           "FRACTAL_NZ_C0_32": 51, "FRACTAL_NZ_C0_2": 52, "FRACTAL_NZ_C0_4": 53,
           "FRACTAL_NZ_C0_8": 54}
_TAG = "_npusim_npu_format"


def get_npu_format(self) -> int:
    """torch_npu.get_npu_format(x) -> int: the format tag (module docstring)."""
    tag = getattr(self, _TAG, None)
    if tag is not None:
        return tag
    return {4: FORMATS["NCHW"], 5: FORMATS["NCDHW"]}.get(self.dim(), FORMATS["ND"])


def _format_of(acl_format) -> int:
    if isinstance(acl_format, torch.Tensor):
        return get_npu_format(acl_format)
    f = int(acl_format)
    check(f in FORMATS.values(), "npu_format_cast", f"acl_format={f} is not an Ascend format "
          f"(one of {sorted(FORMATS.values())})")
    return f


def npu_format_cast(self, acl_format, customize_dtype=None, input_dtype=None):
    """torch_npu.npu_format_cast(x, acl_format) -> x's data tagged with ``acl_format``."""
    f = _format_of(acl_format)
    if get_npu_format(self) == f:
        return self
    out = self.view_as(self)
    setattr(out, _TAG, f)
    return out


def npu_format_cast_(self, src):
    """torch_npu.npu_format_cast_(x, src) -> x, tagged with src's format (a tensor or an int)."""
    setattr(self, _TAG, _format_of(src))
    return self


def npu_confusion_transpose(self, perm, shape, transpose_first):
    """torch_npu.npu_confusion_transpose: permute then reshape (``transpose_first``) or reshape
    then permute."""
    if transpose_first:
        return self.permute(*perm).reshape(*shape)
    return self.reshape(*shape).permute(*perm)


def npu_transpose(self, perm, require_contiguous=True):
    """torch_npu.npu_transpose(x, perm) -> ``x.permute(perm)``, contiguous."""
    return self.permute(*perm).contiguous()


def npu_broadcast(self, size):
    """torch_npu.npu_broadcast(x, size) -> ``x.expand(size)``, contiguous."""
    return self.expand(*size).contiguous()


def npu_dtype_cast(input, dtype, input_dtype=None):
    """torch_npu.npu_dtype_cast(x, dtype) -> ``x.to(dtype)``."""
    return input.to(dtype)


def npu_linear(input, weight, bias=None):
    """torch_npu.npu_linear(input, weight, bias=None) -> ``input @ weight.T + bias``."""
    return torch.nn.functional.linear(input, weight, bias)


def npu_bmmV2(self, mat2, output_sizes=()):
    """torch_npu.npu_bmmV2(a, b, output_sizes) -> ``a @ b``."""
    return torch.matmul(self, mat2)


def npu_slice(self, offsets, size):
    """torch_npu.npu_slice(x, offsets, size) -> ``x[o0:o0+s0, o1:o1+s1, ...]``, contiguous."""
    check(len(offsets) == len(size) == self.dim(), "npu_slice", f"offsets and size need "
          f"{self.dim()} entries, got {len(offsets)} and {len(size)}")
    return self[tuple(slice(o, o + s) for o, s in zip(offsets, size))].contiguous()


def npu_max(self, dim, keepdim=False):
    """torch_npu.npu_max(x, dim, keepdim=False) -> (values, int32 indices)."""
    v, i = torch.max(self, dim, keepdim)
    return v, i.to(torch.int32)


def npu_min(self, dim, keepdim=False):
    """torch_npu.npu_min(x, dim, keepdim=False) -> (values, int32 indices)."""
    v, i = torch.min(self, dim, keepdim)
    return v, i.to(torch.int32)


def npu_one_hot(input, num_classes=-1, depth=1, on_value=1, off_value=0):
    """torch_npu.npu_one_hot(x, num_classes=-1, depth=1, on_value=1, off_value=0) -> float32
    tensor with a new axis of ``depth`` (at ``num_classes``, -1: last): ``on_value`` where the
    class is x's value, ``off_value`` elsewhere (values outside [0, depth) give an all-off row)."""
    classes = torch.arange(depth, device=input.device)
    hit = input.long().unsqueeze(-1) == classes
    out = torch.where(hit, torch.tensor(float(on_value), device=input.device),
                      torch.tensor(float(off_value), device=input.device))
    return out if num_classes in (-1, input.dim()) else out.movedim(-1, num_classes)


def npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False):
    """torch_npu.npu_scaled_masked_softmax(x, mask, scale=1.0, fixed_triu_mask=False) ->
    ``softmax(where(mask, -10000, x * scale), -1)``: mask True masks out (as Megatron's fused
    kernel, which this replaces, fills -10000); ``fixed_triu_mask`` masks the upper triangle
    instead of reading ``mask``. Computed in float32, returned in x's dtype."""
    ct = compute_dtype(x.dtype)
    if fixed_triu_mask:
        sq, sk = x.shape[-2], x.shape[-1]
        m = torch.ones(sq, sk, dtype=torch.bool).triu(1).to(x.device)
    else:
        check(mask is not None, "npu_scaled_masked_softmax", "mask is required unless "
              "fixed_triu_mask=True")
        m = mask if mask.dtype == torch.bool else mask != 0
    s = (x.to(ct) * scale).masked_fill(m, -10000.0)
    return torch.softmax(s, dim=-1).to(x.dtype)


def npu_dropout_with_add_softmax(self, x1, alpha, prob, dim):
    """torch_npu.npu_dropout_with_add_softmax(x, x1, alpha, prob, dim) -> (mask, softmax_out,
    output): ``softmax_out = softmax(x1 + x * alpha, dim)``; output drops each element with
    probability ``prob`` (from the device generator) and scales the rest by 1/(1-prob); mask is
    the flat uint8 keep mask (1 kept)."""
    check(0 <= prob < 1, "npu_dropout_with_add_softmax", f"prob must be in [0, 1), got {prob}")
    ct = compute_dtype(self.dtype)
    sm = torch.softmax(x1.to(ct) + self.to(ct) * alpha, dim=dim)
    keep = torch.rand(sm.shape, generator=generator_of(self)).to(self.device) >= prob
    out = sm * keep.to(ct) / (1.0 - prob)
    return keep.flatten().to(torch.uint8), sm.to(self.dtype), out.to(self.dtype)


def npu_softmax_cross_entropy_with_logits(features, labels):
    """torch_npu.npu_softmax_cross_entropy_with_logits(features, labels) -> per-row
    ``-sum(labels * log_softmax(features, -1), -1)``."""
    ct = compute_dtype(features.dtype)
    loss = -(labels.to(ct) * torch.log_softmax(features.to(ct), dim=-1)).sum(dim=-1)
    return loss.to(features.dtype)


def npu_sign_bits_pack(self, size):
    """torch_npu.npu_sign_bits_pack(x, size) -> uint8 (size, -1): one bit per element of the
    1-d float x, 1 for x >= 0, little-endian within each byte, padded with -1 (bit 0) to a
    multiple of 8 (1-bit Adam's compression)."""
    check(self.dim() == 1, "npu_sign_bits_pack", f"x must be 1-d, got {self.dim()}-d")
    bits = (self >= 0).to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat((bits, bits.new_zeros(pad)))
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32, device=self.device)
    packed = (bits.view(-1, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8)
    check(packed.numel() % size == 0, "npu_sign_bits_pack", f"{packed.numel()} packed bytes do "
          f"not split into size={size} rows")
    return packed.view(size, -1)


def npu_sign_bits_unpack(input, size, dtype):
    """torch_npu.npu_sign_bits_unpack(x, size, dtype) -> (size, -1) of +1 / -1 in ``dtype``
    (torch.float32 / torch.float16, or 0 / 1 for them) from the bits of uint8 x, little-endian."""
    if not isinstance(dtype, torch.dtype):
        check(dtype in (0, 1), "npu_sign_bits_unpack", f"dtype must be a torch dtype or 0 "
              f"(float32) / 1 (float16), got {dtype!r}")
        dtype = torch.float16 if dtype == 1 else torch.float32
    shifts = torch.arange(8, dtype=torch.int32, device=input.device)
    shifted = torch.bitwise_right_shift(input.reshape(-1, 1).to(torch.int32), shifts)
    bits = torch.bitwise_and(shifted, torch.ones_like(shifted))   # a tensor: see moe.py's note
    out = (bits * 2 - 1).to(dtype).reshape(-1)
    check(out.numel() % size == 0, "npu_sign_bits_unpack", f"{out.numel()} values do not split "
          f"into size={size} rows")
    return out.view(size, -1)


def scatter_update_(data, indices, updates, axis):
    """torch_npu.scatter_update_(data, indices, updates, axis) -> data: for each batch b,
    ``data[b]``'s slice along ``axis`` starting at ``indices[b]`` takes ``updates[b]`` (a KV
    cache write), in place."""
    op = "scatter_update"
    check(data.dim() == updates.dim() and data.dim() >= 2, op, "data and updates must have the "
          "same rank, at least 2")
    check(indices.dim() == 1 and indices.numel() == data.size(0), op, f"indices must be 1-d with "
          f"one start per batch ({data.size(0)}); 2-d indices are not supported on npusim")
    ax = axis % data.dim()
    check(ax > 0, op, "axis must not be the batch axis 0")
    n = updates.size(ax)
    for b, start in enumerate(indices.tolist()):
        data[b].narrow(ax - 1, int(start), n).copy_(updates[b])
    return data


def scatter_update(data, indices, updates, axis):
    """torch_npu.scatter_update: scatter_update_ on a copy; data is unchanged."""
    return scatter_update_(data.clone(), indices, updates, axis)


def npu_scatter_nd_update_(input, indices, updates):
    """torch_npu.npu_scatter_nd_update_(x, indices, updates) -> x with ``x[indices[..., 0],
    indices[..., 1], ...] = updates`` (indices' last axis indexes x's leading axes), in place."""
    check(indices.dim() >= 2 and indices.size(-1) <= input.dim(), "npu_scatter_nd_update",
          f"indices must be at least 2-d with a last axis <= {input.dim()}")
    idx = tuple(i for i in indices.long().unbind(-1))
    input[idx] = updates.to(input.dtype)
    return input


def npu_scatter_nd_update(input, indices, updates):
    """torch_npu.npu_scatter_nd_update: npu_scatter_nd_update_ on a copy."""
    return npu_scatter_nd_update_(input.clone(), indices, updates)


def npu_pad(input, paddings):
    """torch_npu.npu_pad(x, paddings) -> x zero-padded: ``paddings`` holds (before, after) for
    each axis from the first (``[1, 1, 1, 1]`` pads a (1, 4) tensor to (3, 6))."""
    check(len(paddings) == 2 * input.dim(), "npu_pad", f"paddings needs 2 values per axis "
          f"({2 * input.dim()}), got {len(paddings)}")
    pads = []
    for axis in reversed(range(input.dim())):
        pads += [int(paddings[2 * axis]), int(paddings[2 * axis + 1])]
    return torch.nn.functional.pad(input, pads)


def npu_indexing(self, begin, end, strides, begin_mask=0, end_mask=0, ellipsis_mask=0,
                 new_axis_mask=0, shrink_axis_mask=0):
    """torch_npu.npu_indexing: a strided slice ``x[begin[i]:end[i]:strides[i], ...]``, bit i of
    begin_mask / end_mask dropping begin[i] / end[i], of shrink_axis_mask taking index begin[i];
    contiguous. ellipsis_mask / new_axis_mask are not supported."""
    op = "npu_indexing"
    if ellipsis_mask or new_axis_mask:
        raise NotImplementedError(f"{op}: ellipsis_mask / new_axis_mask are not supported on "
                                  "npusim")
    check(len(begin) == len(end) == len(strides) <= self.dim(), op, "begin, end and strides "
          f"need one entry per sliced axis (at most {self.dim()})")
    index = []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        if shrink_axis_mask >> i & 1:
            index.append(int(b))
        else:
            index.append(slice(None if begin_mask >> i & 1 else int(b),
                               None if end_mask >> i & 1 else int(e), int(s)))
    return self[tuple(index)].contiguous()


def _npu_dropout(self, p):
    """torch_npu._npu_dropout(x, p) -> (output, mask): each element dropped with probability p
    (the device generator), the rest scaled by 1/(1-p); mask holds the keep bits, little-endian
    per byte, padded to a multiple of 128 elements (torch_npu's meta size)."""
    check(0 <= p < 1, "_npu_dropout", f"p must be in [0, 1), got {p}")
    n = self.numel()
    keep = torch.rand(n, generator=generator_of(self)).to(self.device) >= p
    out = self * keep.view(self.shape).to(self.dtype) / (1.0 - p)
    bits = torch.cat((keep.to(torch.int32), keep.new_zeros((-n) % 128, dtype=torch.int32)))
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32, device=self.device)
    mask = (bits.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)
    return out, mask


def npu_transpose_batchmatmul(input, weight, *, bias=None, scale=None, perm_x1=None,
                              perm_x2=None, perm_y=None, batch_split_factor=1):
    """torch_npu.npu_transpose_batchmatmul: ``permute(input, perm_x1) @ permute(weight,
    perm_x2) + bias``, permuted by ``perm_y`` (3-d operands). The quantized ``scale`` and
    ``batch_split_factor`` > 1 are not supported."""
    op = "npu_transpose_batchmatmul"
    if scale is not None:
        raise NotImplementedError(f"{op}: scale (quantized output) needs a compiled kernel")
    if batch_split_factor != 1:
        raise NotImplementedError(f"{op}: batch_split_factor={batch_split_factor} is not "
                                  "supported on npusim")
    check(input.dim() == 3 and weight.dim() == 3, op, "input and weight must be 3-d")
    a = input.permute(*perm_x1) if perm_x1 is not None else input
    b = weight.permute(*perm_x2) if perm_x2 is not None else weight
    y = torch.matmul(a, b)
    if bias is not None:
        y = y + bias
    return y.permute(*perm_y).contiguous() if perm_y is not None else y
