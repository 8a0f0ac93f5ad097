"""The rest of torch_npu 2.14's public ``npu_*`` operators, each with why npusim lacks it.

Each name exists on torch_npu so that code which imports it loads; calling it raises
``NoKernel`` (a NotImplementedError) naming the operator and the reason below.
"""
from __future__ import annotations

from ._common import unsupported

_QUANT = "a quantized (int8/int4/fp8) kernel whose rounding and packing only CANN defines"
_COMM = "it fuses an HCCL collective into a matmul kernel; use torch.distributed (hccl) and a " \
        "matmul"
_VISION = "a detection / vision kernel; none of the code bases npusim targets uses it"
_STATUS = "it reads the AI Core's floating-point overflow register, which a simulated NPU has " \
          "not got; check torch.isfinite on the gradients instead"
_INFER = "an inference-serving kernel (paged KV cache, MLA, sparse or indexer attention) with " \
         "layouts only CANN defines"
_LATER = "not implemented yet (no use in the code bases npusim targets)"

REASONS = {
    **{n: _QUANT for n in (
        "npu_anti_quant", "npu_convert_weight_to_int4pack", "npu_dynamic_block_quant",
        "npu_dynamic_quant", "npu_dynamic_quant_asymmetric", "npu_quant_matmul",
        "npu_quant_matmul_gelu", "npu_quant_matmul_reduce_sum", "npu_quant_scatter",
        "npu_quant_scatter_", "npu_quantize", "npu_rotate_quant", "npu_trans_quant_param",
        "npu_transpose_quant_batchmatmul", "npu_weight_quant_batchmatmul",
        "npu_kv_quant_sparse_flash_attention", "npu_quant_lightning_indexer")},
    **{n: _COMM for n in (
        "npu_all_gather_base_mm", "npu_mm_all_reduce_base", "npu_mm_reduce_scatter_base",
        "npu_alltoallv_gmm", "npu_gmm_alltoallv", "npu_alltoallv_quant_gmm",
        "npu_quant_gmm_alltoallv")},
    **{n: _VISION for n in (
        "npu_anchor_response_flags", "npu_batch_nms", "npu_bounding_box_decode",
        "npu_bounding_box_encode", "npu_ciou", "npu_diou", "npu_giou", "npu_iou",
        "npu_grid_assign_positive", "npu_nms_v4", "npu_nms_with_mask", "npu_ps_roi_pooling",
        "npu_roi_align", "npu_rotated_iou", "npu_rotated_overlaps", "npu_yolo_boxes_encode",
        "npu_deformable_conv2d", "npu_conv3d", "npu_random_choice_with_mask")},
    **{n: _STATUS for n in (
        "npu_alloc_float_status", "npu_get_float_status", "npu_clear_float_status")},
    **{n: _INFER for n in (
        "npu_advance_step_flashattn", "npu_block_sparse_attention", "npu_sparse_flash_attention",
        "npu_lightning_indexer", "npu_dense_lightning_indexer_grad_kl_loss",
        "npu_dense_lightning_indexer_softmax_lse", "npu_sparse_lightning_indexer_grad_kl_loss",
        "npu_mla_prolog", "npu_mla_prolog_v2", "npu_scatter_pa_kv_cache", "npu_ffn",
        "npu_prefetch", "npu_moe_update_expert", "npu_gather_sparse_index",
        "npu_grouped_matmul_finalize_routing")},
    **{n: _LATER for n in (
        "empty_with_swapped_memory", "npu_bert_apply_adam", "npu_fused_attention_score",
        "npu_fused_causal_conv1d", "npu_lstm", "npu_masked_causal_conv1d", "npu_mhc_post",
        "npu_mhc_post_backward", "npu_mhc_sinkhorn", "npu_moe_gating_top_k_backward",
        "npu_moe_gating_top_k_softmax_v2", "npu_multi_head_attention",
        "npu_recurrent_gated_delta_rule", "npu_recurrent_gated_delta_rule_functional",
        "npu_sim_exponential_")},
}

STUBS = {name: unsupported(name, why) for name, why in REASONS.items()}
