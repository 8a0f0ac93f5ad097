"""``npu_ring_attention_update``: merge two partial attentions by their softmax statistics.

Ring (context-parallel) attention computes attention block by block; two partial results over
disjoint key sets merge exactly, as torch_npu's docstring gives:
``m = max(m1, m2)``, ``s = s1 * exp(m1 - m) + s2 * exp(m2 - m)``,
``out = out1 * exp(m1 - m) * s1 / s + out2 * exp(m2 - m) * s2 / s``.
Layouts: ``"SBH"`` (out (S, B, H), statistics (B, N, S, 8)) and ``"TND"`` (out (T, N, D),
statistics as npu_fusion_attention returns them for TND: NTD storage with
``input_softmax_layout=""``, (T, N, 8) with ``"TND"``). The statistics returned keep their input
layout. Computed in float32; autograd comes from the composition.
"""
from __future__ import annotations

import torch

from ._common import check

OP = "npu_ring_attention_update"


def npu_ring_attention_update(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out,
                              cur_softmax_max, cur_softmax_sum, *, actual_seq_qlen=None,
                              input_layout="SBH", input_softmax_layout=""):
    """torch_npu.npu_ring_attention_update -> (attn_out, softmax_max, softmax_sum)."""
    check(input_layout in ("SBH", "TND"), OP, f"input_layout must be 'SBH' or 'TND', got "
          f"{input_layout!r}")
    check(input_softmax_layout in ("", "SBH", "TND"), OP, f"input_softmax_layout must be '', "
          f"'SBH' or 'TND', got {input_softmax_layout!r}")
    check(prev_attn_out.shape == cur_attn_out.shape, OP, "prev_attn_out and cur_attn_out must "
          "have one shape")
    check(prev_softmax_max.shape == prev_softmax_sum.shape == cur_softmax_max.shape ==
          cur_softmax_sum.shape, OP, "the four softmax statistics must have one shape")
    pm, ps = prev_softmax_max.float(), prev_softmax_sum.float()
    cm, cs = cur_softmax_max.float(), cur_softmax_sum.float()
    m = torch.maximum(pm, cm)
    ep, ec = torch.exp(pm - m), torch.exp(cm - m)
    s = ps * ep + cs * ec
    safe = torch.where(s > 0, s, torch.ones_like(s))
    fp, fc = (ep * ps / safe)[..., 0], (ec * cs / safe)[..., 0]
    if input_layout == "SBH":          # statistics (B, N, S, 8) -> factors (S, B, N, 1)
        sq, b, h = prev_attn_out.shape
        n = fp.size(1)
        fp, fc = fp.permute(2, 0, 1).unsqueeze(-1), fc.permute(2, 0, 1).unsqueeze(-1)
        shape = (sq, b, n, h // n)
    else:
        t, n, _ = prev_attn_out.shape
        if input_softmax_layout == "SBH":
            raise NotImplementedError(f"{OP}: input_softmax_layout='SBH' with input_layout='TND' "
                                      "is not supported on npusim")
        if input_softmax_layout == "":     # NTD storage under the shape (T, N, 8)
            fp, fc = fp.reshape(n, t).t(), fc.reshape(n, t).t()
        fp, fc = fp.unsqueeze(-1), fc.unsqueeze(-1)
        shape = (t, n, prev_attn_out.size(-1))
    out = prev_attn_out.float().reshape(shape) * fp + cur_attn_out.float().reshape(shape) * fc
    return out.reshape(prev_attn_out.shape).to(prev_attn_out.dtype), m, s
