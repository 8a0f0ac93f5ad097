"""torch_npu's fused ``npu_*`` operators, computed with plain torch operators.

On Ascend each of these is one CANN kernel; on npusim each is its documented semantics (torch_npu
2.14's docstrings and meta registrations: signature, shapes, layouts, masks, returns) composed of
ordinary torch operators, so it runs on npu tensors (through the npu device, with torch's CPU
kernels) and on CPU tensors alike, and autograd differentiates the composition. Half inputs are
computed in float32 where the kernel accumulates in float32, so results agree with an unfused
float32 reference to float32 rounding and with a bf16 one to bf16 rounding, not bitwise with
Ascend's kernels.

==================================  =========================================================
module                              operators
==================================  =========================================================
attention                           npu_fusion_attention, npu_fusion_attention_grad
attention_infer                     npu_prompt_flash_attention, npu_incre_flash_attention,
                                    npu_fused_infer_attention_score
attention_v2                        npu_fusion_attention_v2, npu_fused_infer_attention_score_v2
ring                                npu_ring_attention_update
norm                                npu_rms_norm, npu_add_rms_norm, npu_gemma_rms_norm,
                                    npu_layer_norm_eval, npu_group_norm_silu,
                                    npu_group_norm_swish, npu_rms_norm_backward
rope                                npu_rotary_mul, npu_apply_rotary_pos_emb, npu_mrope
activation                          npu_swiglu, npu_geglu, npu_gelu_mul, npu_clipped_swiglu,
                                    npu_fast_gelu, fast_gelu, npu_silu, npu_mish,
                                    npu_swiglu_backward
moe                                 npu_grouped_matmul, npu_moe_token_permute,
                                    npu_moe_token_unpermute, npu_moe_gating_top_k_softmax,
                                    npu_moe_compute_expert_tokens, npu_moe_init_routing,
                                    npu_moe_finalize_routing,
                                    npu_moe_token_permute_with_routing_map,
                                    npu_moe_token_unpermute_with_routing_map,
                                    npu_grouped_matmul_add_
optim_ops                           npu_apply_adam_w, npu_apply_adam
misc                                npu_format_cast, npu_format_cast_, get_npu_format,
                                    npu_confusion_transpose, npu_transpose, npu_broadcast,
                                    npu_dtype_cast, npu_one_hot, npu_linear, npu_bmmV2,
                                    npu_slice, npu_max, npu_min, npu_scaled_masked_softmax,
                                    npu_dropout_with_add_softmax,
                                    npu_softmax_cross_entropy_with_logits, npu_sign_bits_pack,
                                    npu_sign_bits_unpack, scatter_update, scatter_update_,
                                    npu_scatter_nd_update, npu_scatter_nd_update_, npu_pad,
                                    npu_indexing, _npu_dropout, npu_transpose_batchmatmul
loss                                npu_cross_entropy_loss
unsupported                         the rest of the 119 public operators, each raising
                                    NotImplementedError with its reason: quantized kernels,
                                    matmul fused with HCCL collectives, detection / vision
                                    kernels, the float-status register, inference-serving
                                    kernels, and a list not implemented yet
==================================  =========================================================

``torch.ops.npu.<name>`` reaches the main ones as well, with torch_npu's schemas (ops.py).
"""
from __future__ import annotations

from .activation import (fast_gelu, npu_clipped_swiglu, npu_fast_gelu, npu_geglu, npu_gelu_mul,
                         npu_mish, npu_silu, npu_swiglu, npu_swiglu_backward)
from .attention import npu_fusion_attention, npu_fusion_attention_grad
from .attention_infer import (npu_fused_infer_attention_score, npu_incre_flash_attention,
                              npu_prompt_flash_attention)
from .attention_v2 import npu_fused_infer_attention_score_v2, npu_fusion_attention_v2
from .loss import npu_cross_entropy_loss
from .misc import (_npu_dropout, get_npu_format, npu_bmmV2, npu_broadcast, npu_confusion_transpose,
                   npu_dropout_with_add_softmax, npu_dtype_cast, npu_format_cast, npu_indexing,
                   npu_pad,
                   npu_one_hot, npu_scatter_nd_update, npu_scatter_nd_update_,
                   npu_sign_bits_pack, npu_sign_bits_unpack, scatter_update, scatter_update_,
                   npu_format_cast_, npu_linear, npu_max, npu_min, npu_scaled_masked_softmax,
                   npu_slice, npu_softmax_cross_entropy_with_logits, npu_transpose,
                   npu_transpose_batchmatmul)
from .moe import (npu_grouped_matmul, npu_grouped_matmul_add_, npu_moe_compute_expert_tokens,
                  npu_moe_finalize_routing, npu_moe_gating_top_k_softmax, npu_moe_init_routing,
                  npu_moe_token_permute, npu_moe_token_permute_with_routing_map,
                  npu_moe_token_unpermute, npu_moe_token_unpermute_with_routing_map)
from .norm import (npu_add_rms_norm, npu_gemma_rms_norm, npu_group_norm_silu,
                   npu_group_norm_swish, npu_layer_norm_eval, npu_rms_norm,
                   npu_rms_norm_backward)
from .optim_ops import npu_apply_adam, npu_apply_adam_w
from .ring import npu_ring_attention_update
from .rope import npu_apply_rotary_pos_emb, npu_mrope, npu_rotary_mul
from .unsupported import STUBS as _STUBS

IMPLEMENTED = (
    "npu_fusion_attention", "npu_fusion_attention_grad", "npu_prompt_flash_attention",
    "npu_incre_flash_attention", "npu_rms_norm", "npu_add_rms_norm", "npu_gemma_rms_norm",
    "npu_layer_norm_eval", "npu_rotary_mul", "npu_apply_rotary_pos_emb", "npu_swiglu",
    "npu_geglu", "npu_gelu_mul", "npu_clipped_swiglu", "npu_fast_gelu", "fast_gelu", "npu_silu",
    "npu_mish", "npu_grouped_matmul", "npu_moe_token_permute", "npu_moe_token_unpermute",
    "npu_moe_gating_top_k_softmax", "npu_moe_compute_expert_tokens", "npu_format_cast",
    "npu_format_cast_", "get_npu_format", "npu_confusion_transpose", "npu_transpose",
    "npu_broadcast", "npu_dtype_cast", "npu_linear", "npu_bmmV2", "npu_slice", "npu_max",
    "npu_min", "npu_scaled_masked_softmax", "npu_dropout_with_add_softmax",
    "npu_softmax_cross_entropy_with_logits", "npu_ring_attention_update", "npu_apply_adam_w",
    "npu_apply_adam", "npu_moe_init_routing", "npu_moe_finalize_routing", "npu_one_hot",
    "npu_fused_infer_attention_score", "npu_group_norm_silu", "npu_group_norm_swish",
    "npu_sign_bits_pack", "npu_sign_bits_unpack", "scatter_update", "scatter_update_",
    "npu_scatter_nd_update", "npu_scatter_nd_update_", "npu_cross_entropy_loss", "npu_pad",
    "npu_indexing", "_npu_dropout", "npu_mrope", "npu_transpose_batchmatmul",
    "npu_fusion_attention_v2", "npu_fused_infer_attention_score_v2", "npu_rms_norm_backward",
    "npu_swiglu_backward", "npu_moe_token_permute_with_routing_map",
    "npu_moe_token_unpermute_with_routing_map", "npu_grouped_matmul_add_")
UNSUPPORTED = tuple(sorted(_STUBS))

from . import ops as _ops

globals().update(_STUBS)
_ops.register()
__all__ = list(IMPLEMENTED) + list(UNSUPPORTED)
