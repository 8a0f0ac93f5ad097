"""torch_npu operators real code calls that npusim's fused package (torch_npu/fused) has not got.

torch_npu exports every operator of ``torch.ops.npu`` as ``torch_npu.<name>``, public or not;
the ten code bases of docs/coverage.md call the ones below beyond torch_npu's public list. Each
becomes a function raising NotSupportedError with its reason, so an import finds it and a call
says what is missing; ``install`` sets only the names torch_npu/fused does not define (its
implementations win).
"""
from __future__ import annotations

from .npu.utils import not_supported

_QUANT = "a quantized (int8 / MX) CANN kernel: npusim computes no quantized formats"
_COMM = "matmul fused with an HCCL collective in one CANN kernel"
_LATER = "not among npusim's fused operators yet (compose it from torch ops)"

GAPS = {
    "npu_rms_norm_backward": _LATER, "npu_swiglu_backward": _LATER,
    "npu_moe_token_permute_with_routing_map": _LATER,
    "npu_moe_token_permute_with_routing_map_grad": _LATER,
    "_npu_moe_token_unpermute_with_routing_map": _LATER,
    "npu_moe_token_unpermute_with_routing_map_grad": _LATER,
    "npu_grouped_matmul_add_": _LATER, "npu_fusion_attention_v2": _LATER,
    "npu_fused_infer_attention_score_v2": _LATER,
    "npu_dropout_gen_mask": "its mask is CANN's bit-packed dropout mask layout",
    "npu_dropout_do_mask": "its mask is CANN's bit-packed dropout mask layout",
    "npu_roi_alignbk": "a detection kernel (backward of npu_roi_align)",
    "npu_deformable_conv2dbk": "a detection kernel (backward of npu_deformable_conv2d)",
    "npu_ptiou": "a detection kernel (torch_npu.contrib.npu_ptiou computes it in torch)",
    "npu_hans_encode": "a CANN lossless-compression kernel",
    "npu_hans_decode": "a CANN lossless-compression kernel",
    "npu_add_quant_gmm_": _QUANT, "npu_add_quant_matmul_": _QUANT,
    "npu_dynamic_mx_quant": _QUANT, "npu_dynamic_block_mx_quant": _QUANT,
    "npu_dynamic_mx_quant_with_dual_axis": _QUANT, "npu_grouped_dynamic_mx_quant": _QUANT,
    "npu_all_gather_quant_mm": _COMM + "; " + _QUANT,
    "npu_quant_mm_reduce_scatter": _COMM + "; " + _QUANT,
}


def install(namespace: dict) -> list:
    """Put a raising function into ``namespace`` for each gap it lacks; returns their names."""
    added = []
    for name, why in GAPS.items():
        if name not in namespace:
            f = not_supported(name, why, "torch_npu")
            f.__module__ = "torch_npu"
            namespace[name] = f
            added.append(name)
    return added
