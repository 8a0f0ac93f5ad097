"""torch_npu.contrib.function: torch_npu's composed helpers, in plain torch.

``npu_iou`` / ``npu_ptiou`` (boxes as (xmin, ymin, xmax, ymax); torch_npu's formulas:
iou = (overlap + 0.001) / (union + 0.001), ptiou = overlap / (union + 0.001), an [N, M] result),
``npu_single_level_responsible_flags`` (the anchors of the feature-map cell holding each ground
truth box's centre, as mmdetection's responsible flags), ``npu_fast_condition_index_put``.
``npu_fused_attention`` and ``npu_fused_attention_with_layernorm`` (deprecated in torch_npu)
are built on CANN's FRACTAL_NZ attention kernels and raise NotSupportedError pointing to
``torch_npu.npu_fusion_attention``.
"""
from __future__ import annotations

import torch

from ...npu.utils import not_supported
from .index_op import npu_fast_condition_index_put

__all__ = ["npu_iou", "npu_ptiou", "npu_single_level_responsible_flags",
           "npu_fast_condition_index_put", "npu_fused_attention",
           "npu_fused_attention_with_layernorm"]


def _boxes(b: torch.Tensor, what: str) -> torch.Tensor:
    if b.dim() != 2 or b.shape[-1] != 4:
        raise ValueError(f"{what} must be (N, 4) boxes (xmin, ymin, xmax, ymax), got "
                         f"{tuple(b.shape)}")
    return b if b.dtype in (torch.float16, torch.float32) else b.float()


def npu_iou(boxes1, boxes2, mode: str = "ptiou", is_normalized: bool = False,
            normalized_scale: float = 100.0):
    """IoU of every pair of ``boxes1`` (N, 4) and ``boxes2`` (M, 4): an [N, M] tensor."""
    if mode not in ("iou", "ptiou"):
        raise ValueError(f"Expected mode in [iou, ptiou], got {mode!r}")
    b1, b2 = _boxes(boxes1, "boxes1"), _boxes(boxes2, "boxes2")
    if is_normalized:
        b1, b2 = b1 * normalized_scale, b2 * normalized_scale
    lt = torch.maximum(b1[:, None, :2], b2[None, :, :2])
    rb = torch.minimum(b1[:, None, 2:], b2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    area1 = (b1[:, 2] - b1[:, 0]) * (b1[:, 3] - b1[:, 1])
    area2 = (b2[:, 2] - b2[:, 0]) * (b2[:, 3] - b2[:, 1])
    union = area1[:, None] + area2[None, :] - overlap
    return (overlap + 0.001) / (union + 0.001) if mode == "iou" else overlap / (union + 0.001)


def npu_ptiou(boxes1, boxes2, mode: str = "ptiou", is_normalized: bool = False,
              normalized_scale: float = 100.0):
    return npu_iou(boxes1, boxes2, mode, is_normalized, normalized_scale)


def npu_single_level_responsible_flags(featmap_size, gt_bboxes, stride, num_base_anchors: int):
    """uint8 flags of the ``featmap_size[0] * featmap_size[1] * num_base_anchors`` anchors: 1
    for the anchors of each cell that holds a ground-truth box's centre."""
    h, w = int(featmap_size[0]), int(featmap_size[1])
    gt = _boxes(gt_bboxes, "gt_bboxes")
    sx, sy = (stride, stride) if isinstance(stride, (int, float)) else (stride[0], stride[1])
    cx = ((gt[:, 0] + gt[:, 2]) * 0.5 / sx).floor().long().clamp(0, w - 1)
    cy = ((gt[:, 1] + gt[:, 3]) * 0.5 / sy).floor().long().clamp(0, h - 1)
    cell = torch.zeros(h * w, dtype=torch.uint8, device=gt.device)
    cell[cy * w + cx] = 1
    return cell[:, None].expand(h * w, num_base_anchors).reshape(-1).contiguous()


_NZ = ("it runs CANN's FRACTAL_NZ attention kernels (deprecated in torch_npu); use "
       "torch_npu.npu_fusion_attention")
npu_fused_attention = not_supported("npu_fused_attention", _NZ, "torch_npu.contrib")
npu_fused_attention_with_layernorm = not_supported("npu_fused_attention_with_layernorm", _NZ,
                                                   "torch_npu.contrib")
