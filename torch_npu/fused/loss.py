"""``npu_cross_entropy_loss``: log_softmax and nll_loss fused, with its log_prob output.

``loss`` is torch's cross entropy of (N, C) logits against (N,) int64 targets with ``weight``,
``ignore_index`` and ``label_smoothing`` as ``torch.nn.functional.cross_entropy`` defines them;
shaped (N,) for ``reduction="none"`` and (1,) otherwise (torch_npu's shape, not a scalar).
``log_prob`` is ``log_softmax(input)`` in input's dtype. The z-loss outputs are disabled in the
real operator too ("当前暂不支持"): empty tensors, and asking for them raises.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import check, compute_dtype

OP = "npu_cross_entropy_loss"


def npu_cross_entropy_loss(input, target, weight=None, reduction="mean", ignore_index=-100,
                           label_smoothing=0.0, lse_square_scale_for_zloss=0.0,
                           return_zloss=False):
    """torch_npu.npu_cross_entropy_loss -> (loss, log_prob, zloss, lse_for_zloss)."""
    check(input.dim() == 2, OP, f"input must be (N, C), got {input.dim()}-d")
    check(target.dim() == 1 and target.size(0) == input.size(0), OP,
          f"target must be ({input.size(0)},), got {tuple(target.shape)}")
    check(reduction in ("mean", "sum", "none"), OP, f"reduction must be 'mean', 'sum' or 'none', "
          f"got {reduction!r}")
    check(0.0 <= label_smoothing < 1.0, OP, f"label_smoothing must be in [0, 1), got "
          f"{label_smoothing}")
    if return_zloss or lse_square_scale_for_zloss != 0.0:
        raise NotImplementedError(f"{OP}: z-loss (return_zloss, lse_square_scale_for_zloss) is "
                                  "not supported (nor enabled in torch_npu 2.14)")
    ct = compute_dtype(input.dtype)
    log_prob = torch.log_softmax(input.to(ct), dim=-1)
    loss = F.nll_loss(log_prob, target, weight=None if weight is None else weight.to(ct),
                      ignore_index=ignore_index, reduction=reduction) \
        if label_smoothing == 0.0 else \
        F.cross_entropy(input.to(ct), target, weight=None if weight is None else weight.to(ct),
                        ignore_index=ignore_index, reduction=reduction,
                        label_smoothing=label_smoothing)
    if reduction != "none":
        loss = loss.reshape(1)
    empty = input.new_empty(0)
    return loss.to(input.dtype), log_prob.to(input.dtype), empty, empty
